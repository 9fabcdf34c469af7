#include "core/float16.h"

#include <cstring>

namespace partrain {

std::uint16_t float_to_half_bits(float value) {
  std::uint32_t word;
  std::memcpy(&word, &value, sizeof word);
  const std::uint16_t sign = static_cast<std::uint16_t>((word >> 16) & 0x8000u);
  const std::uint32_t magnitude = word & 0x7fffffffu;
  if (magnitude >= 0x7f800000u)  // inf stays inf; NaN stays a (quiet) NaN with its top payload bits
    return static_cast<std::uint16_t>(sign | 0x7c00u | (magnitude > 0x7f800000u ? 0x0200u | ((magnitude >> 13) & 0x03ffu) : 0u));
  if (magnitude >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to 65536 or more: inf
  if (magnitude < 0x38800000u) {  // below 2^-14: a subnormal (or zero) in fp16, a multiple of 2^-24
    if (magnitude < 0x33000000u) return sign;  // at most 2^-25 (half the smallest subnormal): rounds to ±0
    const std::uint32_t exponent = magnitude >> 23;  // 102..112
    const std::uint32_t mantissa = (magnitude & 0x007fffffu) | 0x00800000u;  // with the implicit 1
    const std::uint32_t shift = 126 - exponent;  // 14..24: value / 2^-24 = mantissa >> shift
    std::uint32_t half = mantissa >> shift;
    const std::uint32_t remainder = mantissa & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
    if (remainder > halfway || (remainder == halfway && (half & 1u))) ++half;  // may carry into the smallest normal
    return static_cast<std::uint16_t>(sign | half);
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even;
  // a carry out of the mantissa increments the exponent, which is the right result.
  std::uint32_t half = (magnitude - 0x38000000u) >> 13;
  const std::uint32_t remainder = magnitude & 0x1fffu;
  if (remainder > 0x1000u || (remainder == 0x1000u && (half & 1u))) ++half;
  return static_cast<std::uint16_t>(sign | half);
}

float half_bits_to_float(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1fu, mantissa = bits & 0x03ffu;
  std::uint32_t word;
  if (exponent == 0x1fu) {
    word = sign | 0x7f800000u | (mantissa << 13);  // inf or NaN
  } else if (exponent != 0) {
    word = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    word = sign;
  } else {  // subnormal: mantissa × 2^-24, normalised for the float
    int shift = 0;
    std::uint32_t m = mantissa;
    while (!(m & 0x0400u)) {
      m <<= 1;
      ++shift;
    }
    word = sign | static_cast<std::uint32_t>(113 - shift) << 23 | ((m & 0x03ffu) << 13);
  }
  float value;
  std::memcpy(&value, &word, sizeof value);
  return value;
}

}  // namespace partrain
