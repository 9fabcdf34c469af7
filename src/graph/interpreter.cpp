#include "graph/interpreter.h"

#include <array>
#include <chrono>
#include <functional>
#include <unordered_set>

#include "graph/op_profile.h"
#include "graph/op_schema.h"
#include "graph/saved_tensors.h"

namespace partrain {

namespace {
Tensor lookup(const Graph& graph, const TensorMap& values, int id, const Task& task, Backend& backend) {
  auto it = values.find(id);
  if (it != values.end()) return it->second;
  // Constants (position ids) live on the host in the graph; small, so copied per use on a GPU.
  if (graph.value(id).kind == ValueKind::Const) return to_backend(graph.constant_data(id), backend);
  PARTRAIN_FAIL("task '" << task.name << "': input '" << graph.value(id).name << "' has no tensor");
}

// Runs `call` (one kernel dispatch); with an active op profile, times it between two backend
// synchronisations so that asynchronous (GPU) kernels are counted in full.
template <typename Call>
void dispatch(OpType op, OpProfile::Direction direction, Backend& backend, Call call) {
  OpProfile* profile = active_op_profile();
  if (profile == nullptr) {
    call();
    return;
  }
  backend.synchronise();
  const auto start = std::chrono::steady_clock::now();
  call();
  backend.synchronise();
  profile->record(op, direction, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

KernelContext context_for(const Task& task, Backend& backend, const ExecutionOptions& options) {
  RandomContext random = options.random;
  random.stream = name_stream(task.name);
  return KernelContext{task.attributes, backend, options.training, random, options.tensor_parallel};
}
}  // namespace

namespace {
void forward_task(const Graph& graph, const Task& task, TensorMap& values, Backend& backend,
                  const ExecutionOptions& options) {
  std::vector<Tensor> inputs;
  std::vector<TensorType> input_types;
  for (int input : task.inputs) {
    inputs.push_back(lookup(graph, values, input, task, backend));
    input_types.push_back({inputs.back().shape(), inputs.back().dtype()});
  }
  std::vector<Tensor> outputs;
  try {
    for (const TensorType& type : infer_output_types(task.op, task.attributes, input_types))
      outputs.push_back(backend.empty(type.shape, type.dtype));
    dispatch(task.op, OpProfile::Direction::Forward, backend,
             [&] { backend.forward(task.op, context_for(task, backend, options), inputs, outputs); });
  } catch (const Error& error) {
    PARTRAIN_FAIL("task '" << task.name << "' (" << op_name(task.op) << ") forward: " << error.message());
  }
  for (std::size_t k = 0; k < outputs.size(); ++k) values[task.outputs[k]] = outputs[k];
}

// One backward pass in steps: run(i) computes step i's input gradients, finish(i) files them
// (accumulating into the gradients of values read twice) — apart, so that an all-reduce the step
// started can complete in between.
class BackwardPass {
 public:
  BackwardPass(const Graph& graph, const BackwardProgram& program, const TensorMap& values, TensorMap& grads,
               Backend& backend, const ExecutionOptions& options)
      : graph_(graph), program_(program), values_(values), grads_(grads), backend_(backend), options_(options),
        parameters_(program.parameter_grads.begin(), program.parameter_grads.end()),
        kept_(program.input_grads.begin(), program.input_grads.end()) {
    kept_.insert(program.kept_output_grads.begin(), program.kept_output_grads.end());
    for (int v : program.output_grads)
      PARTRAIN_CHECK(grads.count(v), "backward: no gradient given for output '" << graph.value(v).name << "'");
    // The step after which each parameter's gradient of this pass is complete.
    for (std::size_t i = 0; i < program.steps.size(); ++i) {
      const BackwardStep& step = program.steps[i];
      const Task& task = graph.task(step.task);
      for (std::size_t k = 0; k < task.inputs.size(); ++k)
        if (step.input_grad_needed[k] && parameters_.count(task.inputs[k])) last_step_[task.inputs[k]] = i;
    }
  }
  std::size_t size() const { return program_.steps.size(); }

  void run(std::size_t index) {
    const BackwardStep& step = program_.steps[index];
    const Task& task = graph_.task(step.task);
    std::vector<Tensor> inputs, outputs, output_grads;
    // The values whose data the op's backward does not read (OpSchema::saved_inputs / saved_outputs)
    // go as their shapes, as after release_unsaved, also where a stage keeps them for another task's
    // backward: a backend that widens 16-bit operands (the CPU in bf16) would otherwise copy them to
    // fp32 for nothing (GPT's LM head: its 8000-wide logits, kept for the loss, 7.8 MiB per 256 tokens).
    const OpSchema& schema = op_schema(task.op);
    const auto as_read = [&](Tensor tensor, int value, bool read) {
      return read || !is_microbatch_value(graph_, value) ? tensor : tensor.shape_only();
    };
    for (std::size_t k = 0; k < task.inputs.size(); ++k)
      inputs.push_back(as_read(lookup(graph_, values_, task.inputs[k], task, backend_), task.inputs[k],
                               schema.input_is_saved(k)));
    for (std::size_t k = 0; k < task.outputs.size(); ++k) {
      const int output = task.outputs[k];
      outputs.push_back(as_read(lookup(graph_, values_, output, task, backend_), output, schema.output_is_saved(k)));
      auto it = grads_.find(output);
      output_grads.push_back(it != grads_.end() ? it->second : backend_.zeros(outputs.back().shape(), outputs.back().dtype()));
    }
    input_grads_.clear();
    for (std::size_t i = 0; i < task.inputs.size(); ++i)
      input_grads_.push_back(step.input_grad_needed[i] ? backend_.empty(inputs[i].shape(), inputs[i].dtype()) : Tensor());
    try {
      dispatch(task.op, OpProfile::Direction::Backward, backend_, [&] {
        backend_.backward(task.op, context_for(task, backend_, options_), inputs, outputs, output_grads, input_grads_);
      });
    } catch (const Error& error) {
      PARTRAIN_FAIL("task '" << task.name << "' (" << op_name(task.op) << ") backward: " << error.message());
    }
  }

  void finish(std::size_t index) {
    const Task& task = graph_.task(program_.steps[index].task);
    // The outputs' gradients are complete and now used: free them unless the caller wants them.
    for (int output : task.outputs)
      if (!kept_.count(output)) grads_.erase(output);
    for (std::size_t i = 0; i < task.inputs.size(); ++i) {
      if (!input_grads_[i].defined()) continue;
      const int input = task.inputs[i];
      TensorMap& target = parameters_.count(input) ? fresh_parameter_grads_ : grads_;
      auto [it, inserted] = target.emplace(input, input_grads_[i]);
      if (!inserted) backend_.accumulate(it->second, input_grads_[i]);
    }
    // Parameters whose last contribution this step was: hand their gradient over now.
    for (std::size_t i = 0; i < task.inputs.size(); ++i) {
      const int input = task.inputs[i];
      auto last = last_step_.find(input);
      if (last != last_step_.end() && last->second == index) hand_over(input);
    }
  }

  // Parameter gradients computed in this pass and not handed over yet, added to what the caller had.
  void done() {
    std::vector<int> remaining;
    for (const auto& [id, gradient] : fresh_parameter_grads_) remaining.push_back(id);
    for (int id : remaining) hand_over(id);
  }

 private:
  const Graph& graph_;
  const BackwardProgram& program_;
  const TensorMap& values_;
  TensorMap& grads_;
  Backend& backend_;
  const ExecutionOptions& options_;
  const std::unordered_set<int> parameters_;
  std::unordered_set<int> kept_;  // gradients the caller reads after the pass: not freed
  TensorMap fresh_parameter_grads_;
  std::unordered_map<int, std::size_t> last_step_;  // parameter -> last step producing its gradient
  std::vector<Tensor> input_grads_;  // of the step run last

  // Adds this pass's gradient of `parameter` to the caller's and reports it complete.
  void hand_over(int parameter) {
    auto fresh = fresh_parameter_grads_.find(parameter);
    if (fresh == fresh_parameter_grads_.end()) return;  // already handed over
    auto [it, inserted] = grads_.emplace(parameter, fresh->second);
    if (!inserted) backend_.accumulate(it->second, fresh->second);
    fresh_parameter_grads_.erase(fresh);
    if (options_.on_parameter_gradient) options_.on_parameter_gradient(parameter);
  }
};

// The group one sub-microbatch's tasks see under sub-pipelined TMP: the deferrable all-reduces
// (Megatron's f and g) are started and left pending, to be completed before the next task of the
// same sub-microbatch.
class OverlappingGroup final : public TensorParallelGroup {
 public:
  explicit OverlappingGroup(TensorParallelGroup& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  void all_reduce(const Tensor& tensor, Reduction reduction) override { inner_.all_reduce(tensor, reduction); }
  // Sequence parallelism's collectives block (their results are read by the task that calls them).
  void all_gather(const Tensor& input, const Tensor& output) override { inner_.all_gather(input, output); }
  void reduce_scatter(const Tensor& input, const Tensor& output) override { inner_.reduce_scatter(input, output); }
  void all_reduce_deferrable(const Tensor& tensor) override {
    complete();
    pending_ = inner_.start_all_reduce(tensor);
  }
  bool orders_device_work() const override { return inner_.orders_device_work(); }
  bool pending() const { return static_cast<bool>(pending_); }
  void complete() {
    if (!pending_) return;
    std::function<void()> finish = std::move(pending_);
    pending_ = nullptr;
    finish();
  }

 private:
  TensorParallelGroup& inner_;
  std::function<void()> pending_;
};

// Runs two sub-microbatches' step lists alternately: each runs until one of its steps leaves an
// all-reduce pending, then the other runs while it is in flight; `step(h, i)` runs step i of h,
// `after(h, i)` runs once the all-reduces step i started have completed.
template <typename Step, typename After>
void alternate(std::size_t begin, std::size_t steps, std::array<OverlappingGroup, 2>& groups, Step step, After after) {
  std::array<std::size_t, 2> next{begin, begin};
  std::array<bool, 2> waiting{false, false};
  while (next[0] < steps || next[1] < steps || waiting[0] || waiting[1]) {
    for (int h = 0; h < 2; ++h) {
      if (waiting[h]) {
        groups[h].complete();
        after(h, next[h] - 1);
        waiting[h] = false;
      }
      while (next[h] < steps) {
        step(h, next[h]);
        ++next[h];
        if (groups[h].pending()) {
          waiting[h] = true;
          break;
        }
        after(h, next[h] - 1);
      }
    }
  }
}

std::array<OverlappingGroup, 2> overlapping_groups(const std::array<ExecutionOptions, 2>& options) {
  PARTRAIN_CHECK(options[0].tensor_parallel != nullptr && options[0].tensor_parallel == options[1].tensor_parallel,
                 "sub-pipelined TMP needs the tensor-parallel group of both sub-microbatches");
  return {OverlappingGroup(*options[0].tensor_parallel), OverlappingGroup(*options[1].tensor_parallel)};
}
}  // namespace

void run_forward(const Graph& graph, const Subgraph& subgraph, TensorMap& values, Backend& backend,
                 const ExecutionOptions& options) {
  if (options.keep == nullptr) {
    for (int t : subgraph.tasks) forward_task(graph, graph.task(t), values, backend, options);
    return;
  }
  // The position of the last task reading each value; a value no task reads dies where it is made.
  std::unordered_map<int, std::size_t> last_reader;
  for (std::size_t i = 0; i < subgraph.tasks.size(); ++i)
    for (int input : graph.task(subgraph.tasks[i]).inputs) last_reader[input] = i;
  auto free_if_dead = [&](int value, std::size_t position) {
    if (options.keep->count(value) || !is_microbatch_value(graph, value)) return;
    auto reader = last_reader.find(value);
    if (reader != last_reader.end() && reader->second > position) return;
    auto found = values.find(value);
    if (found != values.end() && found->second.defined()) found->second = found->second.shape_only();
  };
  for (std::size_t i = 0; i < subgraph.tasks.size(); ++i) {
    const Task& task = graph.task(subgraph.tasks[i]);
    forward_task(graph, task, values, backend, options);
    for (int input : task.inputs) free_if_dead(input, i);
    for (int output : task.outputs) free_if_dead(output, i);
  }
}

void run_backward(const Graph& graph, const BackwardProgram& program, const TensorMap& values, TensorMap& grads,
                  Backend& backend, const ExecutionOptions& options) {
  BackwardPass pass(graph, program, values, grads, backend, options);
  for (std::size_t i = 0; i < pass.size(); ++i) {
    pass.run(i);
    pass.finish(i);
  }
  pass.done();
}

void run_forward_overlapped(const Graph& graph, const Subgraph& subgraph, std::array<TensorMap*, 2> values,
                            Backend& backend, const std::array<ExecutionOptions, 2>& options) {
  std::array<OverlappingGroup, 2> groups = overlapping_groups(options);
  std::array<ExecutionOptions, 2> own = options;
  for (int h = 0; h < 2; ++h) own[h].tensor_parallel = &groups[h];
  alternate(
      0, subgraph.tasks.size(), groups,
      [&](int h, std::size_t i) { forward_task(graph, graph.task(subgraph.tasks[i]), *values[h], backend, own[h]); },
      [](int, std::size_t) {});
}

namespace {
// The values a recomputed segment produced, made shape-only: its backward has run, and no earlier
// task's backward reads what a later task produced.
void release_segment(const Graph& graph, const RecomputedSegment& segment, TensorMap& values) {
  for (int task : segment.forward.tasks)
    for (int output : graph.task(task).outputs)
      if (auto found = values.find(output); found != values.end() && found->second.defined())
        found->second = found->second.shape_only();
}

// Calls run_range(begin, end) over the program's steps in order, in ranges that start and end at
// segment boundaries, with recompute(segment) before and release(segment) after each segment's own.
template <typename RunRange, typename Recompute, typename Release>
void over_segments(std::size_t steps, std::span<const RecomputedSegment> segments, RunRange run_range,
                   Recompute recompute, Release release) {
  std::size_t next = 0;
  for (const RecomputedSegment& segment : segments) {
    PARTRAIN_CHECK(segment.first_step >= next && segment.first_step <= segment.end_step && segment.end_step <= steps,
                   "backward with recomputation: segment steps [" << segment.first_step << ", " << segment.end_step
                                                                   << ") out of order (program of " << steps << ")");
    run_range(next, segment.first_step);
    recompute(segment);
    run_range(segment.first_step, segment.end_step);
    release(segment);
    next = segment.end_step;
  }
  run_range(next, steps);
}
}  // namespace

void run_backward_recomputing(const Graph& graph, const BackwardProgram& program,
                              std::span<const RecomputedSegment> segments, TensorMap& values, TensorMap& grads,
                              Backend& backend, const ExecutionOptions& options) {
  BackwardPass pass(graph, program, values, grads, backend, options);
  ExecutionOptions forward_options = options;
  forward_options.on_parameter_gradient = nullptr;
  over_segments(
      pass.size(), segments,
      [&](std::size_t begin, std::size_t end) {
        for (std::size_t i = begin; i < end; ++i) {
          pass.run(i);
          pass.finish(i);
        }
      },
      [&](const RecomputedSegment& segment) {
        forward_options.keep = &segment.keep;
        run_forward(graph, segment.forward, values, backend, forward_options);
      },
      [&](const RecomputedSegment& segment) { release_segment(graph, segment, values); });
  pass.done();
}

void run_backward_overlapped(const Graph& graph, const BackwardProgram& program,
                             std::span<const RecomputedSegment> segments, std::array<TensorMap*, 2> values,
                             std::array<TensorMap*, 2> grads, Backend& backend,
                             const std::array<ExecutionOptions, 2>& options) {
  std::array<OverlappingGroup, 2> groups = overlapping_groups(options);
  std::array<ExecutionOptions, 2> own = options;
  for (int h = 0; h < 2; ++h) own[h].tensor_parallel = &groups[h];
  BackwardPass first(graph, program, *values[0], *grads[0], backend, own[0]);
  BackwardPass second(graph, program, *values[1], *grads[1], backend, own[1]);
  std::array<BackwardPass*, 2> passes{&first, &second};
  std::array<ExecutionOptions, 2> forward_options = options;
  for (ExecutionOptions& option : forward_options) option.on_parameter_gradient = nullptr;
  over_segments(
      program.steps.size(), segments,
      [&](std::size_t begin, std::size_t end) {
        alternate(
            begin, end, groups, [&](int h, std::size_t i) { passes[h]->run(i); },
            [&](int h, std::size_t i) { passes[h]->finish(i); });
      },
      [&](const RecomputedSegment& segment) {
        run_forward_overlapped(graph, segment.forward, values, backend, forward_options);
        for (TensorMap* half : values) release_unsaved(graph, *half, segment.keep);
      },
      [&](const RecomputedSegment& segment) {
        for (TensorMap* half : values) release_segment(graph, segment, *half);
      });
  first.done();
  second.done();
}

}  // namespace partrain
