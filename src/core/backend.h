#pragma once
// Backend: one device's memory and kernels (ggml's idea: the CPU backend is the reference, every
// other backend is tested op by op against it). Kernels are registered per OpType.
#include <array>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "core/allocator.h"
#include "core/rng.h"
#include "core/tensor_parallel_group.h"
#include "core/tensor.h"
#include "core/attributes.h"
#include "core/device_timer.h"
#include "core/op_type.h"

namespace partrain {

class Backend;

/// What a kernel gets besides its tensors.
struct KernelContext {
  const Attributes& attributes;
  Backend& backend;
  /// Training mode: dropout active, batch norm uses batch statistics and updates running stats.
  bool training = true;
  RandomContext random{};
  /// The tensor-parallel group of the rank (tensor-parallel graphs only; nullptr otherwise).
  TensorParallelGroup* tensor_parallel = nullptr;
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

/// The per-element constants of one torch.optim.AdamW update, computed on the host by the
/// optimizer (runtime/optimizer.h): with g = gradient·grad_scale,
///   p ← p·keep;  m ← m + one_minus_beta1·(g − m);  v ← v·beta2 + one_minus_beta2·g²;
///   p ← p − step_size · m / (√v / bias_correction2_sqrt + eps).
struct AdamWUpdate {
  float keep = 1, one_minus_beta1 = 0, beta2 = 0, one_minus_beta2 = 0, step_size = 0, bias_correction2_sqrt = 1,
        eps = 0, grad_scale = 1;
};

/// The constants of one torch.optim.SGD update: d = g·grad_scale + decay·p; with a momentum buffer
/// buf ← d (first update) or buf·momentum + d, d ← buf; then p ← p − rate·d.
struct SgdUpdate {
  float decay = 0, rate = 0, momentum = 0, grad_scale = 1;
  bool first = false;
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
  /// accumulator += value (same shape; f32, bf16 or f16 each, summed in fp32): gradient accumulation,
  /// including 16-bit parameter gradients into f32 master gradients under mixed precision.
  virtual void accumulate(const Tensor& accumulator, const Tensor& value) = 0;
  /// destination = source converted between f32 and bf16 or f16 (round to nearest even), same shape
  /// and device; equal dtypes copy.
  virtual void convert(const Tensor& destination, const Tensor& source) = 0;
  /// Σᵢ weights[i] · Σ x² over the elements of tensors[i] (float tensors; undefined ones skipped),
  /// accumulated in double: a rank's share of the squared global gradient norm. One device
  /// synchronisation for the whole list on a GPU. Throws partrain::Error when the sizes differ.
  virtual double sum_of_squares(std::span<const Tensor> tensors, std::span<const double> weights) = 0;
  /// tensor ← tensor · factor (float tensors).
  virtual void scale(const Tensor& tensor, double factor) = 0;
  /// One AdamW update of an f32 parameter from its f32 gradient and f32 state (all same shape).
  virtual void adamw_update(const Tensor& parameter, const Tensor& gradient, const Tensor& exp_avg,
                            const Tensor& exp_avg_sq, const AdamWUpdate& update) = 0;
  /// One SGD update; `momentum_buffer` is undefined when momentum is 0.
  virtual void sgd_update(const Tensor& parameter, const Tensor& gradient, const Tensor& momentum_buffer,
                          const SgdUpdate& update) = 0;
  /// Raises the first error a kernel flagged on the device since the last call (an index or label
  /// out of range, checked without waiting for the device) as a partrain::Error naming the op, the
  /// bad value and the limit; clears the flags. Waits for the device when checks are pending. The
  /// runtime calls it once a step, where the loss reaches the host. A no-op on backends whose
  /// kernels check on the host (CPU).
  virtual void check_device_errors() {}
  /// Evicts the device's caches of kernel data (the CPU's last-level cache, a GPU's L2) by writing a
  /// buffer twice their size, so that the next kernels read their operands from memory, as a layer
  /// inside a stage does whose working set exceeds the cache. The profiler calls it before every
  /// pass it times (ProfilerOptions::flush_caches), as Triton's do_bench flushes the L2. The buffer
  /// is not the allocator's (no peak moves). A no-op on backends without such a cache.
  virtual void flush_caches() {}
  /// Evicts only the caches private to each core (a CPU's L2), leaving the shared last-level cache:
  /// the state of a stage whose data fits the last-level cache but not a core's own (it was touched
  /// a stage pass ago). A no-op where the last level is the only one that matters (a GPU's L2).
  virtual void flush_private_caches() {}
  /// Bytes of the cache flush_caches evicts (the CPU's last-level cache, shared by the ranks of a
  /// node; a GPU's L2); 0 where there is none.
  virtual double flushed_cache_bytes() const { return 0; }
  /// True when the kernels read and write bf16 tensors themselves. Otherwise forward()/backward()
  /// run them in fp32 on converted copies and round the results to bf16 (the CPU reference of
  /// "bf16 storage, fp32 compute").
  virtual bool supports_bf16() const { return false; }
  /// The same for f16 (IEEE half): kernels that read and write it themselves, or fp32 compute on
  /// widened copies rounded back to f16 once per op.
  virtual bool supports_f16() const { return false; }
  /// A timer of this device's queued work (core/device_timer.h), or nullptr where the host's clock
  /// already times the work because kernels run as they are called (the CPU).
  virtual std::unique_ptr<DeviceTimer> make_device_timer() { return nullptr; }
  /// Bytes of memory of the device (a GPU's total, cudaMemGetInfo), what a plan for it may fill;
  /// 0 where the planner's [parallel] device_memory stands for it (the CPU: a simulated device).
  virtual double device_memory_bytes() const { return 0; }

