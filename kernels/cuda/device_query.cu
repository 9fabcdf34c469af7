#include "kernels/cuda/device_query.cuh"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

namespace partrain::cuda {

int device_count() {
  int count = 0;
  // Without a driver (CI) this returns cudaErrorInsufficientDriver or cudaErrorNoDevice.
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

std::string library_versions() {
  // The versions of the libraries loaded at run time (not the headers' macros): the GPU machine's
  // pip wheels may differ from what this binary was built against.
  int driver = 0, runtime = 0, nccl = 0, major = 0, minor = 0, patch = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  ncclGetVersion(&nccl);
  cublasGetProperty(MAJOR_VERSION, &major);
  cublasGetProperty(MINOR_VERSION, &minor);
  cublasGetProperty(PATCH_LEVEL, &patch);
  cudaGetLastError();  // without a driver the queries above leave an error behind
  return "driver " + std::to_string(driver) + ", cuda runtime " + std::to_string(runtime) + ", cuBLAS " +
         std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch) + ", cuBLASLt " +
         std::to_string(cublasLtGetVersion()) + ", cuDNN " + std::to_string(cudnnGetVersion()) + ", NCCL " +
         std::to_string(nccl) + " (loaded at run time; built with cuBLAS " + std::to_string(CUBLAS_VERSION) +
         ", cuDNN " + std::to_string(CUDNN_VERSION) + ", NCCL " + std::to_string(NCCL_VERSION_CODE) + ")";
}

}  // namespace partrain::cuda
