// The optimizer's elementwise loops on the CPU (kernels/cpu/optimizer_kernels.h). Built with
// -fno-math-errno (CMakeLists.txt): std::sqrt may then be the vector square-root instruction, which
// rounds exactly as the scalar one; with errno set on negative input, GCC keeps a scalar call.
#include "kernels/cpu/optimizer_kernels.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/vector_math.h"

namespace partrain::cpu {

namespace {

PARTRAIN_VECTOR_CLONES void adamw_range(float* value, const float* g_in, float* m, float* v, std::int64_t n,
                                        const AdamWUpdate u) {
  for (std::int64_t k = 0; k < n; ++k) {
    const float g = g_in[k] * u.grad_scale;
    value[k] *= u.keep;
    m[k] += u.one_minus_beta1 * (g - m[k]);  // torch lerp_(grad, 1 - beta1)
    v[k] = v[k] * u.beta2 + u.one_minus_beta2 * g * g;
    const float denom = std::sqrt(v[k]) / u.bias_correction2_sqrt + u.eps;
    value[k] -= u.step_size * m[k] / denom;
  }
}

PARTRAIN_VECTOR_CLONES void sgd_range(float* value, const float* g, std::int64_t n, const SgdUpdate u) {
  for (std::int64_t k = 0; k < n; ++k) {
    float d = g[k] * u.grad_scale;
    if (u.decay != 0.0f) d += u.decay * value[k];
    value[k] -= u.rate * d;
  }
}

PARTRAIN_VECTOR_CLONES void sgd_momentum_range(float* value, const float* g, float* buffer, std::int64_t n,
                                               const SgdUpdate u) {
  for (std::int64_t k = 0; k < n; ++k) {
    float d = g[k] * u.grad_scale;
    if (u.decay != 0.0f) d += u.decay * value[k];
    buffer[k] = u.first ? d : buffer[k] * u.momentum + d;
    value[k] -= u.rate * buffer[k];
  }
}

// Eight running sums, lane j over the elements k ≡ j (mod 8): the compiler keeps them in one
// vector register; a single running sum is a chain of dependent additions it may not reorder.
PARTRAIN_VECTOR_CLONES double sum_of_squares_range(const float* x, std::int64_t n) {
  constexpr int kLanes = 8;
  double lanes[kLanes] = {};
  std::int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes)
    for (int j = 0; j < kLanes; ++j) {
      const double value = x[k + j];
      lanes[j] += value * value;
    }
  for (; k < n; ++k) {
    const double value = x[k];
    lanes[0] += value * value;
  }
  double sum = 0;
  for (double lane : lanes) sum += lane;
  return sum;
}

}  // namespace

void adamw_update_f32(float* parameter, const float* gradient, float* exp_avg, float* exp_avg_sq, std::int64_t n,
                      const AdamWUpdate& update) {
  for_each_chunk(n, [&](std::int64_t first, std::int64_t count) {
    adamw_range(parameter + first, gradient + first, exp_avg + first, exp_avg_sq + first, count, update);
  });
}

void sgd_update_f32(float* parameter, const float* gradient, float* momentum_buffer, std::int64_t n,
                    const SgdUpdate& update) {
  for_each_chunk(n, [&](std::int64_t first, std::int64_t count) {
    if (momentum_buffer)
      sgd_momentum_range(parameter + first, gradient + first, momentum_buffer + first, count, update);
    else
      sgd_range(parameter + first, gradient + first, count, update);
  });
}

double sum_of_squares_f32(const float* values, std::int64_t n) {
  std::vector<double> sums(static_cast<std::size_t>((n + kChunkElements - 1) / kChunkElements), 0.0);
  for_each_chunk(n, [&](std::int64_t first, std::int64_t count) {
    sums[static_cast<std::size_t>(first / kChunkElements)] = sum_of_squares_range(values + first, count);
  });
  double total = 0;
  for (double sum : sums) total += sum;
  return total;
}

}  // namespace partrain::cpu
