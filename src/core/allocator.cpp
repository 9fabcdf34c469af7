#include "core/allocator.h"

#include <cstdlib>
#include <vector>

#include "core/error.h"

namespace partrain {

void* HostMemory::allocate(std::size_t bytes) {
  void* pointer = std::aligned_alloc(64, bytes);
  PARTRAIN_CHECK(pointer != nullptr, "host out of memory allocating " << bytes << " bytes");
  return pointer;
}

void HostMemory::release(void* pointer, std::size_t) { std::free(pointer); }

CachingAllocator::CachingAllocator(Device device, std::unique_ptr<RawMemory> memory)
    : device_(device), memory_(std::move(memory)) {}

CachingAllocator::~CachingAllocator() { empty_cache(); }

std::size_t CachingAllocator::rounded_size(std::size_t bytes) {
  if (bytes == 0) bytes = 1;
  return (bytes + kGranule - 1) / kGranule * kGranule;
}

void* CachingAllocator::allocate(std::size_t bytes) {
  const std::size_t size = rounded_size(bytes);
  std::lock_guard lock(mutex_);
  void* pointer = nullptr;
  // Reuse an exact-size cached block; different sizes are not split so the accounting stays exact.
  if (auto it = free_blocks_.find(size); it != free_blocks_.end()) {
    pointer = it->second;
    free_blocks_.erase(it);
    cached_ -= size;
  } else {
    try {
      pointer = memory_->allocate(size);
    } catch (const Error&) {
      // Out of memory: give the cache back and try once more before failing.
      for (auto& [block_size, block] : free_blocks_) memory_->release(block, block_size);
      free_blocks_.clear();
      cached_ = 0;
      pointer = memory_->allocate(size);
    }
  }
  current_ += size;
  if (current_ > peak_) peak_ = current_;
  return pointer;
}

void CachingAllocator::deallocate(void* pointer, std::size_t bytes) {
  if (!pointer) return;
  const std::size_t size = rounded_size(bytes);
  std::lock_guard lock(mutex_);
  PARTRAIN_CHECK(current_ >= size, "allocator on " << device_.to_string() << ": freeing more than allocated");
  current_ -= size;
  free_blocks_.emplace(size, pointer);
  cached_ += size;
}

std::size_t CachingAllocator::current_bytes() const { std::lock_guard lock(mutex_); return current_; }
std::size_t CachingAllocator::peak_bytes() const { std::lock_guard lock(mutex_); return peak_; }
std::size_t CachingAllocator::reserved_bytes() const { std::lock_guard lock(mutex_); return current_ + cached_; }
void CachingAllocator::reset_peak() { std::lock_guard lock(mutex_); peak_ = current_; }

void CachingAllocator::empty_cache() {
  std::lock_guard lock(mutex_);
  for (auto& [size, block] : free_blocks_) memory_->release(block, size);
  free_blocks_.clear();
  cached_ = 0;
}

namespace {
struct AllocatorRegistry {
  std::mutex mutex;
  std::unique_ptr<CachingAllocator> cpu = std::make_unique<CachingAllocator>(cpu_device(), std::make_unique<HostMemory>());
  std::vector<std::unique_ptr<CachingAllocator>> cuda;
};
AllocatorRegistry& registry() {
  static AllocatorRegistry* instance = new AllocatorRegistry();  // never destroyed: tensors may outlive main
  return *instance;
}
}  // namespace

CachingAllocator& allocator_for(Device device) {
  AllocatorRegistry& r = registry();
  if (device.is_cpu()) return *r.cpu;
  std::lock_guard lock(r.mutex);
  PARTRAIN_CHECK(device.index >= 0 && std::size_t(device.index) < r.cuda.size() && r.cuda[device.index],
                 "no allocator for device " << device.to_string() << " (is the CUDA backend initialised?)");
  return *r.cuda[device.index];
}

void register_allocator(Device device, std::unique_ptr<CachingAllocator> allocator) {
  AllocatorRegistry& r = registry();
  std::lock_guard lock(r.mutex);
  if (device.is_cpu()) { r.cpu = std::move(allocator); return; }
  if (r.cuda.size() <= std::size_t(device.index)) r.cuda.resize(device.index + 1);
  r.cuda[device.index] = std::move(allocator);
}

}  // namespace partrain
