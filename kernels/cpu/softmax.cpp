// CPU kernels of the softmax ops (schemas and semantics: src/graph/ops/softmax.cpp).
// Row sums are accumulated in double; the cross-entropy loss sums per-row losses in row order, so
// results do not depend on OMP_NUM_THREADS.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/common/op_geometry.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/vector_math.h"

namespace partrain {

namespace {
using cpu::kParallelThreshold;
constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();

// Numerically stable softmax of one row of `logits[0, length)` (already masked) into `y`.
// Rows whose elements are all -inf give zeros. Returns log(sum(exp(z - max))) + max (the
// log-sum-exp), -inf for such rows. Compiled for AVX-512, AVX2 and baseline x86-64, chosen at load
// time by the CPU's features (no FMA: every version rounds as the baseline one does).
PARTRAIN_VECTOR_CLONES double softmax_row(const float* logits, float* y, std::int64_t length) {
  // The maximum over 16 lanes: one running maximum would be a chain of dependent compares that the
  // compiler may not reorder (float), 4 cycles per element. The maximum is exact in any order.
  constexpr int kLanes = 16;
  float lanes[kLanes];
  std::fill(lanes, lanes + kLanes, kNegativeInfinity);
  std::int64_t i = 0;
  for (; i + kLanes <= length; i += kLanes)
    for (int k = 0; k < kLanes; ++k) lanes[k] = std::max(lanes[k], logits[i + k]);
  float max = kNegativeInfinity;
  for (int k = 0; k < kLanes; ++k) max = std::max(max, lanes[k]);
  for (; i < length; ++i) max = std::max(max, logits[i]);
  if (max == kNegativeInfinity) {
    std::fill(y, y + length, 0.f);
    return -std::numeric_limits<double>::infinity();
  }
  for (std::int64_t j = 0; j < length; ++j) y[j] = cpu::exp_vectorisable(logits[j] - max);
  double sums[4] = {0, 0, 0, 0};  // four chains: the additions do not wait on each other
  std::int64_t j = 0;
  for (; j + 4 <= length; j += 4)
    for (int k = 0; k < 4; ++k) sums[k] += y[j + k];
  for (; j < length; ++j) sums[0] += y[j];
  const double sum = (sums[0] + sums[1]) + (sums[2] + sums[3]);
  const float inverse = static_cast<float>(1.0 / sum);
  for (std::int64_t k = 0; k < length; ++k) y[k] *= inverse;
  return std::log(sum) + max;
}

// ---------------- Softmax ----------------
void softmax_forward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  const Tensor& x = inputs[0];
  const Shape& shape = x.shape();
  const std::int64_t length = x.dim(-1);
  const std::int64_t rows = length > 0 ? x.numel() / length : 0;
  const bool causal = context.attributes.get_int("causal", 0) != 0;
  const std::int64_t queries = causal ? x.dim(-2) : 1;  // S of [..., S, T]
  const float* px = x.data<float>();
  float* py = outputs[0].data<float>();

  const bool masked = inputs.size() > 1 && inputs[1].defined();
  const float* mask = masked ? inputs[1].data<float>() : nullptr;
  const std::vector<std::int64_t> strides = masked ? kernels::broadcast_strides(inputs[1].shape(), shape)
                                                   : std::vector<std::int64_t>{};
  const std::int64_t mask_column_stride = masked ? strides.back() : 0;

#pragma omp parallel if (x.numel() > kParallelThreshold)
  {
    std::vector<float> row(static_cast<std::size_t>(length));
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* xr = px + r * length;
      // Columns [0, visible) are unmasked by the causal rule.
      std::int64_t visible = length;
      if (causal) visible = std::clamp<std::int64_t>(r % queries + (length - queries) + 1, 0, length);
      if (mask) {
        // The offset of element (r, j) is that of (r, 0) plus j times the mask's last stride.
        const float* mr = mask + cpu::broadcast_offset(r * length, shape, strides);
        for (std::int64_t j = 0; j < visible; ++j) row[j] = xr[j] + mr[j * mask_column_stride];
      } else {
        std::copy(xr, xr + visible, row.begin());
      }
      std::fill(row.begin() + visible, row.end(), kNegativeInfinity);
      softmax_row(row.data(), py + r * length, length);
    }
  }
}

