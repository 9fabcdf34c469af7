#pragma once
// The CUDA DeviceTimer (core/device_timer.h): one cudaEvent per mark, recorded on the backend's
// compute stream; cudaEventElapsedTime between two of them (resolution about 0.5 µs).
#include <cuda_runtime.h>

#include <memory>

#include "core/device_timer.h"

namespace partrain::cuda {

/// A timer of the work queued on `stream` of GPU `device_index`. Its events are created as marks
/// need them and reused after reset(); they are destroyed with the timer.
std::unique_ptr<DeviceTimer> make_cuda_device_timer(cudaStream_t stream, int device_index);

}  // namespace partrain::cuda
