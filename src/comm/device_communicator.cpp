#include "comm/device_communicator.h"

#include "core/error.h"

namespace partrain::comm {

namespace {
std::unique_ptr<NcclProvider>& provider() {
  static std::unique_ptr<NcclProvider> instance;
  return instance;
}
}  // namespace

void register_nccl(NcclProvider nccl) { provider() = std::make_unique<NcclProvider>(std::move(nccl)); }

std::unique_ptr<Communicator> make_device_world(Communicator& world, Backend& backend) {
  if (backend.device().is_cpu()) return nullptr;
  const NcclProvider* nccl = provider().get();
  PARTRAIN_CHECK(nccl != nullptr, "GPU tensors need the NCCL communicator, which this build lacks");
  const std::string shared = nccl->shared_gpu(world, backend);
  PARTRAIN_CHECK(shared.empty(), shared << ": NCCL needs one GPU per rank; start at most as many ranks per node as "
                                           "it has GPUs (Slurm: --gpus-per-task=1), or set [train] device = \"cpu\"");
  std::vector<int> everyone(world.global_ranks().begin(), world.global_ranks().end());
  return nccl->make(world.group(everyone), backend);
}

}  // namespace partrain::comm
