// cuda::install(): makes the CUDA backend and the NCCL communicator reachable from code compiled
// without CUDA (core/backend_registry.h, comm/device_communicator.h).
#include "comm/device_communicator.h"
#include "core/backend_registry.h"
#include "kernels/cuda/cuda_backend.cuh"
#include "kernels/cuda/device_query.cuh"
#include "kernels/cuda/nccl_communicator.h"

namespace partrain::cuda {

namespace {
CudaBackend& as_cuda(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  PARTRAIN_CHECK(cuda != nullptr, "NCCL needs the CUDA backend, got the " << backend.name() << " backend");
  return *cuda;
}
}  // namespace

void install() {
  register_gpu_backend(GpuBackendProvider{
      [] { return device_count(); },
      [](int index) -> Backend& { return cuda_backend(index); },
      [](int index) { return cuda_backend(index).device_name(); },
  });
  comm::register_nccl(comm::NcclProvider{
      [](std::unique_ptr<comm::Communicator> control, Backend& backend) {
        return comm::make_nccl_communicator(std::move(control), backend);
      },
      [](comm::Communicator& control, Backend& backend) {
        return comm::shared_gpu_description(control, as_cuda(backend));
      },
  });
}

}  // namespace partrain::cuda
