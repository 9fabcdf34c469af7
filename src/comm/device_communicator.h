#pragma once
// The communicator for tensors on a GPU: NCCL (kernels/cuda/nccl_communicator.h, CUDA builds only),
// reached through this registry so that code compiled without CUDA can choose it, or, when ranks
// share a GPU (which NCCL refuses), device tensors staged through host memory over MPI
// (comm/host_staged_communicator.h).
//
// Environment (read by make_device_world and make_nccl_communicator on every rank; docs/gpus.md):
//   PARTRAIN_DEVICE_COMMUNICATOR = auto | nccl | host   (default auto) which communicator carries
//     device tensors: auto picks NCCL when every rank has its own GPU, else host staging; nccl
//     insists on NCCL (an error when ranks share a GPU); host always stages through host memory.
//   PARTRAIN_NCCL_TIMEOUT_SECONDS = seconds (default 600; 0 = no limit) how long the NCCL
//     communicator waits for one operation before it declares the communicator hung.
#include <chrono>
#include <functional>
#include <memory>
#include <string>

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

/// Which communicator carries device tensors (PARTRAIN_DEVICE_COMMUNICATOR).
enum class DeviceCommunicatorChoice { Auto, Nccl, Host };

/// The name of the environment variable that chooses the device communicator.
inline constexpr const char* kDeviceCommunicatorVariable = "PARTRAIN_DEVICE_COMMUNICATOR";
/// The name of the environment variable that sets the NCCL timeout in seconds.
inline constexpr const char* kNcclTimeoutVariable = "PARTRAIN_NCCL_TIMEOUT_SECONDS";

/// PARTRAIN_DEVICE_COMMUNICATOR: "auto" (also when unset or empty), "nccl" or "host". Throws
/// partrain::Error naming the variable for any other value.
DeviceCommunicatorChoice device_communicator_from_environment();

/// PARTRAIN_NCCL_TIMEOUT_SECONDS as a duration (a non-negative number of seconds, fractions allowed;
/// 0 = no limit), or `fallback` when unset or empty. Throws partrain::Error naming the variable for
/// anything else.
std::chrono::milliseconds nccl_timeout_from_environment(std::chrono::milliseconds fallback);

/// The world communicator for a run on `backend` (collective over `world`): nullptr on the CPU (use
/// `world`, MPI); on a GPU, by PARTRAIN_DEVICE_COMMUNICATOR, an NCCL communicator over the ranks of
/// `world`, or a HostStagedCommunicator over a copy of `world` when ranks share a GPU, the build has
/// no NCCL, or "host" asks for it (rank 0 then prints one line saying why). Throws partrain::Error,
/// on every rank, for a bad PARTRAIN_DEVICE_COMMUNICATOR (also on the CPU) and for "nccl" when
/// ranks share a GPU or the build has no NCCL.
std::unique_ptr<Communicator> make_device_world(Communicator& world, Backend& backend);

}  // namespace partrain::comm
