#include "profile/profiler.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <random>
#include <unordered_set>
#include <vector>

#include "core/error.h"
#include "core/statistics.h"
#include "graph/autodiff.h"
#include "graph/subgraph.h"
#include "graph/tensor_parallel.h"
#include "models/model.h"
#include "graph/interpreter.h"
#include "graph/saved_tensors.h"

namespace partrain::profile {

namespace {

// Rank 0 of a tensor-parallel group of `size` ranks that exchanges nothing (profiling only).
class StandInTensorParallelGroup final : public TensorParallelGroup {
 public:
  explicit StandInTensorParallelGroup(int size) : size_(size) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  void all_reduce(const Tensor&, Reduction) override {}
  // Host tensors get every rank's part equal to this one's (reduce-scatter: this rank's block, not
  // summed, like all_reduce), so that what follows computes on the values it would see; device
  // tensors are left as they are (their kernels' time does not depend on the values).
  void all_gather(const Tensor& input, const Tensor& output) override {
    if (!input.device().is_cpu() || !output.device().is_cpu()) return;
    for (int r = 0; r < size_; ++r)
      std::memcpy(static_cast<char*>(output.raw_data()) + static_cast<std::size_t>(r) * input.nbytes(), input.raw_data(),
                  input.nbytes());
  }
  void reduce_scatter(const Tensor& input, const Tensor& output) override {
    if (input.device().is_cpu() && output.device().is_cpu()) std::memcpy(output.raw_data(), input.raw_data(), output.nbytes());
  }

