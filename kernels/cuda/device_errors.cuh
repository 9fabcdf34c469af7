#pragma once
// Index and label checks that do not stop the GPU (docs/gpus.md, "Ordering"). A kernel that finds an
// index outside its range records the lowest bad flat position in a slot of a small device array
// owned by the CudaBackend; the host reads the slots once a step (Backend::check_device_errors, or
// any CudaBackend::synchronise) and throws the first error in the order the checks were queued. The
// alternative, copying each verdict to the host right after its kernel, stalls the GPU at every
// embedding and cross-entropy of every microbatch.
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace partrain::cuda {

/// One check's device record: the lowest bad flat position (kNoBadPosition when none was found) and
/// the value at that position (written by record_bad_value).
struct IndexCheckSlot {
  unsigned long long first_bad;
  long long value;
};
inline constexpr unsigned long long kNoBadPosition = ~0ull;

#ifdef __CUDACC__
/// Device code: records `position` as bad in `slot` (the lowest position wins, as the CPU kernels
/// report the first bad position in row-major order).
__device__ inline void flag_bad_position(IndexCheckSlot* slot, std::int64_t position) {
  atomicMin(&slot->first_bad, static_cast<unsigned long long>(position));
}
#endif

class DeviceErrorFlags {
 public:
  /// The error message for `value` found at flat position `position` of the checked tensor.
  using Describe = std::function<std::string(std::int64_t value, std::int64_t position)>;
  /// Pending checks before reserve() reads them early (one wait): more than a step holds in practice.
  static constexpr int kSlots = 1024;

  /// Allocates and clears the slots on the current device; work is queued on `stream`.
  explicit DeviceErrorFlags(cudaStream_t stream);
  ~DeviceErrorFlags();
  DeviceErrorFlags(const DeviceErrorFlags&) = delete;
  DeviceErrorFlags& operator=(const DeviceErrorFlags&) = delete;

  /// A cleared slot for one check of `op` ("Gather forward"), read at the next report(). When all
  /// kSlots are pending it reports them first (and may throw their error).
  IndexCheckSlot* reserve(std::string op, Describe describe);
  /// Queues, after the check's kernel, the copy of the bad value (if any) of i32/i64 `indices` into
  /// `slot`: the value is read while `indices` is still alive.
  void record_bad_value(IndexCheckSlot* slot, const Tensor& indices) const;
  /// True when checks were queued since the last report().
  bool pending() const { return !pending_.empty(); }
  /// Waits for the stream, reads the pending slots, clears them, and throws the first error as
  /// "<message> (in <op>, found by a check on the device)". No-op when none.
  void report();

 private:
  struct Pending {
    std::string op;
    Describe describe;
  };
  cudaStream_t stream_;
  IndexCheckSlot* slots_ = nullptr;       // device
  IndexCheckSlot* host_slots_ = nullptr;  // pinned host mirror
  std::vector<Pending> pending_;
};

}  // namespace partrain::cuda
