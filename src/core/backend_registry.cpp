#include "core/backend_registry.h"

#include <memory>

#include "core/error.h"

namespace partrain {

namespace {
std::unique_ptr<GpuBackendProvider>& provider() {
  static std::unique_ptr<GpuBackendProvider> instance;
  return instance;
}
Backend*& cpu_instance() {
  static Backend* instance = nullptr;
  return instance;
}
}  // namespace

void register_cpu_backend(Backend& backend) { cpu_instance() = &backend; }

Backend& registered_cpu_backend() {
  PARTRAIN_CHECK(cpu_instance(), "no CPU backend is installed (main() calls cpu::install())");
  return *cpu_instance();
}

void register_gpu_backend(GpuBackendProvider gpu) { provider() = std::make_unique<GpuBackendProvider>(std::move(gpu)); }

const GpuBackendProvider* gpu_backend() { return provider().get(); }

Backend& select_backend(const std::string& device, int local_rank) {
  PARTRAIN_CHECK(device == "auto" || device == "cpu" || device == "cuda",
                 "[train] device must be \"auto\", \"cpu\" or \"cuda\", got \"" << device << "\"");
  if (device == "cpu") return registered_cpu_backend();
  const GpuBackendProvider* gpu = gpu_backend();
  const int count = gpu ? gpu->device_count() : 0;
  if (count == 0) {
    PARTRAIN_CHECK(device == "auto", "[train] device = \"cuda\", but "
                                         << (gpu ? "no GPU is visible on this node"
                                                 : "this partrain was built without CUDA (build the cuda preset)"));
    return registered_cpu_backend();
  }
  return gpu->backend(local_rank % count);
}

}  // namespace partrain