void softmax_backward(const KernelContext&, std::span<const Tensor>, std::span<const Tensor> outputs,
                      std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  if (input_grads.size() > 1 && input_grads[1].defined()) input_grads[1].zero();  // the mask has no gradient
  if (!input_grads[0].defined()) return;
  const Tensor& y = outputs[0];
  const std::int64_t length = y.dim(-1);
  const std::int64_t rows = length > 0 ? y.numel() / length : 0;
  const float* py = y.data<float>();
  const float* dy = output_grads[0].data<float>();
  float* dx = input_grads[0].data<float>();
#pragma omp parallel for schedule(static) if (y.numel() > kParallelThreshold)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* yr = py + r * length;
    const float* dyr = dy + r * length;
    double dot = 0;
    for (std::int64_t j = 0; j < length; ++j) dot += double(dyr[j]) * yr[j];
    const float fdot = static_cast<float>(dot);
    float* dxr = dx + r * length;
    for (std::int64_t j = 0; j < length; ++j) dxr[j] = yr[j] * (dyr[j] - fdot);
  }
}

// ---------------- SoftmaxCrossEntropy ----------------
// Checks every label (serially: errors must not be thrown inside a parallel region) and returns the
// number of positions that count (label != ignore_index).
std::int64_t count_labels(const Tensor& labels, std::int64_t classes, std::int64_t ignore_index) {
  std::int64_t count = 0;
  for (std::int64_t i = 0; i < labels.numel(); ++i) {
    const std::int64_t label = cpu::index_at(labels, i);
    if (label == ignore_index) continue;
    if (label < 0 || label >= classes) {
      // Position as coordinates of the labels tensor.
      PARTRAIN_FAIL("SoftmaxCrossEntropy label " << label << " at position "
                                                 << kernels::position_string(i, labels.shape()) << " (flat index "
                                                 << i << ") is outside [0, " << classes << ") and is not ignore_index "
                                                 << ignore_index);
    }
    ++count;
  }
  return count;
}

void cross_entropy_forward(const KernelContext& context, std::span<const Tensor> inputs,
                           std::span<const Tensor> outputs) {
  const Tensor& logits = inputs[0];
  const Tensor& labels = inputs[1];
  const kernels::CrossEntropyShape dims = kernels::cross_entropy_shape(context.attributes, logits, labels);
  const std::int64_t classes = dims.classes, rows = dims.rows, ignore_index = dims.ignore_index;
  const std::int64_t count = count_labels(labels, classes, ignore_index);
  const float* pz = logits.data<float>();
  std::vector<double> losses(static_cast<std::size_t>(rows), 0.0);
#pragma omp parallel if (logits.numel() > kParallelThreshold)
  {
    std::vector<float> probabilities(static_cast<std::size_t>(classes));
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t label = cpu::index_at(labels, r);
      if (label == ignore_index) continue;
      const float* zr = pz + r * classes;
      const double log_sum_exp = softmax_row(zr, probabilities.data(), classes);
      losses[r] = log_sum_exp - zr[label];
    }
  }
  double total = 0;
  for (double loss : losses) total += loss;
  outputs[0].data<float>()[0] = count > 0 ? static_cast<float>(total / static_cast<double>(count)) : 0.f;
}

void cross_entropy_backward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor>,
                            std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  if (input_grads[1].defined()) input_grads[1].zero();  // labels have no gradient
  if (!input_grads[0].defined()) return;
  const Tensor& logits = inputs[0];
  const Tensor& labels = inputs[1];
  const kernels::CrossEntropyShape dims = kernels::cross_entropy_shape(context.attributes, logits, labels);
  const std::int64_t classes = dims.classes, rows = dims.rows, ignore_index = dims.ignore_index;
  const std::int64_t count = count_labels(labels, classes, ignore_index);
  const float scale = count > 0 ? static_cast<float>(double(output_grads[0].data<float>()[0]) / double(count)) : 0.f;
  const float* pz = logits.data<float>();
  float* dz = input_grads[0].data<float>();
#pragma omp parallel for schedule(static) if (logits.numel() > kParallelThreshold)
  for (std::int64_t r = 0; r < rows; ++r) {
    float* dzr = dz + r * classes;
    const std::int64_t label = cpu::index_at(labels, r);
    if (label == ignore_index) {
      std::fill(dzr, dzr + classes, 0.f);
      continue;
    }
    softmax_row(pz + r * classes, dzr, classes);
    for (std::int64_t j = 0; j < classes; ++j) dzr[j] *= scale;
    dzr[label] -= scale;
  }
}
}  // namespace

void register_cpu_softmax_kernels(Backend& backend) {
  backend.set_kernels(OpType::Softmax, {softmax_forward, softmax_backward});
  backend.set_kernels(OpType::SoftmaxCrossEntropy, {cross_entropy_forward, cross_entropy_backward});
}

}  // namespace partrain
