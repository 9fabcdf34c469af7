#pragma once
// The communicator for tensors on a GPU: NCCL (kernels/cuda/nccl_communicator.h, CUDA builds only),
// reached through this registry so that code compiled without CUDA can choose it.
#include <functional>
#include <memory>

#include "comm/communicator.h"
#include "core/backend.h"

namespace partrain::comm {

struct NcclProvider {
  /// An NCCL communicator over the ranks of `control` (an MPI communicator it keeps for control
  /// data), on the GPU of `backend`. Collective over `control`.
  std::function<std::unique_ptr<Communicator>(std::unique_ptr<Communicator> control, Backend& backend)> make;
  /// Collective over `control`: a message naming two ranks that share one GPU, or "" when every
  /// rank has its own (NCCL needs one GPU per rank).
  std::function<std::string(Communicator& control, Backend& backend)> shared_gpu;
};

/// Installs the NCCL provider (cuda::install()).
void register_nccl(NcclProvider provider);

/// The world communicator for a run on `backend`: nullptr on the CPU (use `world`, MPI), else an
/// NCCL communicator over the ranks of `world` (collective). Throws partrain::Error, on every rank,
/// when ranks share a GPU or the build has no NCCL.
std::unique_ptr<Communicator> make_device_world(Communicator& world, Backend& backend);

}  // namespace partrain::comm
