#pragma once
// Published figures of the GPUs the analytic cost model plans for ([parallel] device_model), so
// users don't type numbers. Data sheets give the peaks, bandwidths and multiprocessor counts; the
// GEMM efficiency is a measured GEMM benchmark's (the best bf16 matmul over shapes against the
// peak: Bekman, "Machine Learning Engineering", §Maximum Achievable Matmul FLOPS, CUDA 12.1); the
// interconnect is that of the DGX systems the GPUs ship in, at the bus bandwidth NCCL's
// all-reduce reaches on it (nccl-tests). Nothing here is fitted to a training run.
#include <string>
#include <string_view>
#include <vector>

namespace partrain {

/// One GPU model as the analytic cost model sees it. Rates per GPU; bandwidths per direction.
struct DevicePreset {
  std::string name;                 // as written in [parallel] device_model
  double peak_bf16_flops = 0;       // dense bf16 tensor-core FLOP/s
  double peak_fp32_flops = 0;       // fp32 FLOP/s (no TF32)
  double gemm_efficiency = 1;       // measured best bf16 GEMM / peak_bf16_flops
  double memory_bandwidth = 0;      // bytes/s of HBM
  double memory_efficiency = 1;     // share of memory_bandwidth a streaming kernel reaches
  int multiprocessors = 0;          // SMs
  double kernel_seconds = 0;        // fixed cost of each kernel
  double memory_bytes = 0;          // HBM capacity
  double link_bandwidth = 0;        // bytes/s a ring collective reaches per GPU inside a node (NVLink)
  double network_bandwidth = 0;     // the same between nodes (InfiniBand, one NIC per GPU)
  int devices_per_node = 8;
  double link_latency = 0;          // seconds each NVLink collective starts with
};

/// The presets: "a100-80gb" (A100 SXM4 80 GB in a DGX A100: 8 × 200 Gb/s HDR) and "h100-sxm"
/// (H100 SXM5 80 GB in a DGX H100: 8 × 400 Gb/s NDR).
const std::vector<DevicePreset>& device_presets();

/// The preset named `name`, or nullptr.
const DevicePreset* find_device_preset(std::string_view name);

}  // namespace partrain
