// The CUDA backend's non-op services against the CPU backend (issue 7): host/device copies, the
// caching device allocator's peak tracking, dtype conversion (round to nearest even, as BFloat16),
// accumulation of bf16 gradients into f32, scaling, sums of squares, and the AdamW and SGD updates
// (same constants from runtime/optimizer.cpp, so results agree to the last bits but for fused
// multiply-adds). Skipped without a GPU.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <limits>

#include "app/trimmed_pipeline_communicator.h"
#include "cuda/cuda_op_check.h"
#include "kernels/cpu/cpu_backend.h"
#include "io/config.h"
#include "kernels/cuda/cuda_backend.cuh"
#include "core/cuda_ordering.h"
#include "core/error.h"
#include "runtime/optimizer.h"
#include "support/gradient_check.h"

namespace partrain {
namespace {
using testing::normal_tensor;
using testing::normalised_error;

cuda::CudaBackend& gpu() { return cuda::cuda_backend(0); }

TEST(CudaBackend, CopiesRoundTripAndTrackPeakMemory) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  const Tensor host = normal_tensor({257, 33}, 1);
  CachingAllocator& allocator = gpu().allocator();
  allocator.reset_peak();
  const std::size_t before = allocator.current_bytes();
  {
    const Tensor device = to_backend(host, gpu());
    EXPECT_EQ(device.device(), gpu().device());
    EXPECT_EQ(to_host(device, gpu()).to_float_vector(), host.to_float_vector());
    EXPECT_GE(allocator.peak_bytes(), before + CachingAllocator::rounded_size(host.nbytes()));
  }
  EXPECT_EQ(allocator.current_bytes(), before);
}

// The profiler's flush (Backend::flush_caches) writes a buffer of its own, twice the L2: tensors and
// the caching allocator's figures stay as they were, and the stream stays usable.
// CAPSlog's trimmed profiling runs the executor on the GPU with a trimmed communicator: its
// coalesced all-reduce (tied parameters) and in-place all-gather (ZeRO-1) take device tensors and
// leave them as they are.
TEST(CudaBackend, TrimmedCommunicatorTakesDeviceTensors) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  app::TrimmedPipelineCommunicator world(2, 1, gpu());
  const Tensor first = normal_tensor({5}, 3), second = normal_tensor({7}, 4);
  const std::vector<Tensor> bucket{to_backend(first, gpu()), to_backend(second, gpu())};
  world.all_reduce_coalesced(bucket);
  EXPECT_EQ(to_host(bucket[0], gpu()).to_float_vector(), first.to_float_vector());
  EXPECT_EQ(to_host(bucket[1], gpu()).to_float_vector(), second.to_float_vector());
  const Tensor whole_host = normal_tensor({8}, 5);
  const Tensor whole = to_backend(whole_host, gpu());
  world.all_gather(whole.slice_rows(4, 8), whole);
  EXPECT_EQ(to_host(whole, gpu()).to_float_vector(), whole_host.to_float_vector());
}

// The device timer (core/device_timer.h) times the work queued between two marks on the device's
// clock: for 20 fills of 1 GiB (memory-bound, milliseconds of work queued in microseconds) it reads
// most of the wall time until the device is done, never more, while the host returns from queueing
// long before the work ends (what a host clock around the calls would have measured).
TEST(CudaBackend, DeviceTimerTimesQueuedWork) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  std::unique_ptr<DeviceTimer> timer = gpu().make_device_timer();
  ASSERT_NE(timer, nullptr);
  const Tensor big = gpu().empty(Shape{std::int64_t{1} << 28});  // 1 GiB of f32
  gpu().fill_zero(big);
  gpu().synchronise();
  const auto wall_start = std::chrono::steady_clock::now();
  const int begin = timer->mark();
  for (int i = 0; i < 20; ++i) gpu().fill_zero(big);
  const int end = timer->mark();
  const double queued = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  gpu().synchronise();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  const double device = timer->seconds_between(begin, end);
  EXPECT_GT(device, 0.0);
  EXPECT_LE(device, wall * 1.01 + 1e-4) << "queued in " << queued << " s";
  EXPECT_GE(device, 0.7 * wall) << "queued in " << queued << " s";
  EXPECT_LT(queued, 0.5 * device) << "the host waited for the fills: nothing to tell apart";
  EXPECT_NEAR(timer->seconds_between(begin, begin), 0.0, 1e-6);
  timer->reset();  // the events are reused: marks count from 0 again
  EXPECT_EQ(timer->mark(), 0);
  EXPECT_EQ(timer->mark(), 1);
  EXPECT_GE(timer->seconds_between(0, 1), 0.0);
  EXPECT_THROW(timer->seconds_between(0, 2), Error);
}

