// Kernel-level seconds of the analytic cost model (partition/common/kernel_timing.h).
#include "partition/common/kernel_timing.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "core/shape.h"

namespace partrain::partition {

namespace {

// cuBLAS's large output tiles on Ampere and Hopper (the guide's §2.3): the larger reuse operands
// best; the model takes whichever quantizes best for the shape.
constexpr std::pair<double, double> kTiles[] = {{256, 128}, {128, 256}, {128, 128}};

double shape_elements(const Shape& shape, std::int64_t batch) {
  return static_cast<double>(numel(has_batch_dim(shape) ? with_batch(shape, batch) : shape));
}

Shape concrete(const Shape& shape, std::int64_t batch) { return has_batch_dim(shape) ? with_batch(shape, batch) : shape; }

// Bytes of value `id` at `batch`: f32 activations at `activation_bytes` per element (bf16 plans
// keep them in 2 bytes), everything else in its own dtype.
double value_bytes_at(const Graph& graph, int id, std::int64_t batch, double activation_bytes) {
  const Value& value = graph.value(id);
  const double element = value.kind == ValueKind::Activation && value.type.dtype == DType::F32
                             ? activation_bytes
                             : static_cast<double>(dtype_size(value.type.dtype));
  return shape_elements(value.type.shape, batch) * element;
}

bool is_communication(OpType op) {
  switch (op) {
    case OpType::TensorParallelCopy:
    case OpType::TensorParallelAllReduce:
    case OpType::SequenceParallelAllGather:
    case OpType::SequenceParallelReduceScatter:
    case OpType::SequenceParallelScatter:
    case OpType::SequenceParallelGather: return true;
    default: return false;
  }
}

std::pair<double, double> gemm_task_seconds(const Graph& graph, const Task& task, std::int64_t batch,
                                            const KernelModel& kernels, double element) {
  const Shape x = concrete(graph.value(task.inputs[0]).type.shape, batch);
  const Shape w = concrete(graph.value(task.inputs[1]).type.shape, batch);
  const bool trans_b = task.attributes.get_int("trans_b", 1) == 1;
  const double k = static_cast<double>(x.back());
  const double n = static_cast<double>(trans_b ? w[0] : w[1]);
  const double m = static_cast<double>(numel(x)) / k;
  const double forward = gemm_seconds(kernels, m, n, k, 1, element);
  // dX = dY W (m × k over n); dW = dYᵀ X (n × k over m), accumulated into its f32 gradient; the
  // bias gradient is a reduction over dY.
  double backward = gemm_seconds(kernels, m, k, n, 1, element) + gemm_seconds(kernels, n, k, m, 1, element, 2 * 4 * n * k);
  if (task.inputs.size() > 2) backward += memory_seconds(kernels, m * n * element);
  return {forward, backward};
}

std::pair<double, double> matmul_task_seconds(const Graph& graph, const Task& task, std::int64_t batch,
                                              const KernelModel& kernels, double element) {
  const Shape a = concrete(graph.value(task.inputs[0]).type.shape, batch);
  const Shape b = concrete(graph.value(task.inputs[1]).type.shape, batch);
  const bool trans_a = task.attributes.get_int("trans_a", 0) == 1;
  const bool trans_b = task.attributes.get_int("trans_b", 0) == 1;
  const std::size_t ra = a.size(), rb = b.size();
  const double m = static_cast<double>(trans_a ? a[ra - 1] : a[ra - 2]);
  const double k = static_cast<double>(trans_a ? a[ra - 2] : a[ra - 1]);
  const double n = static_cast<double>(trans_b ? b[rb - 2] : b[rb - 1]);
  double count = 1;
  for (std::size_t i = 0; i + 2 < ra; ++i) count *= static_cast<double>(a[i]);
  if (rb == 2) {
    // B is shared by every batch entry: one GEMM of count·m rows; its gradient sums over them
    // into f32 when B is a parameter (the tied LM head's table).
    const bool parameter = graph.value(task.inputs[1]).kind == ValueKind::Param;
    const double forward = gemm_seconds(kernels, count * m, n, k, 1, element);
    const double backward = gemm_seconds(kernels, count * m, k, n, 1, element) +
                            gemm_seconds(kernels, k, n, count * m, 1, element, parameter ? 2 * 4 * n * k : 0);
    return {forward, backward};
  }
  return {gemm_seconds(kernels, m, n, k, count, element),
          gemm_seconds(kernels, m, k, n, count, element) + gemm_seconds(kernels, k, n, m, count, element)};
}

std::pair<double, double> attention_task_seconds(const Graph& graph, const Task& task, std::int64_t batch,
                                                 const KernelModel& kernels, double element) {
  const Shape q = concrete(graph.value(task.inputs[0]).type.shape, batch);
  const Shape v = concrete(graph.value(task.inputs[2]).type.shape, batch);
  const double count = static_cast<double>(q[0]) * static_cast<double>(q[1]);
  const double s = static_cast<double>(q[2]), d = static_cast<double>(q[3]);
  const double t = static_cast<double>(v[2]), dv = static_cast<double>(v[3]);
  // q, k, v and the output in; their gradients and the output gradient in the backward.
  const double io = count * (s * d + t * d + t * dv + s * dv) * element;
  const double forward = std::max(gemm_math_seconds(kernels, s, t, d, count) + gemm_math_seconds(kernels, s, dv, t, count),
                                  memory_seconds(kernels, io));
  const double backward_math = gemm_math_seconds(kernels, s, t, d, count) +  // scores again
                               gemm_math_seconds(kernels, t, dv, s, count) +  // dV = Pᵀ dO
                               gemm_math_seconds(kernels, s, t, dv, count) +  // dP = dO Vᵀ
                               gemm_math_seconds(kernels, s, d, t, count) +   // dQ = dS K
                               gemm_math_seconds(kernels, t, d, s, count);    // dK = dSᵀ Q
  return {forward + kernels.kernel_seconds, std::max(backward_math, memory_seconds(kernels, 2 * io)) + kernels.kernel_seconds};
}

std::pair<double, double> streaming_task_seconds(const Graph& graph, const Task& task, std::int64_t batch,
                                                 const KernelModel& kernels, double element) {
  double outputs = 0;
  for (int output : task.outputs) outputs += value_bytes_at(graph, output, batch, element);
  if (task.op == OpType::Gather || task.op == OpType::VocabParallelEmbedding) {
    // Reads the rows it returns (and the indices); the backward adds the rows' gradients back.
    const double indices = value_bytes_at(graph, task.inputs[1], batch, element);
    return {memory_seconds(kernels, 2 * outputs + indices), memory_seconds(kernels, 2 * outputs + indices)};
  }
  double inputs = 0;
  for (int input : task.inputs) {
    const Value& value = graph.value(input);
    if (value.kind == ValueKind::Param || value.kind == ValueKind::Buffer) continue;  // per-feature vectors
    inputs += value_bytes_at(graph, input, batch, element);
  }
  return {memory_seconds(kernels, inputs + outputs), memory_seconds(kernels, outputs + 2 * inputs)};
}

}  // namespace

double gemm_math_seconds(const KernelModel& kernels, double m, double n, double k, double count) {
  PARTRAIN_CHECK(kernels.enabled(), "kernel timing: the device has no kernel figures");
  if (m <= 0 || n <= 0 || k <= 0 || count <= 0) return 0.0;
  const double sms = kernels.multiprocessors;
  const double per_multiprocessor = kernels.peak_flops * kernels.gemm_efficiency / sms;
  double best = std::numeric_limits<double>::infinity();
  for (const auto& [tile_m, tile_n] : kTiles) {
    const double waves = std::ceil(std::ceil(m / tile_m) * std::ceil(n / tile_n) * count / sms);
    best = std::min(best, waves * 2.0 * tile_m * tile_n * k / per_multiprocessor);
  }
  return best;
}

double memory_seconds(const KernelModel& kernels, double bytes) {
  PARTRAIN_CHECK(kernels.enabled(), "kernel timing: the device has no kernel figures");
  if (bytes <= 0) return 0.0;
  return bytes / (kernels.memory_bandwidth * kernels.memory_efficiency) + kernels.kernel_seconds;
}

double gemm_seconds(const KernelModel& kernels, double m, double n, double k, double count, double element_bytes,
                    double extra_bytes) {
  if (m <= 0 || n <= 0 || k <= 0 || count <= 0) return 0.0;
  const double math = gemm_math_seconds(kernels, m, n, k, count);
  const double bytes = (m * k + k * n + m * n) * count * element_bytes + extra_bytes;
  return std::max(math, bytes / (kernels.memory_bandwidth * kernels.memory_efficiency)) + kernels.kernel_seconds;
}

std::pair<double, double> task_kernel_seconds(const Graph& graph, int task_id, std::int64_t batch,
                                              const KernelModel& kernels, double activation_bytes) {
  PARTRAIN_CHECK(kernels.enabled(), "kernel timing: the device has no kernel figures");
  PARTRAIN_CHECK(task_id >= 0 && task_id < static_cast<int>(graph.tasks().size()),
                 "kernel timing: task " << task_id << " is not in the graph (" << graph.tasks().size() << " tasks)");
  const Task& task = graph.task(task_id);
  if (task.op == OpType::Reshape || is_communication(task.op)) return {0.0, 0.0};
  switch (task.op) {
    case OpType::Gemm: return gemm_task_seconds(graph, task, batch, kernels, activation_bytes);
    case OpType::MatMul: return matmul_task_seconds(graph, task, batch, kernels, activation_bytes);
    case OpType::Attention: return attention_task_seconds(graph, task, batch, kernels, activation_bytes);
    default: return streaming_task_seconds(graph, task, batch, kernels, activation_bytes);
  }
}

double optimizer_kernel_seconds(const KernelModel& kernels, double parameter_bytes, const std::string& optimizer,
                                bool mixed_precision) {
  const double passes = (optimizer == "sgd" ? 5.0 : 7.0) + (mixed_precision ? 0.5 : 0.0);
  return memory_seconds(kernels, passes * parameter_bytes);
}

}  // namespace partrain::partition
