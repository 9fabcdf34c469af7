#include "core/dtype.h"

#include "core/error.h"

namespace partrain {

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::F16: return 2;
  }
  PARTRAIN_FAIL("unknown dtype " << int(dtype));
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::F16: return "f16";
  }
  return "?";
}

DType parse_dtype(const std::string& name) {
  if (name == "f32" || name == "fp32" || name == "float32") return DType::F32;
  if (name == "bf16" || name == "bfloat16") return DType::BF16;
  if (name == "i32" || name == "int32") return DType::I32;
  if (name == "i64" || name == "int64") return DType::I64;
  if (name == "f16" || name == "fp16" || name == "float16") return DType::F16;
  PARTRAIN_FAIL("unknown dtype '" << name << "' (expected f32, bf16, f16, i32 or i64)");
}

}  // namespace partrain
