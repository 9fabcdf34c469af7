#pragma once
// Where a tensor lives.
#include <string>

namespace partrain {

enum class DeviceType { CPU, CUDA };

/// A device: the host (CPU, index 0) or one GPU (CUDA, its index).
struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;
  bool operator==(const Device&) const = default;
  bool is_cpu() const { return type == DeviceType::CPU; }
  /// "cpu" or "cuda:0".
  std::string to_string() const { return type == DeviceType::CPU ? "cpu" : "cuda:" + std::to_string(index); }
};

inline Device cpu_device() { return Device{}; }

}  // namespace partrain