 private:
  int size_;
};

constexpr std::int64_t kUnbounded = std::numeric_limits<std::int64_t>::max();

bool is_shape_op(OpType op) {
  return op == OpType::Reshape || op == OpType::Permute || op == OpType::Slice || op == OpType::Concat ||
         op == OpType::Split;
}

// Calls visit(task, k) for every task that reads `value` as its input k, following shape ops (which
// copy elements) to the tasks that read their outputs; the shape ops themselves are not visited.
template <typename Visit>
void visit_readers(const Graph& graph, int value, Visit&& visit, int depth = 0) {
  if (depth > 64) return;
  for (int consumer : graph.value(value).consumers) {
    const Task& task = graph.task(consumer);
    for (std::size_t k = 0; k < task.inputs.size(); ++k) {
      if (task.inputs[k] != value) continue;
      if (is_shape_op(task.op))
        for (int output : task.outputs) visit_readers(graph, output, visit, depth + 1);
      else
        visit(task, k);
    }
  }
}

// The number of valid values of an integer value: the smallest range its readers accept (Gather
// indices: table rows; SoftmaxCrossEntropy labels: classes). kUnbounded when no reader bounds it.
std::int64_t index_limit(const Graph& graph, int value) {
  std::int64_t limit = kUnbounded;
  visit_readers(graph, value, [&](const Task& task, std::size_t k) {
    if (task.op == OpType::Gather && k == 1) limit = std::min(limit, graph.value(task.inputs[0]).type.shape.at(0));
    if (task.op == OpType::SoftmaxCrossEntropy && k == 1) {
      const Shape& logits = graph.value(task.inputs[0]).type.shape;
      if (!logits.empty() && logits.back() > 0) limit = std::min(limit, logits.back());
    }
  });
  return limit;
}

// The loss task (SoftmaxCrossEntropy or VocabParallelCrossEntropy) that reads `value` as its labels;
// nullptr when none does.
const Task* label_loss(const Graph& graph, int value) {
  const Task* loss = nullptr;
  visit_readers(graph, value, [&](const Task& task, std::size_t k) {
    if (!loss && k == 1 && (task.op == OpType::SoftmaxCrossEntropy || task.op == OpType::VocabParallelCrossEntropy))
      loss = &task;
  });
  return loss;
}

// True when the value is an additive attention mask (Attention input 3, Softmax input 1): zeros.
bool is_attention_mask(const Graph& graph, int value) {
  for (int consumer : graph.value(value).consumers) {
    const Task& task = graph.task(consumer);
    if (task.op == OpType::Attention && task.inputs.size() > 3 && task.inputs[3] == value) return true;
    if (task.op == OpType::Softmax && task.inputs.size() > 1 && task.inputs[1] == value) return true;
  }
  return false;
}

// A host tensor of plausible data for an Input or Label value of the standalone graph. Labels of a
// loss named in options.counted_label_shares are ignore_index at the share of positions real batches
// do not count (BERT's MLM counts only the masked tokens, and the loss kernels skip the rest).
Tensor synthetic_input(const Graph& graph, const Value& value, std::int64_t batch, const ProfilerOptions& options,
                       std::mt19937_64& generator) {
  const Shape shape = with_batch(value.type.shape, batch);
  const std::int64_t count = numel(shape);
  switch (value.type.dtype) {
    case DType::I32:
    case DType::I64: {
      const std::int64_t limit = index_limit(graph, value.id);
      std::vector<std::int64_t> data(static_cast<std::size_t>(count), 0);
      if (limit != kUnbounded && limit > 0) {
        std::uniform_int_distribution<std::int64_t> distribution(0, limit - 1);
        for (auto& x : data) x = distribution(generator);
      }
      if (const Task* loss = label_loss(graph, value.id)) {
        const auto found = options.counted_label_shares.find(loss->name);
        if (found != options.counted_label_shares.end() && found->second < 1) {
          const std::int64_t ignore_index = loss->attributes.get_int("ignore_index", -100);
          std::uniform_real_distribution<double> uniform(0.0, 1.0);
          for (auto& x : data)
            if (uniform(generator) >= found->second) x = ignore_index;
        }
      }
      if (value.type.dtype == DType::I64) return Tensor::from_vector<std::int64_t>(shape, data);
      return Tensor::from_vector<std::int32_t>(shape, std::vector<std::int32_t>(data.begin(), data.end()));
    }
    case DType::F32:
    case DType::BF16:
    case DType::F16: {
      std::vector<float> data(static_cast<std::size_t>(count), 0.0f);
      if (!is_attention_mask(graph, value.id)) {
        std::normal_distribution<float> distribution(0.0f, 1.0f);
        for (auto& x : data) x = distribution(generator);
      }
      if (value.type.dtype == DType::F32) return Tensor::from_vector<float>(shape, data);
      if (value.type.dtype == DType::F16)
        return Tensor::from_vector<Float16>(shape, std::vector<Float16>(data.begin(), data.end()));
      return Tensor::from_vector<BFloat16>(shape, std::vector<BFloat16>(data.begin(), data.end()));
    }
  }
  PARTRAIN_FAIL("profiler: input '" << value.name << "' has an unsupported dtype " << dtype_name(value.type.dtype));
}

// `tensor` in `compute` (bf16 or f16) when `mixed` and it is f32 (the executor's working copies).
Tensor in_compute_dtype(const Tensor& tensor, Backend& backend, bool mixed, DType compute) {
  return mixed && tensor.dtype() == DType::F32 ? to_dtype(tensor, compute, backend) : tensor;
}

Tensor ones_like(const Tensor& like, Backend& backend) {
  std::vector<float> data(static_cast<std::size_t>(like.numel()), 1.0f);
  const Tensor host = Tensor::from_vector<float>(like.shape(), data);
  return to_dtype(to_backend(host, backend), like.dtype(), backend);
}

// Bytes of the Activation values among `values` (original graph) at `batch` samples.
double activation_bytes_of(const Graph& graph, const std::vector<int>& values, std::int64_t batch) {
  double bytes = 0;
  for (int v : values) {
    const Value& value = graph.value(v);
    if (value.kind == ValueKind::Activation) bytes += static_cast<double>(value.type.bytes(batch));
  }
  return bytes;
}

}  // namespace

Measurement measure_task_set(const Graph& graph, std::span<const int> tasks, std::int64_t batch, Backend& backend,
                             const ProfilerOptions& options) {
  PARTRAIN_CHECK(batch > 0, "profiler: batch must be positive, not " << batch);
  PARTRAIN_CHECK(options.warmup >= 0, "profiler: warmup must be >= 0, not " << options.warmup);
  PARTRAIN_CHECK(options.repeats >= 1, "profiler: repeats must be >= 1, not " << options.repeats);

  const Subgraph original = extract_subgraph(graph, tasks);
  Measurement m;
  // Figures of the original graph: parameters read, activations crossing the set's boundary.
  for (int p : original.parameters(graph)) m.parameter_bytes += static_cast<double>(graph.value(p).type.bytes(1));
  m.boundary_input_bytes = activation_bytes_of(graph, original.boundary_activations(graph), batch);
  {
    const std::unordered_set<int> members(original.tasks.begin(), original.tasks.end());
    std::vector<int> sent;
    for (int v : original.outputs) {
      const auto& consumers = graph.value(v).consumers;
      if (std::any_of(consumers.begin(), consumers.end(), [&](int c) { return !members.count(c); })) sent.push_back(v);
    }
    m.boundary_output_bytes = activation_bytes_of(graph, sent, batch);
  }

  CachingAllocator& allocator = backend.allocator();
  // A tensor-parallel graph's communication tasks run against a stand-in group of the graph's
  // degree whose all-reduces do nothing: the measurement is the rank's computation; the cost model
  // prices the all-reduces from the measured communication profile.
  const int degree = tensor_parallel_degree(graph);
  StandInTensorParallelGroup stand_in(degree);
  ExecutionOptions execution;
  execution.tensor_parallel = degree > 1 ? &stand_in : nullptr;
  {
    // The trimmed model and its tensors (all released at the end of this scope).
    const Graph trimmed = standalone_graph(graph, original);
    const Subgraph whole = whole_graph(trimmed);
    // The stage's backward also computes the gradients of what the set receives from a task set
    // with parameters upstream (the input gradient a layer sends back, the loss's gradient of the
    // logits): the trimmed graph's inputs that stand for those get one here as well.
    const BackwardProgram program = standalone_backward(graph, original, trimmed);
    // What the executor keeps from the forward to the backward: the saved tensors (outputs it does
    // not read go once sent). The rest is freed right after the forward, as the executor does.
    std::unordered_set<int> kept;
    for (int v : saved_for_backward(trimmed, program)) kept.insert(v);

    TensorMap inputs;
    std::mt19937_64 generator(options.seed ^ 0x5DEECE66Dull);
    for (const Value& value : trimmed.values()) {
      switch (value.kind) {
        case ValueKind::Input:
        case ValueKind::Label:
          inputs[value.id] = in_compute_dtype(to_backend(synthetic_input(trimmed, value, batch, options, generator), backend),
                                              backend, options.mixed_precision, options.compute_dtype);
          break;
        case ValueKind::Const: inputs[value.id] = to_backend(trimmed.constant_data(value.id), backend); break;
        default: break;
      }
    }
    for (auto& [id, tensor] : initialize_parameters(trimmed, options.seed))
      inputs[id] = in_compute_dtype(to_backend(tensor, backend), backend,
                                    options.mixed_precision && trimmed.value(id).kind == ValueKind::Param,
                                    options.compute_dtype);

    // Gradient accumulators of the parameters exist before the measured pass (model state).
    TensorMap accumulators;
    for (int p : program.parameter_grads) {
      const Value& value = trimmed.value(p);
      accumulators[p] = backend.zeros(value.type.shape, value.type.dtype);
    }

    using Clock = std::chrono::steady_clock;
    std::vector<double> forward_samples, backward_samples;
    double peak = 0;
    double produced = 0;
    for (int pass = 0; pass < options.warmup + options.repeats; ++pass) {
      const bool timed = pass >= options.warmup;
      backend.synchronise();
      const std::size_t before = allocator.current_bytes();
      allocator.reset_peak();
      TensorMap values = inputs;
      const auto forward_start = Clock::now();
      ExecutionOptions forward_options = execution;
      forward_options.keep = &kept;  // free what no backward reads as soon as the forward is done with it
      run_forward(trimmed, whole, values, backend, forward_options);
      backend.synchronise();
      const auto forward_end = Clock::now();
      if (pass == 0)
        for (int v : kept)
          if (auto found = values.find(v); found != values.end()) produced += static_cast<double>(found->second.nbytes());
      release_unsaved(trimmed, values, kept);

      TensorMap grads = accumulators;
      for (int v : program.output_grads) grads[v] = ones_like(values.at(v), backend);
      backend.synchronise();
      const auto backward_start = Clock::now();
      run_backward(trimmed, program, values, grads, backend, execution);
      backend.synchronise();
      const auto backward_end = Clock::now();
      peak = std::max(peak, static_cast<double>(allocator.peak_bytes()) - static_cast<double>(before));

      if (timed) {
        forward_samples.push_back(std::chrono::duration<double>(forward_end - forward_start).count());
        backward_samples.push_back(std::chrono::duration<double>(backward_end - backward_start).count());
      }
    }
    m.forward_seconds = median(forward_samples);
    m.backward_seconds = median(backward_samples);
    m.activation_bytes = produced;
    m.peak_bytes = peak;
  }
  return m;
}

}  // namespace partrain::profile
