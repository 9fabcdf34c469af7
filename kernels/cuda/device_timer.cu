// The CUDA DeviceTimer of kernels/cuda/device_timer.cuh.
#include "kernels/cuda/device_timer.cuh"

#include <algorithm>
#include <vector>

#include "kernels/cuda/cuda_check.cuh"

namespace partrain::cuda {
namespace {

class CudaDeviceTimer final : public DeviceTimer {
 public:
  CudaDeviceTimer(cudaStream_t stream, int device_index) : stream_(stream), device_index_(device_index) {}
  ~CudaDeviceTimer() override {
    for (cudaEvent_t event : events_) (void)cudaEventDestroy(event);  // safe while pending
  }

  int mark() override {
    if (next_ == events_.size()) {
      cudaEvent_t event = nullptr;
      PARTRAIN_CUDA_CHECK(cudaEventCreate(&event));  // with timing, unlike the ordering events
      events_.push_back(event);
    }
    PARTRAIN_CUDA_CHECK(cudaEventRecord(events_[next_], stream_));
    return static_cast<int>(next_++);
  }

  double seconds_between(int first, int second) override {
    PARTRAIN_CHECK(first >= 0 && second >= 0 && static_cast<std::size_t>(std::max(first, second)) < next_,
                   "device timer on cuda:" << device_index_ << ": marks " << first << " and " << second
                                           << " asked, " << next_ << " recorded since the last reset");
    PARTRAIN_CUDA_CHECK(cudaEventSynchronize(events_[second]));
    float milliseconds = 0;
    PARTRAIN_CUDA_CHECK(cudaEventElapsedTime(&milliseconds, events_[first], events_[second]));
    return 1e-3 * milliseconds;
  }

  void reset() override { next_ = 0; }

 private:
  cudaStream_t stream_;
  int device_index_;
  std::vector<cudaEvent_t> events_;
  std::size_t next_ = 0;  // events_[0, next_) are this round's marks
};

}  // namespace

std::unique_ptr<DeviceTimer> make_cuda_device_timer(cudaStream_t stream, int device_index) {
  return std::make_unique<CudaDeviceTimer>(stream, device_index);
}

}  // namespace partrain::cuda
