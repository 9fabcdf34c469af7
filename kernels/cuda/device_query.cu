#include "kernels/cuda/device_query.cuh"

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
  int runtime = 0, nccl = 0;
  cudaRuntimeGetVersion(&runtime);
  ncclGetVersion(&nccl);
  return "cuda runtime " + std::to_string(runtime) + ", cuBLAS " + std::to_string(CUBLAS_VERSION) + ", cuDNN " +
         std::to_string(cudnnGetVersion()) + ", NCCL " + std::to_string(nccl);
}

}  // namespace partrain::cuda
