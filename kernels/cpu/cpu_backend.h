#pragma once
// The CPU backend: OpenMP loops + OpenBLAS GEMM (+ oneDNN convolutions where built and faster). It is the reference every other backend is tested
// against, so kernels favour clarity and fp32 accuracy (float accumulators are double where a
// reduction is long).
#include <cstddef>
#include <vector>

#include "core/backend.h"

namespace partrain {

/// Bytes of the largest data cache of this CPU (/sys/devices/system/cpu/cpu0/cache, else sysconf),
/// or 32 MiB when neither says.
std::size_t last_level_cache_bytes();
/// Bytes of the largest data cache of cpu0 that no other core shares (its L2, usually; /sys's
/// shared_cpu_list), or 1 MiB when /sys does not say.
std::size_t private_cache_bytes();

class CpuBackend final : public Backend {
 public:
  CpuBackend();
  Device device() const override { return cpu_device(); }
  std::string name() const override { return "cpu"; }
  void synchronise() override {}
  void copy(const Tensor& destination, const Tensor& source) override;
  void fill_zero(const Tensor& tensor) override;
  void accumulate(const Tensor& accumulator, const Tensor& value) override;
  void convert(const Tensor& destination, const Tensor& source) override;
  double sum_of_squares(std::span<const Tensor> tensors, std::span<const double> weights) override;
  void scale(const Tensor& tensor, double factor) override;
  void adamw_update(const Tensor& parameter, const Tensor& gradient, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                    const AdamWUpdate& update) override;
  void sgd_update(const Tensor& parameter, const Tensor& gradient, const Tensor& momentum_buffer,
                  const SgdUpdate& update) override;
  /// Writes a host buffer of twice the last-level cache (last_level_cache_bytes) from every OpenMP
  /// thread of the caller, so each core's private caches are overwritten too.
  void flush_caches() override;
  double flushed_cache_bytes() const override { return static_cast<double>(last_level_cache_bytes()); }
  /// Writes twice a core's private cache (private_cache_bytes) from every OpenMP thread of the caller.
  void flush_private_caches() override;

 private:
  std::vector<unsigned char> flush_buffer_;
  std::vector<unsigned char> private_flush_buffer_;  // flush_private_caches': one part per thread
  unsigned char flush_value_ = 0;
};

/// The process-wide CPU backend.
CpuBackend& cpu_backend();

namespace cpu {
/// Registers cpu_backend() with core/backend_registry so that select_backend can return it (main()
/// calls this, as a CUDA build calls cuda::install()).
void install();
}  // namespace cpu

/// Installs every CPU kernel family below on `backend` (the CpuBackend constructor; test backends
/// that wrap the CPU's host operations).
void register_cpu_kernels(Backend& backend);

// Each kernels/cpu/<family>.cpp installs its kernels (called once by the CpuBackend constructor).
void register_cpu_gemm_kernels(Backend& backend);
void register_cpu_elementwise_kernels(Backend& backend);
void register_cpu_normalization_kernels(Backend& backend);
void register_cpu_softmax_kernels(Backend& backend);
void register_cpu_attention_kernels(Backend& backend);
void register_cpu_shape_kernels(Backend& backend);
void register_cpu_convolution_kernels(Backend& backend);
void register_cpu_tensor_parallel_kernels(Backend& backend);

}  // namespace partrain
