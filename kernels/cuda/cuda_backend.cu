#include "kernels/cuda/cuda_backend.cuh"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/device_timer.cuh"
#include "kernels/cuda/optimizer.cuh"

namespace partrain::cuda {

const char* cublas_status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "unknown cuBLAS status";
  }
}

// ---------------- device memory ----------------

void* DeviceMemory::allocate(std::size_t bytes) {
  PARTRAIN_CUDA_CHECK(cudaSetDevice(device_index_));
  void* pointer = nullptr;
  const cudaError_t status = cudaMalloc(&pointer, bytes);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free out-of-memory error
    std::size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    PARTRAIN_FAIL("cuda:" << device_index_ << " out of memory allocating " << bytes << " bytes ("
                          << cudaGetErrorString(status) << "; " << free_bytes << " of " << total_bytes
                          << " bytes free)");
  }
  return pointer;
}

void DeviceMemory::release(void* pointer, std::size_t) {
  // The caching allocator releases only when emptying its cache or at exit: wait for kernels that
  // may still use the block (cudaFree synchronises the device itself).
  cudaFree(pointer);
}

// ---------------- backend ----------------

CudaBackend::CudaBackend(int device_index)
    : device_index_(device_index), ordering_(cuda_ordering_from_environment()) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  PARTRAIN_CHECK(status == cudaSuccess && device_index >= 0 && device_index < count,
                 "CUDA device " << device_index << " does not exist ("
                                << (status == cudaSuccess ? std::to_string(count) + " GPU(s) visible"
                                                          : std::string(cudaGetErrorString(status)))
                                << ")");
  PARTRAIN_CUDA_CHECK(cudaSetDevice(device_index));
  cudaDeviceProp properties{};
  PARTRAIN_CUDA_CHECK(cudaGetDeviceProperties(&properties, device_index));
  device_name_ = properties.name;
  register_allocator(device(), std::make_unique<CachingAllocator>(device(), std::make_unique<DeviceMemory>(device_index)));
  PARTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  communication_stream_ = stream_;
  if (ordering_ == CudaOrdering::Overlap) {
    PARTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&own_communication_stream_, cudaStreamNonBlocking));
    communication_stream_ = own_communication_stream_;
  }
  device_errors_ = std::make_unique<DeviceErrorFlags>(stream_);
  PARTRAIN_CUBLAS_CHECK(cublasCreate(&cublas_));
  PARTRAIN_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
  // fp32 GEMMs stay IEEE fp32 (no TF32) so that they match the CPU reference; bf16 GEMMs take
  // bf16 inputs with fp32 accumulation through the compute type given per call.
  PARTRAIN_CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
  PARTRAIN_CUBLAS_CHECK(cublasLtCreate(&cublas_lt_));
  PARTRAIN_CUDNN_CHECK(cudnnCreate(&cudnn_));
  PARTRAIN_CUDNN_CHECK(cudnnSetStream(cudnn_, stream_));
  PARTRAIN_CUDA_CHECK(cudaMalloc(&cublas_workspace_, kCublasWorkspaceBytes));
  PARTRAIN_CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_workspace_, kCublasWorkspaceBytes));
  register_cuda_gemm_kernels(*this);
  register_cuda_elementwise_kernels(*this);
  register_cuda_normalization_kernels(*this);
  register_cuda_softmax_kernels(*this);
  register_cuda_attention_kernels(*this);
  register_cuda_shape_kernels(*this);
  register_cuda_convolution_kernels(*this);
  register_cuda_tensor_parallel_kernels(*this);
}

CudaBackend::~CudaBackend() {
  // Process-wide backends are never destroyed (like cpu_backend()); this runs only for backends a
  // caller owns. Errors are ignored: a destructor cannot report them.
  cudaStreamSynchronize(stream_);
  device_errors_.reset();
  if (own_communication_stream_) cudaStreamDestroy(own_communication_stream_);
  if (cublas_workspace_) cudaFree(cublas_workspace_);
  if (flush_buffer_) cudaFree(flush_buffer_);
  if (cudnn_) cudnnDestroy(cudnn_);
  if (cublas_lt_) cublasLtDestroy(cublas_lt_);
  if (cublas_) cublasDestroy(cublas_);
  if (stream_) cudaStreamDestroy(stream_);
}

void CudaBackend::synchronise() {
  PARTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (communication_stream_ != stream_) PARTRAIN_CUDA_CHECK(cudaStreamSynchronize(communication_stream_));
  check_device_errors();
}

void CudaBackend::check_device_errors() { device_errors_->report(); }

std::unique_ptr<DeviceTimer> CudaBackend::make_device_timer() { return make_cuda_device_timer(stream_, device_index_); }

double CudaBackend::device_memory_bytes() const {
  std::size_t free_bytes = 0, total_bytes = 0;
  PARTRAIN_CUDA_CHECK(cudaSetDevice(device_index_));
  PARTRAIN_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return static_cast<double>(total_bytes);
}

double CudaBackend::flushed_cache_bytes() const {
  int l2_bytes = 0;
  PARTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device_index_));
  return static_cast<double>(l2_bytes);
}