  CachingAllocator& allocator() const { return allocator_for(device()); }
  Tensor empty(const Shape& shape, DType dtype = DType::F32) const { return Tensor::empty(shape, dtype, device()); }
  Tensor zeros(const Shape& shape, DType dtype = DType::F32) {
    Tensor tensor = empty(shape, dtype);
    fill_zero(tensor);
    return tensor;
  }

  /// Runs an op's forward / backward kernel; throws partrain::Error if this backend has none. bf16
  /// tensors on a backend without supports_bf16() are converted as described there.
  void forward(OpType type, const KernelContext& context, std::span<const Tensor> inputs,
               std::span<const Tensor> outputs) const;
  void backward(OpType type, const KernelContext& context, std::span<const Tensor> inputs,
                std::span<const Tensor> outputs, std::span<const Tensor> output_grads,
                std::span<const Tensor> input_grads) const;

  /// Installs the kernels of an op (kernels/<backend>/<family> files call this).
  void set_kernels(OpType type, OpKernels kernels) { kernels_[static_cast<std::size_t>(type)] = kernels; }
  const OpKernels& kernels(OpType type) const { return kernels_[static_cast<std::size_t>(type)]; }

 protected:
  /// Runs one op's kernel (`direction`: "forward" or "backward") for forward()/backward(): the
  /// place where a device backend names the op in a kernel's error and, under plain ordering, waits
  /// for the device after every op. The CPU backend runs the kernel as it is.
  virtual void run_kernel(OpType type, const char* direction, const std::function<void()>& kernel) const;

 private:
  std::array<OpKernels, kOpTypeCount> kernels_{};
};

/// `tensor` on `backend`'s device: the same handle when it is already there, else a copy.
Tensor to_backend(const Tensor& tensor, Backend& backend);
/// A host copy of `tensor` (the same handle when it is on the host already).
Tensor to_host(const Tensor& tensor, Backend& backend);
/// `tensor` (on `backend`'s device) in `dtype`: the same handle when it has that dtype already,
/// else a converted copy (f32 <-> bf16 or f16).
Tensor to_dtype(const Tensor& tensor, DType dtype, Backend& backend);

}  // namespace partrain
