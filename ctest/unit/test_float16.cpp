// IEEE binary16 conversion (core/float16.h) against known bit patterns, an exhaustive round trip of
// every fp16 value, the ties-to-even rule at every midpoint, and the compiler's _Float16 (an
// independent round-to-nearest-even conversion) on many random floats where it exists.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "core/dtype.h"
#include "core/float16.h"
#include "core/tensor.h"
#include "kernels/cpu/cpu_backend.h"

namespace partrain {
namespace {

float float_of_bits(std::uint32_t word) {
  float value;
  std::memcpy(&value, &word, sizeof value);
  return value;
}

TEST(Float16, KnownBitPatterns) {
  EXPECT_EQ(float_to_half_bits(0.0f), 0x0000);
  EXPECT_EQ(float_to_half_bits(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half_bits(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half_bits(-2.0f), 0xc000);
  EXPECT_EQ(float_to_half_bits(65504.0f), 0x7bff);                  // largest finite
  EXPECT_EQ(float_to_half_bits(65519.99f), 0x7bff);                 // below the midpoint to 65536
  EXPECT_EQ(float_to_half_bits(65520.0f), 0x7c00);                  // the midpoint rounds to even: inf
  EXPECT_EQ(float_to_half_bits(1e10f), 0x7c00);
  EXPECT_EQ(float_to_half_bits(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -14)), 0x0400);     // smallest normal
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -24)), 0x0001);     // smallest subnormal
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.0f, -25)), 0x0000);     // half of it: ties to even (0)
  EXPECT_EQ(float_to_half_bits(std::ldexp(1.5f, -25)), 0x0001);     // above the midpoint
  EXPECT_EQ(float_to_half_bits(std::ldexp(3.0f, -25)), 0x0002);     // 1.5 subnormal ulps: ties to even (2)
  EXPECT_EQ(float_to_half_bits(std::ldexp(1023.5f, -24)), 0x0400);  // carries into the smallest normal
  EXPECT_EQ(float_to_half_bits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // halfway: ties to even
  EXPECT_EQ(float_to_half_bits(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // halfway, odd below: up
  EXPECT_EQ(float_to_half_bits(0.1f), 0x2e66);
  EXPECT_EQ(float_to_half_bits(3.140625f), 0x4248);
  const std::uint16_t nan = float_to_half_bits(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x03ff, 0);
  EXPECT_NE(float_to_half_bits(float_of_bits(0x7f800001u)) & 0x03ff, 0);  // a signalling NaN stays a NaN
  EXPECT_EQ(half_bits_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(half_bits_to_float(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(half_bits_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(half_bits_to_float(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(half_bits_to_float(0x7e00)));
}

TEST(Float16, EveryValueRoundTripsAndMidpointsTieToEven) {
  for (std::uint32_t bits = 0; bits < 0x10000u; ++bits) {
    const auto half = static_cast<std::uint16_t>(bits);
    const float value = half_bits_to_float(half);
    if (std::isnan(value)) continue;
    ASSERT_EQ(float_to_half_bits(value), half) << std::hex << bits;
    if ((bits & 0x7fffu) >= 0x7bffu) continue;  // the largest finite and inf have no finite neighbour above
    // Between this value and the next one up (in magnitude): the midpoint (exact in fp32) goes to the
    // even one of the two, a float above or below it to the nearer one.
    const float next = half_bits_to_float(static_cast<std::uint16_t>(half + 1));
    const float middle = (value + next) / 2;
    const std::uint16_t even = (half & 1u) ? static_cast<std::uint16_t>(half + 1) : half;
    ASSERT_EQ(float_to_half_bits(middle), even) << std::hex << bits;
    ASSERT_EQ(float_to_half_bits(std::nextafter(middle, 0.0f)), half)
        << std::hex << bits;
    ASSERT_EQ(float_to_half_bits(std::nextafter(middle, 2 * next)), static_cast<std::uint16_t>(half + 1))
        << std::hex << bits;
  }
}

#if defined(__FLT16_MAX__)
TEST(Float16, MatchesTheCompilersFloat16) {
  std::mt19937 generator(7);
  std::uniform_int_distribution<std::uint32_t> words;
  for (int i = 0; i < 2000000; ++i) {
    // Random exponents around fp16's range (2^-30 .. 2^20) and random mantissas and signs.
    std::uint32_t word = words(generator);
    word = (word & 0x807fffffu) | ((97u + (word >> 23) % 50u) << 23);
    const float value = float_of_bits(word);
    const _Float16 reference = static_cast<_Float16>(value);
    std::uint16_t reference_bits;
    std::memcpy(&reference_bits, &reference, sizeof reference_bits);
    ASSERT_EQ(float_to_half_bits(value), reference_bits) << value;
  }
}
#else
TEST(Float16, MatchesTheCompilersFloat16) { GTEST_SKIP() << "this compiler has no _Float16"; }
#endif

TEST(Float16, DTypeAndCpuConversions) {
  EXPECT_EQ(dtype_size(DType::F16), 2u);
  EXPECT_STREQ(dtype_name(DType::F16), "f16");
  EXPECT_EQ(parse_dtype("fp16"), DType::F16);
  EXPECT_TRUE(is_floating(DType::F16));
  EXPECT_TRUE(is_half_float(DType::F16));
  CpuBackend backend;
  const Tensor wide = Tensor::from_vector<float>({5}, {1.0f, 65520.0f, 1e-8f, -0.1f, 3.0f});
  Tensor half = backend.empty({5}, DType::F16);
  backend.convert(half, wide);
  EXPECT_EQ(half.to_float_vector(), (std::vector<float>{1.0f, std::numeric_limits<float>::infinity(), 0.0f,
                                                        half_bits_to_float(0xae66), 3.0f}));
  Tensor back = backend.empty({5}, DType::F32);
  backend.convert(back, half);
  EXPECT_EQ(back.to_float_vector(), half.to_float_vector());
  // f16 gradients accumulate into f32 masters in fp32.
  Tensor accumulator = Tensor::from_vector<float>({5}, {1, 1, 1, 1, 1});
  backend.accumulate(accumulator, half);
  EXPECT_EQ(accumulator.to_float_vector()[0], 2.0f);
  EXPECT_TRUE(std::isinf(accumulator.to_float_vector()[1]));
  EXPECT_EQ(Tensor::full({2}, 0.5, DType::F16).to_float_vector(), (std::vector<float>{0.5f, 0.5f}));
  Tensor bf16 = backend.empty({5}, DType::BF16);
  EXPECT_THROW(backend.convert(bf16, half), Error);  // one side must be f32
}

}  // namespace
}  // namespace partrain
