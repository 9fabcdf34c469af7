#pragma once
// The CUDA backend (docs/gpus.md, docs/architecture.md §Kernels): one GPU, one compute stream,
// cuBLAS/cuBLASLt/cuDNN handles bound to that stream, device memory from a CachingAllocator over
// cudaMalloc with peak tracking. Every kernel of an op family lives in kernels/cuda/<family>.cu (ggml
// style) and is tested against the CPU backend op by op (ctest/cuda/test_cuda_ops.cpp).
//
// Ordering (core/cuda_ordering.h, PARTRAIN_CUDA_ORDERING): every kernel and copy of this backend
// goes to stream(), so a block freed to the caching allocator on the host can be reused by the next
// kernel without a device sync (the stream orders the uses), like PyTorch's allocator on a single
// stream. Under `overlap` (the default) NCCL runs on communication_stream(), ordered against
// stream() by CUDA events in both directions (kernels/cuda/nccl_communicator.h), and index checks
// report through device_errors() once a step. Under `plain` communication_stream() is stream(), and
// the backend waits for the device after every op (and reports its index checks there).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <memory>
#include <string>

#include "core/backend.h"
#include "core/cuda_ordering.h"
#include "kernels/cuda/device_errors.cuh"

namespace partrain::cuda {

/// Device memory for the caching allocator (cudaMalloc / cudaFree on one device). Out of memory
/// throws partrain::Error naming the device, the request and the free/total memory.
class DeviceMemory final : public RawMemory {
 public:
  explicit DeviceMemory(int device_index) : device_index_(device_index) {}
  void* allocate(std::size_t bytes) override;
  void release(void* pointer, std::size_t bytes) override;

 private:
  int device_index_;
};

class CudaBackend final : public Backend {
 public:
  /// Binds GPU `device_index`, creates its stream, handles and allocator, installs every kernel.
  /// Throws partrain::Error when the device does not exist.
  explicit CudaBackend(int device_index);
  ~CudaBackend() override;

  Device device() const override { return Device{DeviceType::CUDA, device_index_}; }
  std::string name() const override { return "cuda"; }
  /// Waits for the compute and communication streams, then reports pending device checks
  /// (check_device_errors).
  void synchronise() override;
  void check_device_errors() override;
  /// Copies between any two of host and this device (same element count and dtype). A copy to
  /// the host waits for it to complete, so the host data can be read on return.
  void copy(const Tensor& destination, const Tensor& source) override;
  void fill_zero(const Tensor& tensor) override;
  /// accumulator (f32 or bf16) += value (f32 or bf16), fp32 arithmetic.
  void accumulate(const Tensor& accumulator, const Tensor& value) override;
  void convert(const Tensor& destination, const Tensor& source) override;
  double sum_of_squares(std::span<const Tensor> tensors, std::span<const double> weights) override;
  void scale(const Tensor& tensor, double factor) override;
  void adamw_update(const Tensor& parameter, const Tensor& gradient, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                    const AdamWUpdate& update) override;
  void sgd_update(const Tensor& parameter, const Tensor& gradient, const Tensor& momentum_buffer,
                  const SgdUpdate& update) override;
  bool supports_bf16() const override { return true; }
  /// CUDA events on stream() (kernels/cuda/device_timer.cuh).
  std::unique_ptr<DeviceTimer> make_device_timer() override;
  /// The GPU's total memory (cudaMemGetInfo).
  double device_memory_bytes() const override;
  /// Writes a device buffer of twice the L2 (cudaDevAttrL2CacheSize) on stream(), as Triton's
  /// do_bench does before each timed run.
  void flush_caches() override;
  /// cudaDevAttrL2CacheSize.
  double flushed_cache_bytes() const override;

  /// "NVIDIA H100 80GB HBM3" (cudaDeviceProp::name).
  const std::string& device_name() const { return device_name_; }
  /// The compute stream: every kernel and copy of this backend.
  cudaStream_t stream() const { return stream_; }
  /// Where NCCL runs: a stream of its own under overlap ordering, stream() under plain.
  cudaStream_t communication_stream() const { return communication_stream_; }
  CudaOrdering ordering() const { return ordering_; }
  /// Switches the ordering after waiting for the device (synchronise, which may throw a pending
  /// device check): for tests that compare the orderings in one process. A run keeps the one it
  /// started with (cuda_ordering_from_environment); requests started before the switch must be
  /// complete.
  void set_ordering(CudaOrdering ordering);
  /// The device-side index checks of the kernels (kernels/cuda/device_errors.cuh).
  DeviceErrorFlags& device_errors() const { return *device_errors_; }
  cublasHandle_t cublas() const { return cublas_; }
  cublasLtHandle_t cublas_lt() const { return cublas_lt_; }
  cudnnHandle_t cudnn() const { return cudnn_; }
  /// A device workspace for cuBLASLt (kCublasWorkspaceBytes bytes, allocated once).
  void* cublas_workspace() const { return cublas_workspace_; }
  static constexpr std::size_t kCublasWorkspaceBytes = 32u << 20;
  /// A temporary device buffer (cuDNN workspaces, casts); released to the cache when the tensor dies.
  Tensor scratch(std::size_t bytes) const;

 protected:
  /// Adds " (in <op> <direction> on cuda:N, <ordering> ordering)" to a kernel's CudaError (not to
  /// argument errors, which are the CPU backend's); under plain ordering waits for the device after
  /// the op and reports its index checks, so that a failure shows at the op that caused it.
  void run_kernel(OpType type, const char* direction, const std::function<void()>& kernel) const override;

 private:
  int device_index_;
  std::string device_name_;
  CudaOrdering ordering_;
  cudaStream_t stream_ = nullptr;
  cudaStream_t communication_stream_ = nullptr;      // own_communication_stream_ or stream_
  cudaStream_t own_communication_stream_ = nullptr;  // created for overlap ordering
  std::unique_ptr<DeviceErrorFlags> device_errors_;
  cublasHandle_t cublas_ = nullptr;
  cublasLtHandle_t cublas_lt_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  void* cublas_workspace_ = nullptr;
  void* flush_buffer_ = nullptr;  // flush_caches' (cudaMalloc'd when first asked, not the allocator's)
  std::size_t flush_bytes_ = 0;
  unsigned char flush_value_ = 0;
};

/// The process-wide backend of GPU `device_index`, created on first use (also registers its
/// allocator). Throws partrain::Error when there is no such GPU.
CudaBackend& cuda_backend(int device_index = 0);

/// The CudaBackend a kernel runs on (the context's backend must be one).
inline CudaBackend& cuda_of(const KernelContext& context) { return static_cast<CudaBackend&>(context.backend); }

/// Makes the CUDA backend and the NCCL communicator selectable by name from code compiled without
/// CUDA (core/backend_registry.h, comm/device_communicator.h). Called once by main() in CUDA builds.
void install();

// Each kernels/cuda/<family>.cu installs its kernels (called once by the CudaBackend constructor).
void register_cuda_gemm_kernels(Backend& backend);
void register_cuda_elementwise_kernels(Backend& backend);
void register_cuda_normalization_kernels(Backend& backend);
void register_cuda_softmax_kernels(Backend& backend);
void register_cuda_attention_kernels(Backend& backend);
void register_cuda_shape_kernels(Backend& backend);
void register_cuda_convolution_kernels(Backend& backend);
void register_cuda_tensor_parallel_kernels(Backend& backend);

}  // namespace partrain::cuda
