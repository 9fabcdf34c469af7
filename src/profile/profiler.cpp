#include "profile/profiler.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstring>
#include <limits>
#include <random>
#include <unordered_set>
#include <vector>

#include <omp.h>

#include "core/error.h"
#include "core/statistics.h"
#include "graph/autodiff.h"
#include "graph/subgraph.h"
#include "graph/tensor_parallel.h"
#include "models/model.h"
#include "graph/interpreter.h"
#include "graph/saved_tensors.h"
#include "profile/synthetic_inputs.h"

namespace partrain::profile {

double pass_clock_seconds(bool cpu_time) {
  if (!cpu_time) return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  timespec now{};
  PARTRAIN_CHECK(clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now) == 0, "profiler: the process CPU clock is unreadable");
  return (static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec)) / omp_get_max_threads();
}

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

// `tensor` in `compute` (bf16 or f16) when `mixed` and it is f32 (the executor's working copies).
Tensor in_compute_dtype(const Tensor& tensor, Backend& backend, bool mixed, DType compute) {
  return mixed && tensor.dtype() == DType::F32 ? to_dtype(tensor, compute, backend) : tensor;
}

// Ones in `like`'s dtype on the backend, made on the host in that dtype: no f32 staging copy
// (bf16: 2 bytes more per element) beside the gradient during the measured pass, as the executor
// seeds its backward.
Tensor ones_like(const Tensor& like, Backend& backend) {
  return to_backend(Tensor::full(like.shape(), 1.0, like.dtype()), backend);
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

// Before a timed pass: Backend::flush_caches for a pass from memory, flush_private_caches for a
// warm one (its data in the shared cache, as in a stage that fits it, not in a core's own), then
// waits for the flush so the timing starts after it.
void flush_caches(Backend& backend, bool warm) {
  if (warm) backend.flush_private_caches();
  else backend.flush_caches();
  backend.synchronise();
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
          inputs[value.id] = in_compute_dtype(to_backend(synthetic_input(trimmed, value, batch, options.counted_label_shares, generator), backend),
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

    std::vector<double> forward_samples, backward_samples, warm_forward_samples, warm_backward_samples;
    double peak = 0;
    double produced = 0;
    // With flushed caches each timed repeat is two passes: one from flushed caches, then, for sets
    // that could run warm at all, the same again with its data still in the shared cache (the warm
    // figures; only the cores' own caches flushed).
    const bool time_warm = options.flush_caches && 2 * m.parameter_bytes <= options.warm_cache_bytes;
    const int timed_passes = options.repeats * (time_warm ? 2 : 1);
    for (int pass = 0; pass < options.warmup + timed_passes; ++pass) {
      const bool timed = pass >= options.warmup;
      const bool warm = time_warm && timed && (pass - options.warmup) % 2 == 1;
      const bool flushed = options.flush_caches && timed && !warm;
      backend.synchronise();
      const std::size_t before = allocator.current_bytes();
      allocator.reset_peak();
      TensorMap values = inputs;
      if (flushed || warm) flush_caches(backend, warm);
      const double forward_start = pass_clock_seconds(options.cpu_time);
      ExecutionOptions forward_options = execution;
      forward_options.keep = &kept;  // free what no backward reads as soon as the forward is done with it
      run_forward(trimmed, whole, values, backend, forward_options);
      backend.synchronise();
      const double forward_end = pass_clock_seconds(options.cpu_time);
      if (pass == 0)
        for (int v : kept)
          if (auto found = values.find(v); found != values.end()) produced += static_cast<double>(found->second.nbytes());
      release_unsaved(trimmed, values, kept);

      TensorMap grads = accumulators;
      for (int v : program.output_grads) grads[v] = ones_like(values.at(v), backend);
      if (flushed || warm) flush_caches(backend, warm);
      backend.synchronise();
      const double backward_start = pass_clock_seconds(options.cpu_time);
      run_backward(trimmed, program, values, grads, backend, execution);
      backend.synchronise();
      const double backward_end = pass_clock_seconds(options.cpu_time);
      peak = std::max(peak, static_cast<double>(allocator.peak_bytes()) - static_cast<double>(before));

      if (timed) {
        (warm ? warm_forward_samples : forward_samples).push_back(forward_end - forward_start);
        (warm ? warm_backward_samples : backward_samples).push_back(backward_end - backward_start);
      }
    }
    m.forward_seconds = median(forward_samples);
    m.backward_seconds = median(backward_samples);
    // (At most the flushed time: a cache cannot make a pass slower; a larger reading is noise.)
    if (!options.flush_caches) {
      m.warm_forward_seconds = m.forward_seconds;
      m.warm_backward_seconds = m.backward_seconds;
    } else if (time_warm) {
      m.warm_forward_seconds = std::min(median(warm_forward_samples), m.forward_seconds);
      m.warm_backward_seconds = std::min(median(warm_backward_samples), m.backward_seconds);
    }
    m.activation_bytes = produced;
    m.peak_bytes = peak;
  }
  return m;
}

}  // namespace partrain::profile