TEST(CudaBackend, FlushCachesLeavesTensorsAndTheAllocatorAlone) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  const Tensor host = normal_tensor({513, 65}, 4);
  const Tensor device = to_backend(host, gpu());
  CachingAllocator& allocator = gpu().allocator();
  allocator.reset_peak();
  const std::size_t before = allocator.current_bytes(), peak = allocator.peak_bytes();
  gpu().flush_caches();
  gpu().flush_caches();
  gpu().synchronise();
  EXPECT_EQ(allocator.current_bytes(), before);
  EXPECT_EQ(allocator.peak_bytes(), peak);
  EXPECT_EQ(to_host(device, gpu()).to_float_vector(), host.to_float_vector());
}

TEST(CudaBackend, ConvertAccumulateScaleAndSumOfSquaresMatchTheCpu) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  const Tensor a = normal_tensor({1000, 37}, 2), b = normal_tensor({1000, 37}, 3);
  // f32 -> bf16 rounding is bit-identical to the host's BFloat16(float).
  Tensor cpu_bf16 = Tensor::empty(a.shape(), DType::BF16);
  cpu_backend().convert(cpu_bf16, a);
  Tensor gpu_bf16 = gpu().empty(a.shape(), DType::BF16);
  gpu().convert(gpu_bf16, to_backend(a, gpu()));
  EXPECT_EQ(to_host(gpu_bf16, gpu()).to_float_vector(), cpu_bf16.to_float_vector());

  // f32 += bf16 (mixed-precision gradient accumulation), then scale.
  Tensor cpu_sum = a.clone();
  cpu_backend().accumulate(cpu_sum, cpu_bf16);
  cpu_backend().scale(cpu_sum, 0.37);
  Tensor gpu_sum = to_backend(a, gpu());
  gpu().accumulate(gpu_sum, gpu_bf16);
  gpu().scale(gpu_sum, 0.37);
  EXPECT_EQ(to_host(gpu_sum, gpu()).to_float_vector(), cpu_sum.to_float_vector());

  // A weighted list as the gradient norm uses it (undefined entries skipped).
  const std::vector<Tensor> cpu_list = {b, Tensor(), a}, gpu_list = {to_backend(b, gpu()), Tensor(), to_backend(a, gpu())};
  const std::vector<double> weights = {1.0, 1.0, 0.25};
  const double expected = cpu_backend().sum_of_squares(cpu_list, weights);
  EXPECT_NEAR(gpu().sum_of_squares(gpu_list, weights), expected, 1e-9 * expected);
}

// fp16 mixed precision: f32 <-> f16 conversion bit-identical to the host's Float16 (subnormals, the
// overflow to inf and NaN included), f16 gradients accumulated into f32, f16 scaling, the sum of
// squares of an f16 list, and an inf in a list making the sum inf (the loss scaler's overflow test).
TEST(CudaBackend, Float16ConvertAccumulateScaleAndSumOfSquaresMatchTheCpu) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  Tensor a = normal_tensor({1000, 37}, 4);
  float* values = a.data<float>();
  values[0] = 65519.0f, values[1] = 65520.0f, values[2] = 3e-8f, values[3] = -1e-7f, values[4] = 6e-5f;
  values[5] = std::numeric_limits<float>::quiet_NaN();
  for (std::int64_t i = 6; i < 200; ++i) values[i] *= 1e-5f;  // subnormals in fp16
  Tensor cpu_f16 = Tensor::empty(a.shape(), DType::F16);
  cpu_backend().convert(cpu_f16, a);
  Tensor gpu_f16 = gpu().empty(a.shape(), DType::F16);
  gpu().convert(gpu_f16, to_backend(a, gpu()));
  const Tensor back = to_host(gpu_f16, gpu());
  for (std::int64_t i = 0; i < a.numel(); ++i)
    ASSERT_EQ(back.data<Float16>()[i].bits & (i == 5 ? 0x7c00 : 0xffff), cpu_f16.data<Float16>()[i].bits & (i == 5 ? 0x7c00 : 0xffff)) << i;
  Tensor gpu_wide = gpu().empty(a.shape(), DType::F32);
  gpu().convert(gpu_wide, gpu_f16);
  Tensor cpu_wide = Tensor::empty(a.shape(), DType::F32);
  cpu_backend().convert(cpu_wide, cpu_f16);
  const std::vector<float> wide = to_host(gpu_wide, gpu()).to_float_vector(), expected_wide = cpu_wide.to_float_vector();
  for (std::size_t i = 6; i < wide.size(); ++i) ASSERT_EQ(wide[i], expected_wide[i]) << i;

  values[5] = 0.0f;  // finite from here on (65520 became inf in f16: drop it too)
  values[1] = 1.0f;
  cpu_backend().convert(cpu_f16, a);
  gpu_f16 = to_backend(cpu_f16, gpu());
  const Tensor b = normal_tensor({1000, 37}, 5);
  Tensor cpu_sum = b.clone();
  cpu_backend().accumulate(cpu_sum, cpu_f16);
  cpu_backend().scale(cpu_sum, 1.0 / 1024);
  Tensor gpu_sum = to_backend(b, gpu());
  gpu().accumulate(gpu_sum, gpu_f16);
  gpu().scale(gpu_sum, 1.0 / 1024);
  EXPECT_EQ(to_host(gpu_sum, gpu()).to_float_vector(), cpu_sum.to_float_vector());
  cpu_backend().scale(cpu_f16, 0.37);
  gpu().scale(gpu_f16, 0.37);
  EXPECT_EQ(to_host(gpu_f16, gpu()).to_float_vector(), cpu_f16.to_float_vector());

  const std::vector<double> weights = {1.0, 0.5};
  const std::vector<Tensor> cpu_list = {cpu_f16, b}, gpu_list = {gpu_f16, to_backend(b, gpu())};
  const double expected = cpu_backend().sum_of_squares(cpu_list, weights);
  EXPECT_NEAR(gpu().sum_of_squares(gpu_list, weights), expected, 1e-9 * expected);
  Tensor overflowed = b.clone();
  overflowed.data<float>()[17] = std::numeric_limits<float>::infinity();
  const std::vector<Tensor> with_inf = {gpu_f16, to_backend(overflowed, gpu())};
  EXPECT_TRUE(std::isinf(gpu().sum_of_squares(with_inf, weights)));
}

