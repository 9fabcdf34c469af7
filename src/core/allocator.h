#pragma once
// Caching allocator with peak-memory accounting, one per device. Freed blocks go back to a cache
// (size-bucketed) instead of to the system, like PyTorch's CUDA caching allocator; the high-water
// mark of bytes held by live tensors is how the profiler measures a subgraph's peak memory.
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

#include "core/device.h"

namespace partrain {

/// Raw memory source under a CachingAllocator (host aligned_alloc, cudaMalloc, ...).
class RawMemory {
 public:
  virtual ~RawMemory() = default;
  /// Returns `bytes` bytes or throws partrain::Error (out of memory names the device and size).
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void release(void* pointer, std::size_t bytes) = 0;
};

/// Host memory, 64-byte aligned (cache line / AVX-512).
class HostMemory final : public RawMemory {
 public:
  void* allocate(std::size_t bytes) override;
  void release(void* pointer, std::size_t bytes) override;
};

/// Caching allocator for one device. Thread-safe.
/// Counters (bytes): current = held by live allocations (after rounding), peak = the maximum of
/// current since the last reset_peak(), reserved = current + cached free blocks.
class CachingAllocator {
 public:
  CachingAllocator(Device device, std::unique_ptr<RawMemory> memory);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  /// Returns a block of at least `bytes` bytes (a zero-byte request returns a valid 1-granule block).
  void* allocate(std::size_t bytes);
  /// Returns a block from allocate(); `bytes` must be the size that was requested.
  void deallocate(void* pointer, std::size_t bytes);

  std::size_t current_bytes() const;
  std::size_t peak_bytes() const;
  std::size_t reserved_bytes() const;
  /// Starts a new peak measurement at the current usage.
  void reset_peak();
  /// Gives every cached free block back to the raw memory source.
  void empty_cache();
  Device device() const { return device_; }

  /// Allocation granularity in bytes: every request is rounded up to a multiple of this.
  static constexpr std::size_t kGranule = 512;
  /// Bytes actually accounted for a request of `bytes`.
  static std::size_t rounded_size(std::size_t bytes);

 private:
  Device device_;
  std::unique_ptr<RawMemory> memory_;
  mutable std::mutex mutex_;
  std::multimap<std::size_t, void*> free_blocks_;  // rounded size -> block
  std::size_t current_ = 0, peak_ = 0, cached_ = 0;
};

/// The allocator of a device. The CPU allocator always exists; a CUDA allocator must have been
/// registered by the CUDA backend (throws partrain::Error otherwise).
CachingAllocator& allocator_for(Device device);
/// Installs the allocator for a device (used by the CUDA backend at start-up).
void register_allocator(Device device, std::unique_ptr<CachingAllocator> allocator);

}  // namespace partrain
