#pragma once
// Backend: one device's memory and kernels (ggml's idea: the CPU backend is the reference, every
// other backend is tested op by op against it). Kernels are registered per OpType.
#include <array>
#include <span>
#include <string>

#include "core/allocator.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "graph/attributes.h"
#include "graph/op_type.h"

namespace partrain {

class Backend;

/// What a kernel gets besides its tensors.
struct KernelContext {
  const Attributes& attributes;
  Backend& backend;
  /// Training mode: dropout active, batch norm uses batch statistics and updates running stats.
  bool training = true;
  RandomContext random{};
};

/// Forward kernel: reads `inputs`, writes every element of the preallocated `outputs` (their shapes
/// and dtypes come from the op's schema).
using ForwardKernel = void (*)(const KernelContext& context, std::span<const Tensor> inputs,
                               std::span<const Tensor> outputs);
/// Backward kernel (vector-Jacobian product): given the forward inputs and outputs and the gradient
/// of the loss w.r.t. every output (always defined), overwrites every *defined* entry of
/// `input_grads` with the gradient w.r.t. that input. Undefined entries are not needed.
using BackwardKernel = void (*)(const KernelContext& context, std::span<const Tensor> inputs,
                                std::span<const Tensor> outputs, std::span<const Tensor> output_grads,
                                std::span<const Tensor> input_grads);

struct OpKernels {
  ForwardKernel forward = nullptr;
  BackwardKernel backward = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  /// "cpu", "cuda".
  virtual std::string name() const = 0;
  /// Waits for all queued work on this device.
  virtual void synchronise() = 0;
  /// destination = source (same shape and dtype; may cross host/device for GPU backends).
  virtual void copy(const Tensor& destination, const Tensor& source) = 0;
  /// Sets every element of `tensor` to zero.
  virtual void fill_zero(const Tensor& tensor) = 0;
  /// accumulator += value (same shape, floating dtypes): gradient accumulation.
  virtual void accumulate(const Tensor& accumulator, const Tensor& value) = 0;

  CachingAllocator& allocator() const { return allocator_for(device()); }
  Tensor empty(const Shape& shape, DType dtype = DType::F32) const { return Tensor::empty(shape, dtype, device()); }
  Tensor zeros(const Shape& shape, DType dtype = DType::F32) {
    Tensor tensor = empty(shape, dtype);
    fill_zero(tensor);
    return tensor;
  }

  /// Runs an op's forward / backward kernel; throws partrain::Error if this backend has none.
  void forward(OpType type, const KernelContext& context, std::span<const Tensor> inputs,
               std::span<const Tensor> outputs) const;
  void backward(OpType type, const KernelContext& context, std::span<const Tensor> inputs,
                std::span<const Tensor> outputs, std::span<const Tensor> output_grads,
                std::span<const Tensor> input_grads) const;

  /// Installs the kernels of an op (kernels/<backend>/<family> files call this).
  void set_kernels(OpType type, OpKernels kernels) { kernels_[static_cast<std::size_t>(type)] = kernels; }
  const OpKernels& kernels(OpType type) const { return kernels_[static_cast<std::size_t>(type)]; }

 private:
  std::array<OpKernels, kOpTypeCount> kernels_{};
};

}  // namespace partrain
