#include "core/tensor.h"

#include <algorithm>
#include <cstring>

#include "core/allocator.h"

namespace partrain {

Storage::Storage(Device device, std::size_t bytes)
    : device_(device), bytes_(bytes), data_(allocator_for(device).allocate(bytes)) {}

Storage::~Storage() { allocator_for(device_).deallocate(data_, bytes_); }

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  Tensor tensor;
  tensor.shape_ = shape;
  tensor.dtype_ = dtype;
  tensor.numel_ = partrain::numel(shape);
  tensor.storage_ = std::make_shared<Storage>(device, tensor.nbytes());
  return tensor;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor tensor = empty(shape, dtype, device);
  tensor.zero();
  return tensor;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype) {
  Tensor tensor = empty(shape, dtype);
  const std::int64_t n = tensor.numel();
  switch (dtype) {
    case DType::F32: std::fill_n(tensor.data<float>(), n, static_cast<float>(value)); break;
    case DType::BF16: std::fill_n(tensor.data<BFloat16>(), n, BFloat16(static_cast<float>(value))); break;
    case DType::F16: std::fill_n(tensor.data<Float16>(), n, Float16(static_cast<float>(value))); break;
    case DType::I32: std::fill_n(tensor.data<std::int32_t>(), n, static_cast<std::int32_t>(value)); break;
    case DType::I64: std::fill_n(tensor.data<std::int64_t>(), n, static_cast<std::int64_t>(value)); break;
  }
  return tensor;
}

Tensor Tensor::reshape(const Shape& shape) const {
  Shape resolved = shape;
  std::int64_t known = 1;
  int inferred = -1;
  for (std::size_t i = 0; i < resolved.size(); ++i) {
    if (resolved[i] == -1) {
      PARTRAIN_CHECK(inferred < 0, "reshape to " << shape_string(shape) << ": more than one -1");
      inferred = static_cast<int>(i);
    } else {
      known *= resolved[i];
    }
  }
  if (inferred >= 0) {
    PARTRAIN_CHECK(known > 0 && numel_ % known == 0,
                   "cannot reshape " << shape_string(shape_) << " to " << shape_string(shape));
    resolved[inferred] = numel_ / known;
  }
  PARTRAIN_CHECK(partrain::numel(resolved) == numel_,
                 "cannot reshape " << shape_string(shape_) << " to " << shape_string(shape));
  Tensor result = *this;
  result.shape_ = resolved;
  return result;
}

Tensor Tensor::slice_rows(std::int64_t begin, std::int64_t end) const {
  PARTRAIN_CHECK(rank() >= 1 && begin >= 0 && begin <= end && end <= shape_[0],
                 "slice_rows [" << begin << ", " << end << ") of " << shape_string(shape_));
  Tensor result = *this;
  const std::int64_t row = shape_[0] ? numel_ / shape_[0] : 0;
  result.shape_[0] = end - begin;
  result.numel_ = row * (end - begin);
  result.offset_ = offset_ + row * begin;
  return result;
}

Tensor Tensor::reinterpret(DType dtype) const {
  PARTRAIN_CHECK(defined(), "reinterpret: undefined tensor");
  const std::size_t from = dtype_size(dtype_), to = dtype_size(dtype);
  const std::size_t start = static_cast<std::size_t>(offset_) * from;
  PARTRAIN_CHECK(nbytes() % to == 0 && start % to == 0,
                 "reinterpret: " << nbytes() << " bytes at byte " << start << " are not whole " << to << "-byte elements");
  Tensor result = *this;
  result.dtype_ = dtype;
  result.numel_ = static_cast<std::int64_t>(nbytes() / to);
  result.offset_ = static_cast<std::int64_t>(start / to);
  result.shape_ = {result.numel_};
  return result;
}

Tensor Tensor::shape_only() const { return shape_only(dtype_); }

Tensor Tensor::shape_only(DType dtype) const {
  Tensor placeholder;
  placeholder.shape_ = shape_;
  placeholder.dtype_ = dtype;
  placeholder.numel_ = numel_;
  return placeholder;
}

Tensor Tensor::clone() const {
  PARTRAIN_CHECK(device().is_cpu(), "Tensor::clone on " << device().to_string() << ": use the backend's copy");
  Tensor copy = empty(shape_, dtype_, device());
  std::memcpy(copy.raw_data(), raw_data(), nbytes());
  return copy;
}

void Tensor::zero() const {
  PARTRAIN_CHECK(device().is_cpu(), "Tensor::zero on " << device().to_string() << ": use the backend's fill");
  std::memset(raw_data(), 0, nbytes());
}

std::vector<float> Tensor::to_float_vector() const {
  PARTRAIN_CHECK(device().is_cpu(), "to_float_vector needs a host tensor");
  std::vector<float> values(numel_);
  for (std::int64_t i = 0; i < numel_; ++i) {
    switch (dtype_) {
      case DType::F32: values[i] = data<float>()[i]; break;
      case DType::BF16: values[i] = static_cast<float>(data<BFloat16>()[i]); break;
      case DType::F16: values[i] = static_cast<float>(data<Float16>()[i]); break;
      case DType::I32: values[i] = static_cast<float>(data<std::int32_t>()[i]); break;
      case DType::I64: values[i] = static_cast<float>(data<std::int64_t>()[i]); break;
    }
  }
  return values;
}

}  // namespace partrain
