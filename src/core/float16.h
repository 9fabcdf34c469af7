#pragma once
// IEEE 754 binary16 ("half", fp16) storage: 1 sign bit, 5 exponent bits (bias 15), 10 mantissa bits;
// largest finite 65504, smallest normal 2^-14, smallest subnormal 2^-24.
#include <cstdint>

namespace partrain {

/// The fp16 bits of `value`, rounded to nearest even (as the hardware conversions do): subnormal
/// results rounded in the same way, values from 65520 up to inf (overflow), NaN kept a quiet NaN.
std::uint16_t float_to_half_bits(float value);
/// The float of fp16 `bits` (exact: every fp16 value is a float).
float half_bits_to_float(std::uint16_t bits);

/// fp16 storage type with round-to-nearest-even conversion from float.
struct Float16 {
  std::uint16_t bits = 0;
  Float16() = default;
  explicit Float16(float value) : bits(float_to_half_bits(value)) {}
  explicit operator float() const { return half_bits_to_float(bits); }
};

}  // namespace partrain
