#pragma once
// Element types of tensors. bf16 is stored as the upper 16 bits of an IEEE fp32; f16 is IEEE binary16
// (core/float16.h).
#include <cstdint>
#include <cstring>
#include <string>

#include "core/float16.h"

namespace partrain {

enum class DType : std::uint8_t { F32, BF16, I32, I64, F16 };

/// Size of one element in bytes.
std::size_t dtype_size(DType dtype);
/// "f32", "bf16", "i32", "i64", "f16".
const char* dtype_name(DType dtype);
/// Parses a dtype name; throws partrain::Error on an unknown name.
DType parse_dtype(const std::string& name);
inline bool is_floating(DType dtype) { return dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16; }
/// The 16-bit float types (the compute types of mixed precision).
inline bool is_half_float(DType dtype) { return dtype == DType::BF16 || dtype == DType::F16; }

/// bfloat16 storage type with round-to-nearest-even conversion from float.
struct BFloat16 {
  std::uint16_t bits = 0;
  BFloat16() = default;
  explicit BFloat16(float value) {
    std::uint32_t word;
    std::memcpy(&word, &value, sizeof word);
    if ((word & 0x7f800000u) == 0x7f800000u && (word & 0x007fffffu)) {  // NaN stays NaN
      bits = static_cast<std::uint16_t>((word >> 16) | 0x40u);
    } else {
      word += 0x7fffu + ((word >> 16) & 1u);
      bits = static_cast<std::uint16_t>(word >> 16);
    }
  }
  explicit operator float() const {
    std::uint32_t word = static_cast<std::uint32_t>(bits) << 16;
    float value;
    std::memcpy(&value, &word, sizeof value);
    return value;
  }
};

/// Maps a C++ element type to its DType (used by Tensor::data<T>() checks).
template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<BFloat16>() { return DType::BF16; }
template <> constexpr DType dtype_of<Float16>() { return DType::F16; }
template <> constexpr DType dtype_of<std::int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<std::int64_t>() { return DType::I64; }

}  // namespace partrain
