// CPU kernels of the attention ops (schemas and semantics: src/graph/ops/attention.cpp).
// Fused scaled dot-product attention, one (batch, head) pair per OpenMP iteration, each product an
// sgemm (oneDNN, on the loop's thread). The backward recomputes the probabilities instead of saving them.
#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/common/op_geometry.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"

namespace partrain {

namespace {
using cpu::blas_int;
using cpu::sgemm;

// Sizes, scale and causality (kernels::AttentionShape) plus the CPU's view of the mask.
struct AttentionDims : kernels::AttentionShape {
  const float* mask = nullptr;
  std::vector<std::int64_t> mask_strides;  // broadcast strides over [B, h, S, T]
};

AttentionDims attention_dims(const KernelContext& context, std::span<const Tensor> inputs) {
  AttentionDims dims;
  static_cast<kernels::AttentionShape&>(dims) = kernels::attention_shape(context.attributes, inputs);
  for (std::int64_t size : {dims.s, dims.t, dims.d, dims.dv}) blas_int(size);  // no throwing in parallel loops
  if (inputs.size() > 3 && inputs[3].defined()) {
    dims.mask = inputs[3].data<float>();
    dims.mask_strides = kernels::broadcast_strides(inputs[3].shape(), {dims.batch, dims.heads, dims.s, dims.t});
  }
  return dims;
}

// p [S, T] = softmax(scale * q k^T + mask) of pair `pair` (= b * heads + head), rows stable.
// A row whose every key is masked to -inf becomes all zeros.
void attention_probabilities(const AttentionDims& dims, std::int64_t pair, const float* q, const float* k, float* p) {
  const std::int64_t s = dims.s, t = dims.t;
  sgemm(false, true, s, t, dims.d, dims.scale, q, k, 0.f, p);
  const std::int64_t b = pair / dims.heads;
  const std::int64_t head = pair % dims.heads;
  constexpr float kNegativeInfinity = -std::numeric_limits<float>::infinity();
  for (std::int64_t i = 0; i < s; ++i) {
    float* row = p + i * t;
    if (dims.mask) {
      const auto& st = dims.mask_strides;
      const float* mask_row = dims.mask + b * st[0] + head * st[1] + i * st[2];
      for (std::int64_t j = 0; j < t; ++j) row[j] += mask_row[j * st[3]];
    }
    // Causal: key j is visible to query i when j <= i + (T - S).
    const std::int64_t visible = dims.causal ? std::clamp<std::int64_t>(i + (t - s) + 1, 0, t) : t;
    for (std::int64_t j = visible; j < t; ++j) row[j] = kNegativeInfinity;
    float max = kNegativeInfinity;
    for (std::int64_t j = 0; j < visible; ++j) max = std::max(max, row[j]);
    if (max == kNegativeInfinity) {  // nothing visible
      std::fill(row, row + t, 0.f);
      continue;
    }
    double sum = 0;
    for (std::int64_t j = 0; j < visible; ++j) {
      row[j] = std::exp(row[j] - max);
      sum += row[j];
    }
    const float inverse = static_cast<float>(1.0 / sum);
    for (std::int64_t j = 0; j < visible; ++j) row[j] *= inverse;
    for (std::int64_t j = visible; j < t; ++j) row[j] = 0.f;
  }
}

// (batch, head) pairs run in an OpenMP loop from this many FLOPs in all (far above the cost of a
// parallel region).
constexpr double kParallelFlops = 1 << 18;

bool parallel_over_pairs(const AttentionDims& dims) {
  const double flops = 2.0 * static_cast<double>(dims.pairs() * dims.s * dims.t * (dims.d + dims.dv));
  return dims.pairs() > 1 && flops >= kParallelFlops;
}

void attention_forward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  const AttentionDims dims = attention_dims(context, inputs);
  const float* q = inputs[0].data<float>();
  const float* k = inputs[1].data<float>();
  const float* v = inputs[2].data<float>();
  float* y = outputs[0].data<float>();
  const std::int64_t pairs = dims.pairs();
#pragma omp parallel if (parallel_over_pairs(dims))
  {
    std::vector<float> p(static_cast<std::size_t>(dims.s * dims.t));
#pragma omp for schedule(dynamic)
    for (std::int64_t pair = 0; pair < pairs; ++pair) {
      attention_probabilities(dims, pair, q + pair * dims.s * dims.d, k + pair * dims.t * dims.d, p.data());
      sgemm(false, false, dims.s, dims.dv, dims.t, 1.f, p.data(), v + pair * dims.t * dims.dv, 0.f,
            y + pair * dims.s * dims.dv);
    }
  }
}

void attention_backward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor>,
                        std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  const AttentionDims dims = attention_dims(context, inputs);
  // The mask is a constant of the graph (schema: not differentiable); if a gradient is asked for
  // anyway it is zero.
  if (input_grads.size() > 3 && input_grads[3].defined()) input_grads[3].zero();
  const bool need_dq = input_grads[0].defined();
  const bool need_dk = input_grads[1].defined();
  const bool need_dv = input_grads[2].defined();
  if (!need_dq && !need_dk && !need_dv) return;
  const float* q = inputs[0].data<float>();
  const float* k = inputs[1].data<float>();
  const float* v = inputs[2].data<float>();
  const float* dy = output_grads[0].data<float>();
  float* dq = need_dq ? input_grads[0].data<float>() : nullptr;
  float* dk = need_dk ? input_grads[1].data<float>() : nullptr;
  float* dv = need_dv ? input_grads[2].data<float>() : nullptr;
  const std::int64_t s = dims.s, t = dims.t, d = dims.d, dvd = dims.dv;
  const std::int64_t pairs = dims.pairs();
#pragma omp parallel if (parallel_over_pairs(dims))
  {
    std::vector<float> p(static_cast<std::size_t>(s * t));
    std::vector<float> dp(need_dq || need_dk ? static_cast<std::size_t>(s * t) : 0);
#pragma omp for schedule(dynamic)
    for (std::int64_t pair = 0; pair < pairs; ++pair) {
      const float* q_pair = q + pair * s * d;
      const float* k_pair = k + pair * t * d;
      const float* v_pair = v + pair * t * dvd;
      const float* dy_pair = dy + pair * s * dvd;
      attention_probabilities(dims, pair, q_pair, k_pair, p.data());
      if (need_dv) sgemm(true, false, t, dvd, s, 1.f, p.data(), dy_pair, 0.f, dv + pair * t * dvd);  // dV = P^T dO
      if (!need_dq && !need_dk) continue;
      sgemm(false, true, s, t, dvd, 1.f, dy_pair, v_pair, 0.f, dp.data());  // dP = dO V^T
      for (std::int64_t i = 0; i < s; ++i) {  // dS = P * (dP - rowsum(dP * P))
        const float* p_row = p.data() + i * t;
        float* dp_row = dp.data() + i * t;
        double dot = 0;
        for (std::int64_t j = 0; j < t; ++j) dot += double(dp_row[j]) * p_row[j];
        const float row_dot = static_cast<float>(dot);
        for (std::int64_t j = 0; j < t; ++j) dp_row[j] = p_row[j] * (dp_row[j] - row_dot);
      }
      if (need_dq) sgemm(false, false, s, d, t, dims.scale, dp.data(), k_pair, 0.f, dq + pair * s * d);  // scale dS k
      if (need_dk) sgemm(true, false, t, d, s, dims.scale, dp.data(), q_pair, 0.f, dk + pair * t * d);   // scale dS^T q
    }
  }
}
}  // namespace

void register_cpu_attention_kernels(Backend& backend) {
  backend.set_kernels(OpType::Attention, {attention_forward, attention_backward});
}

}  // namespace partrain
