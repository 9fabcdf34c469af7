#pragma once
// Error checks for CUDA, cuBLAS, cuDNN and NCCL calls: a failure throws cuda::CudaError (a
// partrain::Error) whose message names the call, the library's error string and the file:line of
// the check (llm.c style).
// The file:line is in the message itself (not only in Error::file()/line()), because the command
// line prints the message alone and a failure on the GPU must be traceable from the job's log;
// CudaBackend's op hook adds the op to a CudaError, the command line adds the rank
// (src/app/mpi_command.cpp).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include <sstream>

#include "core/error.h"

/// " [kernels/cuda/shape.cu:157]": the place of a failed check, for the messages below.
#define PARTRAIN_CUDA_WHERE " [" << __FILE__ << ":" << __LINE__ << "]"

namespace partrain::cuda {

/// A failure reported by the device or its libraries (CUDA, cuBLAS, cuDNN, NCCL), as opposed to a
/// bad argument: CudaBackend's op hook adds the op, the device and the ordering to these only, so
/// that argument errors stay those of the CPU backend.
class CudaError : public Error {
 public:
  using Error::Error;
};

/// cuBLAS / cuBLASLt status name ("CUBLAS_STATUS_NOT_SUPPORTED").
const char* cublas_status_name(cublasStatus_t status);

}  // namespace partrain::cuda

/// PARTRAIN_CHECK that throws cuda::CudaError: for failures of the device or its libraries.
#define PARTRAIN_DEVICE_CHECK(condition, message)                                                   \
  do {                                                                                              \
    if (!(condition)) {                                                                             \
      std::ostringstream partrain_device_check_stream_;                                             \
      partrain_device_check_stream_ << message;                                                     \
      throw ::partrain::cuda::CudaError(__FILE__, __LINE__, partrain_device_check_stream_.str());   \
    }                                                                                               \
  } while (0)

/// Throws cuda::CudaError when a CUDA runtime call fails: PARTRAIN_CUDA_CHECK(cudaMalloc(&p, n)).
#define PARTRAIN_CUDA_CHECK(call)                                                                   \
  do {                                                                                              \
    const cudaError_t partrain_cuda_status_ = (call);                                               \
    PARTRAIN_DEVICE_CHECK(partrain_cuda_status_ == cudaSuccess,                                     \
                   #call << " failed: " << cudaGetErrorName(partrain_cuda_status_) << " ("          \
                         << cudaGetErrorString(partrain_cuda_status_) << ")" << PARTRAIN_CUDA_WHERE); \
  } while (0)

/// Checks the launch of the kernel just queued (bad configuration, missing kernel image).
#define PARTRAIN_CUDA_CHECK_LAUNCH() PARTRAIN_CUDA_CHECK(cudaGetLastError())

#define PARTRAIN_CUBLAS_CHECK(call)                                                                 \
  do {                                                                                              \
    const cublasStatus_t partrain_cublas_status_ = (call);                                          \
    PARTRAIN_DEVICE_CHECK(partrain_cublas_status_ == CUBLAS_STATUS_SUCCESS,                         \
                   #call << " failed: " << ::partrain::cuda::cublas_status_name(partrain_cublas_status_) \
                         << PARTRAIN_CUDA_WHERE);                                                   \
  } while (0)

#define PARTRAIN_CUDNN_CHECK(call)                                                                  \
  do {                                                                                              \
    const cudnnStatus_t partrain_cudnn_status_ = (call);                                            \
    PARTRAIN_DEVICE_CHECK(partrain_cudnn_status_ == CUDNN_STATUS_SUCCESS,                           \
                   #call << " failed: " << cudnnGetErrorString(partrain_cudnn_status_) << PARTRAIN_CUDA_WHERE); \
  } while (0)

#define PARTRAIN_NCCL_CHECK(call)                                                                   \
  do {                                                                                              \
    const ncclResult_t partrain_nccl_status_ = (call);                                              \
    PARTRAIN_DEVICE_CHECK(partrain_nccl_status_ == ncclSuccess,                                     \
                   #call << " failed: " << ncclGetErrorString(partrain_nccl_status_) << PARTRAIN_CUDA_WHERE); \
  } while (0)