TEST(CudaBackend, AdamWAndSgdUpdatesMatchTheCpu) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  const runtime::OptimizerSettings settings;
  for (const std::string name : {"adamw", "sgd"}) {
    SCOPED_TRACE(name);
    const Tensor initial = normal_tensor({300, 17}, 4);
    Tensor cpu_value = initial.clone();
    Tensor gpu_value = to_backend(initial, gpu());
    auto cpu_optimizer = runtime::make_optimizer(name, settings, {{"w", cpu_value, true}}, cpu_backend());
    auto gpu_optimizer = runtime::make_optimizer(name, settings, {{"w", gpu_value, true}}, gpu());
    for (int step = 0; step < 5; ++step) {
      const Tensor gradient = normal_tensor({300, 17}, 10 + step);
      const Tensor gpu_gradient = to_backend(gradient, gpu());
      cpu_optimizer->step(std::span<const Tensor>(&gradient, 1), 1e-2, 0.5);
      gpu_optimizer->step(std::span<const Tensor>(&gpu_gradient, 1), 1e-2, 0.5);
    }
    EXPECT_LE(normalised_error(to_host(gpu_value, gpu()), cpu_value), 1e-6);
    for (const std::string& state : cpu_optimizer->state_names())
      EXPECT_LE(normalised_error(to_host(gpu_optimizer->state("w", state), gpu()), cpu_optimizer->state("w", state)), 1e-6)
          << state;
  }
}

// Device-side index checks (kernels/cuda/device_errors.cuh): under overlap ordering an embedding
// lookup with an index outside the table does not stop the GPU; the next check_device_errors()
// (the runtime's step end) raises the CPU's error, naming the op, the index and the limit, and
// clears the flags. Under plain ordering (PARTRAIN_CUDA_ORDERING=plain) the op itself raises it.
TEST(CudaBackend, OutOfRangeEmbeddingIndexIsReportedAtTheStepEndCheck) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  cuda::CudaBackend& backend = gpu();
  backend.check_device_errors();  // nothing pending from earlier tests
  const Attributes attributes;
  const KernelContext context{attributes, backend};
  const Tensor weight = to_backend(normal_tensor({5, 4}, 3), backend);
  const Tensor indices = to_backend(Tensor::from_vector<std::int64_t>({2, 3}, {0, 1, 2, 4, 7, 9}), backend);
  const std::vector<Tensor> inputs{weight, indices};
  const std::vector<Tensor> outputs{backend.empty({2, 3, 4})};
  std::string message;
  try {
    backend.forward(OpType::Gather, context, inputs, outputs);
    EXPECT_EQ(backend.ordering(), CudaOrdering::Overlap) << "plain ordering must raise at the op";
    backend.check_device_errors();
    ADD_FAILURE() << "no error for index 7";
  } catch (const Error& error) {
    message = error.message();
  }
  // The first bad position in row-major order: 7 at [1, 1] (flat 4); the table has 5 rows.
  EXPECT_NE(message.find("Gather index 7"), std::string::npos) << message;
  EXPECT_NE(message.find("[1, 1]"), std::string::npos) << message;
  EXPECT_NE(message.find("[0, 5)"), std::string::npos) << message;
  EXPECT_NE(message.find("Gather forward"), std::string::npos) << message;
  EXPECT_NO_THROW(backend.check_device_errors());  // reported once, then cleared
  // A good lookup afterwards runs and checks clean.
  const std::vector<Tensor> good{weight, to_backend(Tensor::from_vector<std::int64_t>({2}, {4, 0}), backend)};
  const std::vector<Tensor> good_outputs{backend.empty({2, 4})};
  backend.forward(OpType::Gather, context, good, good_outputs);
  EXPECT_NO_THROW(backend.check_device_errors());
}

}  // namespace
}  // namespace partrain
