#include "comm/device_communicator.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm/host_staged_communicator.h"
#include "core/error.h"

namespace partrain::comm {

namespace {
std::unique_ptr<NcclProvider>& provider() {
  static std::unique_ptr<NcclProvider> instance;
  return instance;
}

std::string environment(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::string(value) : std::string();
}

/// The host-staged world, announced on rank 0 with `reason`.
std::unique_ptr<Communicator> host_staged_world(Communicator& world, Backend& backend, const std::string& reason) {
  std::vector<int> everyone(world.global_ranks().begin(), world.global_ranks().end());
  std::unique_ptr<Communicator> host = world.group(everyone);
  if (world.rank() == 0) {
    std::printf("%s: collectives staged through host memory over MPI (slower than NCCL)\n", reason.c_str());
    std::fflush(stdout);
  }
  return std::make_unique<HostStagedCommunicator>(std::move(host), backend);
}
}  // namespace

void register_nccl(NcclProvider nccl) { provider() = std::make_unique<NcclProvider>(std::move(nccl)); }

DeviceCommunicatorChoice device_communicator_from_environment() {
  const std::string value = environment(kDeviceCommunicatorVariable);
  if (value.empty() || value == "auto") return DeviceCommunicatorChoice::Auto;
  if (value == "nccl") return DeviceCommunicatorChoice::Nccl;
  if (value == "host") return DeviceCommunicatorChoice::Host;
  PARTRAIN_FAIL("environment variable " << kDeviceCommunicatorVariable << "=\"" << value
                                        << "\": expected \"auto\", \"nccl\" or \"host\"");
}

std::chrono::milliseconds nccl_timeout_from_environment(std::chrono::milliseconds fallback) {
  const std::string value = environment(kNcclTimeoutVariable);
  if (value.empty()) return fallback;
  double seconds = -1;
  std::size_t used = 0;
  try {
    seconds = std::stod(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  // A day bounds it so that the milliseconds fit easily; nobody waits longer for one collective.
  PARTRAIN_CHECK(used == value.size() && std::isfinite(seconds) && seconds >= 0 && seconds <= 86400,
                 "environment variable " << kNcclTimeoutVariable << "=\"" << value
                                         << "\": expected a number of seconds in [0, 86400] (0 = no limit)");
  return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(seconds * 1000)));
}

std::unique_ptr<Communicator> make_device_world(Communicator& world, Backend& backend) {
  const DeviceCommunicatorChoice choice = device_communicator_from_environment();
  if (backend.device().is_cpu()) return nullptr;
  if (choice == DeviceCommunicatorChoice::Host)
    return host_staged_world(world, backend, std::string(kDeviceCommunicatorVariable) + "=host");
  const NcclProvider* nccl = provider().get();
  if (nccl == nullptr) {
    PARTRAIN_CHECK(choice == DeviceCommunicatorChoice::Auto,
                   kDeviceCommunicatorVariable << "=nccl, but this build has no NCCL communicator");
    return host_staged_world(world, backend, "this build has no NCCL");
  }
  const std::string shared = nccl->shared_gpu(world, backend);
  if (!shared.empty()) {
    PARTRAIN_CHECK(choice == DeviceCommunicatorChoice::Auto,
                   shared << ": NCCL needs one GPU per rank, and " << kDeviceCommunicatorVariable
                          << "=nccl insists on it; start at most as many ranks per node as it has GPUs (Slurm: "
                             "--gpus-per-task=1), or unset the variable to stage through host memory");
    return host_staged_world(world, backend, shared);
  }
  std::vector<int> everyone(world.global_ranks().begin(), world.global_ranks().end());
  return nccl->make(world.group(everyone), backend);
}

}  // namespace partrain::comm
