#include "kernels/cuda/device_errors.cuh"

#include <utility>

#include "core/error.h"
#include "kernels/cuda/cuda_check.cuh"

namespace partrain::cuda {

namespace {

template <typename Index>
__global__ void record_bad_value_kernel(const Index* indices, IndexCheckSlot* slot) {
  if (slot->first_bad != kNoBadPosition) slot->value = static_cast<long long>(indices[slot->first_bad]);
}

}  // namespace

DeviceErrorFlags::DeviceErrorFlags(cudaStream_t stream) : stream_(stream) {
  PARTRAIN_CUDA_CHECK(cudaMalloc(&slots_, kSlots * sizeof(IndexCheckSlot)));
  PARTRAIN_CUDA_CHECK(cudaMallocHost(&host_slots_, kSlots * sizeof(IndexCheckSlot)));
  PARTRAIN_CUDA_CHECK(cudaMemsetAsync(slots_, 0xff, kSlots * sizeof(IndexCheckSlot), stream_));
}

DeviceErrorFlags::~DeviceErrorFlags() {
  // Errors are ignored: a destructor cannot report them.
  (void)cudaStreamSynchronize(stream_);
  if (host_slots_) (void)cudaFreeHost(host_slots_);
  if (slots_) (void)cudaFree(slots_);
}

IndexCheckSlot* DeviceErrorFlags::reserve(std::string op, Describe describe) {
  if (pending_.size() == static_cast<std::size_t>(kSlots)) report();
  pending_.push_back({std::move(op), std::move(describe)});
  return slots_ + (pending_.size() - 1);
}

void DeviceErrorFlags::record_bad_value(IndexCheckSlot* slot, const Tensor& indices) const {
  if (indices.numel() == 0) return;
  if (indices.dtype() == DType::I32) {
    record_bad_value_kernel<<<1, 1, 0, stream_>>>(static_cast<const std::int32_t*>(indices.raw_data()), slot);
  } else {
    PARTRAIN_CHECK(indices.dtype() == DType::I64, "index check of a " << dtype_name(indices.dtype()) << " tensor");
    record_bad_value_kernel<<<1, 1, 0, stream_>>>(static_cast<const std::int64_t*>(indices.raw_data()), slot);
  }
  PARTRAIN_CUDA_CHECK_LAUNCH();
}

void DeviceErrorFlags::report() {
  if (pending_.empty()) return;
  const std::size_t count = pending_.size();
  PARTRAIN_CUDA_CHECK(
      cudaMemcpyAsync(host_slots_, slots_, count * sizeof(IndexCheckSlot), cudaMemcpyDeviceToHost, stream_));
  PARTRAIN_CUDA_CHECK(cudaMemsetAsync(slots_, 0xff, count * sizeof(IndexCheckSlot), stream_));
  PARTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  // Cleared before throwing, so that the backend stays usable after the error.
  std::vector<Pending> checks = std::move(pending_);
  pending_.clear();
  for (std::size_t i = 0; i < count; ++i) {
    const IndexCheckSlot& slot = host_slots_[i];
    if (slot.first_bad == kNoBadPosition) continue;
    PARTRAIN_FAIL(checks[i].describe(static_cast<std::int64_t>(slot.value), static_cast<std::int64_t>(slot.first_bad))
                  << " (in " << checks[i].op << ", found by a check on the device)");
  }
}

}  // namespace partrain::cuda
