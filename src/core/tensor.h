#pragma once
// Tensor: a contiguous, row-major, reference-counted buffer with a shape, a dtype and a device.
// Copies of a Tensor share storage (like torch.Tensor handles); clone() copies the data.
#include <cstdint>
#include <memory>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/shape.h"

namespace partrain {

/// Memory owned through a device's CachingAllocator; released to its cache on destruction.
class Storage {
 public:
  Storage(Device device, std::size_t bytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  Device device_;
  std::size_t bytes_;
  void* data_;
};

class Tensor {
 public:
  /// An undefined tensor (defined() is false), used for "no gradient needed".
  Tensor() = default;

  /// Uninitialised tensor. Shape must be concrete (no kBatch); throws partrain::Error otherwise.
  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = cpu_device());
  /// Zero-filled tensor.
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = cpu_device());
  /// Host tensor filled with `value` (converted to dtype).
  static Tensor full(const Shape& shape, double value, DType dtype = DType::F32);
  /// Host tensor holding `values` (size must equal numel(shape)).
  template <typename T>
  static Tensor from_vector(const Shape& shape, const std::vector<T>& values) {
    PARTRAIN_CHECK(static_cast<std::int64_t>(values.size()) == partrain::numel(shape),
                   "from_vector: " << values.size() << " values for shape " << shape_string(shape));
    Tensor tensor = empty(shape, dtype_of<T>());
    std::copy(values.begin(), values.end(), tensor.data<T>());
    return tensor;
  }

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  std::int64_t dim(int axis) const { return shape_[normalise_axis(axis, shape_.size())]; }
  std::size_t rank() const { return shape_.size(); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : cpu_device(); }
  std::int64_t numel() const { return numel_; }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel_) * dtype_size(dtype_); }

  /// Typed pointer to the first element. Handle semantics: a const Tensor still gives mutable data.
  /// Throws partrain::Error if T does not match dtype() or the tensor is undefined.
  template <typename T>
  T* data() const {
    PARTRAIN_CHECK(defined(), "data() on an undefined tensor");
    PARTRAIN_CHECK(dtype_of<T>() == dtype_, "tensor of dtype " << dtype_name(dtype_) << " accessed as "
                                                               << dtype_name(dtype_of<T>()));
    return static_cast<T*>(storage_->data()) + offset_;
  }
  void* raw_data() const {
    PARTRAIN_CHECK(defined(), "raw_data() on an undefined tensor");
    return static_cast<char*>(storage_->data()) + offset_ * dtype_size(dtype_);
  }

  /// The same shape and dtype without the data: defined() is false and data() throws. What the
  /// runtime keeps of a forward value that no backward kernel reads (graph/saved_tensors.h), so
  /// that the backward still knows its shape.
  Tensor shape_only() const;
  /// shape_only() with another dtype: the stand-in of a value whose kernel computes in `dtype`
  /// (Backend::backward widening a bf16 or fp16 op to fp32).
  Tensor shape_only(DType dtype) const;

  /// Same storage, new shape with the same element count (one dimension may be -1: inferred).
  Tensor reshape(const Shape& shape) const;
  /// Rows [begin, end) of dimension 0, sharing storage (used to split a microbatch by sample).
  Tensor slice_rows(std::int64_t begin, std::int64_t end) const;
  /// The same bytes read as `dtype`: a 1-D view sharing the storage, of nbytes() / dtype_size(dtype)
  /// elements (e.g. an f32 buffer reused as twice as many bf16 slots: ZeRO-1's bf16 all-gather).
  /// Throws partrain::Error when the bytes or the start are not a whole number of `dtype` elements.
  Tensor reinterpret(DType dtype) const;
  /// Deep copy on the same device.
  Tensor clone() const;
  /// Sets every element to zero.
  void zero() const;
  /// Host copy of the elements converted to float (any dtype, host tensors only).
  std::vector<float> to_float_vector() const;

 private:
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  DType dtype_ = DType::F32;
  std::int64_t numel_ = 0;
  std::int64_t offset_ = 0;  // in elements
};

}  // namespace partrain
