// The GPU presets of io/device_presets.h.
#include "io/device_presets.h"

namespace partrain {

const std::vector<DevicePreset>& device_presets() {
  static const std::vector<DevicePreset> presets = [] {
    const double gib = 1024.0 * 1024.0 * 1024.0;
    DevicePreset a100;
    a100.name = "a100-80gb";
    a100.peak_bf16_flops = 312e12;        // A100 data sheet, dense
    a100.peak_fp32_flops = 19.5e12;
    a100.gemm_efficiency = 267.9 / 312;   // MAMF, A100 SXM, bf16
    a100.memory_bandwidth = 2.039e12;     // HBM2e, 80 GB SXM
    a100.memory_efficiency = 0.9;         // a device-to-device copy reaches about 90% of HBM bandwidth
    a100.multiprocessors = 108;
    a100.kernel_seconds = 3e-6;
    a100.memory_bytes = 80 * gib;
    // What NCCL's ring collectives reach (nccl-tests all_reduce_perf bus bandwidth), not the links'
    // line rates: 200–210 GB/s on 8 A100 SXM over NVLink 3 (300 GB/s per direction), 85–96 GB/s
    // over 4 × 200 Gb/s HDR (100 GB/s) between nodes.
    a100.link_bandwidth = 210e9;
    a100.network_bandwidth = 0.9 * 25e9;  // one 200 Gb/s HDR port per GPU
    a100.link_latency = 10e-6;
    DevicePreset h100;
    h100.name = "h100-sxm";
    h100.peak_bf16_flops = 989e12;        // H100 SXM5 data sheet, dense
    h100.peak_fp32_flops = 67e12;
    h100.gemm_efficiency = 792.1 / 989;   // MAMF, H100 SXM, bf16
    h100.memory_bandwidth = 3.35e12;      // HBM3
    h100.memory_efficiency = 0.9;
    h100.multiprocessors = 132;
    h100.kernel_seconds = 3e-6;
    h100.memory_bytes = 80 * gib;
    h100.link_bandwidth = 0.7 * 450e9;    // NVLink 4 (450 GB/s per direction) at A100's measured share
    h100.network_bandwidth = 0.9 * 50e9;  // one 400 Gb/s NDR port per GPU
    h100.link_latency = 10e-6;
    return std::vector<DevicePreset>{a100, h100};
  }();
  return presets;
}

const DevicePreset* find_device_preset(std::string_view name) {
  for (const DevicePreset& preset : device_presets())
    if (preset.name == name) return &preset;
  return nullptr;
}

}  // namespace partrain