void CudaBackend::flush_caches() {
  if (!flush_buffer_) {
    flush_bytes_ = 2 * static_cast<std::size_t>(std::max(flushed_cache_bytes(), double{1 << 20}));
    PARTRAIN_CUDA_CHECK(cudaMalloc(&flush_buffer_, flush_bytes_));
  }
  PARTRAIN_CUDA_CHECK(cudaMemsetAsync(flush_buffer_, ++flush_value_, flush_bytes_, stream_));
}

void CudaBackend::set_ordering(CudaOrdering ordering) {
  synchronise();  // nothing queued under the old ordering is left to order
  if (ordering == CudaOrdering::Overlap && own_communication_stream_ == nullptr)
    PARTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&own_communication_stream_, cudaStreamNonBlocking));
  communication_stream_ = ordering == CudaOrdering::Overlap ? own_communication_stream_ : stream_;
  ordering_ = ordering;
}

void CudaBackend::run_kernel(OpType type, const char* direction, const std::function<void()>& kernel) const {
  try {
    kernel();
    if (ordering_ == CudaOrdering::Plain) {
      PARTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_));
      device_errors_->report();
    }
  } catch (const CudaError& error) {
    // A CUDA error may surface at a later op than the one that caused it under overlap ordering
    // (kernels run asynchronously): the op named here is where it was seen. Argument errors (a
    // plain Error) pass unchanged: they are the CPU backend's, and name the op already.
    throw CudaError(error.file(), error.line(),
                error.message() + " (in " + std::string(op_name(type)) + " " + direction + " on cuda:" +
                    std::to_string(device_index_) + ", " + cuda_ordering_name(ordering_) + " ordering)");
  }
}

void CudaBackend::copy(const Tensor& destination, const Tensor& source) {
  PARTRAIN_CHECK(destination.numel() == source.numel() && destination.dtype() == source.dtype(),
                 "copy " << shape_string(source.shape()) << " " << dtype_name(source.dtype()) << " into "
                         << shape_string(destination.shape()) << " " << dtype_name(destination.dtype()));
  for (const Tensor* t : {&destination, &source})
    PARTRAIN_CHECK(t->device().is_cpu() || t->device() == device(),
                   "cuda:" << device_index_ << " backend cannot copy a tensor on " << t->device().to_string());
  if (source.nbytes() == 0) return;
  PARTRAIN_CUDA_CHECK(cudaMemcpyAsync(destination.raw_data(), source.raw_data(), source.nbytes(), cudaMemcpyDefault, stream_));
  // Host memory is pageable: a host source may be freed or changed after return, and a host
  // destination is read right after, so copies touching the host complete before returning.
  // Only the compute stream is waited for: device checks are reported once a step, not here.
  if (destination.device().is_cpu() || source.device().is_cpu()) PARTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::fill_zero(const Tensor& tensor) {
  if (tensor.device().is_cpu()) return tensor.zero();
  PARTRAIN_CUDA_CHECK(cudaMemsetAsync(tensor.raw_data(), 0, tensor.nbytes(), stream_));
}

void CudaBackend::accumulate(const Tensor& accumulator, const Tensor& value) {
  PARTRAIN_CHECK(accumulator.shape() == value.shape(),
                 "accumulate " << shape_string(value.shape()) << " into " << shape_string(accumulator.shape()));
  launch_accumulate(stream_, accumulator, value);
}

void CudaBackend::convert(const Tensor& destination, const Tensor& source) {
  if (destination.dtype() == source.dtype()) return copy(destination, source);
  launch_convert(stream_, destination, source);
}

double CudaBackend::sum_of_squares(std::span<const Tensor> tensors, std::span<const double> weights) {
  return cuda::sum_of_squares(stream_, tensors, weights, empty({1}, DType::I64));
}

void CudaBackend::scale(const Tensor& tensor, double factor) { launch_scale(stream_, tensor, static_cast<float>(factor)); }

void CudaBackend::adamw_update(const Tensor& parameter, const Tensor& gradient, const Tensor& exp_avg,
                               const Tensor& exp_avg_sq, const AdamWUpdate& update) {
  launch_adamw_update(stream_, parameter, gradient, exp_avg, exp_avg_sq, update);
}

void CudaBackend::sgd_update(const Tensor& parameter, const Tensor& gradient, const Tensor& momentum_buffer,
                             const SgdUpdate& update) {
  launch_sgd_update(stream_, parameter, gradient, momentum_buffer, update);
}

Tensor CudaBackend::scratch(std::size_t bytes) const {
  return empty({static_cast<std::int64_t>((bytes + 7) / 8)}, DType::I64);
}

CudaBackend& cuda_backend(int device_index) {
  static std::mutex mutex;
  static std::map<int, CudaBackend*> backends;  // never destroyed: used until exit, like cpu_backend()
  std::lock_guard lock(mutex);
  auto it = backends.find(device_index);
  if (it == backends.end()) it = backends.emplace(device_index, new CudaBackend(device_index)).first;
  return *it->second;
}

}  // namespace partrain::cuda
