#pragma once
// Elementwise float math for the CPU kernels' hot loops, written without library calls or branches
// (float comparisons may trap, so the compiler keeps them as branches; integer selects it does
// not) so that the loops calling them vectorise: std::exp, std::tanh and std::erf are scalar calls
// per element. Accuracy is stated per function; NaN stays NaN.
#include <bit>
#include <cstdint>

/// A hot loop's function compiled three times (AVX-512, AVX2, baseline x86-64) and picked when the
/// program loads by what the CPU supports (GCC's ifunc dispatch), so that one portable binary runs
/// 16- or 8-wide where it can. FMA is left out on purpose: contracting a * b + c would round
/// differently on different machines; the vector width alone does not change any result. AVX-512F
/// has fused multiply-adds of its own, so the build turns contraction off (-ffp-contract=off,
/// CMakeLists.txt): GCC contracts by default in C++.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define PARTRAIN_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define PARTRAIN_VECTOR_CLONES
#endif

namespace partrain::cpu {

inline std::int32_t bits_of(float x) { return std::bit_cast<std::int32_t>(x); }
inline float float_of(std::int32_t bits) { return std::bit_cast<float>(bits); }

/// exp(x) for float x as Cephes' expf: x = n ln2 + r with |r| <= ln2 / 2 (two-step Cody-Waite), a
/// degree-6 polynomial for exp(r) (about 1 ulp; |x| > 88 gives 0 or inf, NaN stays NaN). Branch-free
/// integer selects (float comparisons may trap, so the compiler keeps them as branches) let the
/// compiler vectorise the loops calling it; std::exp is a scalar call per element and was most of a
/// GPT step's SoftmaxCrossEntropy time.
inline float exp_vectorisable(float x) {
  const std::int32_t bits = bits_of(x), magnitude = bits & 0x7fffffff;
  const bool out_of_range = (magnitude > 0x42b00000) & (magnitude <= 0x7f800000);  // |x| > 88.0f, not NaN
  const std::int32_t keep = -static_cast<std::int32_t>(!out_of_range);              // all ones where in range
  const float clamped = float_of(bits & keep);
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer
  const float n = (clamped * 1.44269504088896341f + kRound) - kRound;
  float r = clamped - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float value = p * float_of((static_cast<std::int32_t>(n) + 127) << 23);
  const std::int32_t limit = bits < 0 ? 0 : 0x7f800000;  // exp(-big) = 0, exp(+big) = inf
  return float_of((bits_of(value) & keep) | (limit & ~keep));
}

/// tanh(x) = 1 - 2 / (exp(2x) + 1), through exp_vectorisable: absolute error about 1e-7 (relative
/// error grows near 0, where the result is small: fine inside 1 + tanh, as GELU uses it).
inline float tanh_vectorisable(float x) { return 1.0f - 2.0f / (exp_vectorisable(2.0f * x) + 1.0f); }

/// erf(x) by Abramowitz & Stegun 7.1.26 (absolute error <= 1.5e-7), odd in x, through exp_vectorisable.
inline float erf_vectorisable(float x) {
  const std::int32_t bits = bits_of(x);
  const float magnitude = float_of(bits & 0x7fffffff);
  const float t = 1.0f / (1.0f + 0.3275911f * magnitude);
  const float polynomial =
      t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
  const float positive = 1.0f - polynomial * exp_vectorisable(-magnitude * magnitude);
  return float_of(bits_of(positive) | (bits & static_cast<std::int32_t>(0x80000000u)));  // the sign of x
}

}  // namespace partrain::cpu
