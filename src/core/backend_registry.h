#pragma once
// How code outside kernels/ (the app, the runtime) reaches the backends without including them:
// main() calls cpu::install(), which registers the CPU backend here, and in a CUDA build
// cuda::install(), which registers the GPU provider; a CPU build has none.
#include <functional>
#include <string>

#include "core/backend.h"

namespace partrain {

/// The GPU backend of a CUDA build.
struct GpuBackendProvider {
  /// Number of usable GPUs on this node (0 without a GPU or driver; never throws).
  std::function<int()> device_count;
  /// The process-wide backend of GPU `index`, created on first use (throws partrain::Error).
  std::function<Backend&(int index)> backend;
  /// The GPU's product name ("NVIDIA H100 80GB HBM3").
  std::function<std::string(int index)> device_name;
};

/// Installs the CPU backend (cpu::install()).
void register_cpu_backend(Backend& backend);
/// The installed CPU backend; throws partrain::Error when none was installed.
Backend& registered_cpu_backend();

/// Installs the GPU backend provider (cuda::install()).
void register_gpu_backend(GpuBackendProvider provider);
/// The provider, or nullptr in a build without CUDA.
const GpuBackendProvider* gpu_backend();

/// The backend a run uses for `[train] device` ("auto", "cpu" or "cuda"): "auto" is the GPU when
/// the build has the CUDA backend and a GPU is visible, else the CPU. On a GPU, rank `local_rank`
/// of a node uses GPU local_rank % device count. Throws partrain::Error for "cuda" in a build
/// without CUDA or on a node without a GPU.
Backend& select_backend(const std::string& device, int local_rank);

}  // namespace partrain
