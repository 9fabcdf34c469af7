// The overlapped, bucketed gradient all-reduce (runtime/bucketed_all_reduce.h) over MPI_COMM_WORLD
// (2, 3 or 4 ranks): gradients become views of the bucket buffers, a bucket's all-reduce starts as
// soon as its last gradient is handed over (before finish), and after finish every gradient holds
// the sum over the ranks. Every rank makes the same collective calls (no early returns).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "runtime/bucketed_all_reduce.h"
#include "support/mpi_test_main.h"

namespace partrain::runtime {
namespace {

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Parameter p's gradient on rank r in step s: element i = (r + 1) * (p + 1) + i + s.
float element(int rank, int parameter, std::int64_t i, int step) {
  return static_cast<float>((rank + 1) * (parameter + 1) + i + step);
}

TEST(BucketedAllReduce, BucketsStartDuringTheHandOversAndSumOverTheRanks) {
  comm::Communicator& world = testing::mpi_world();
  const int ranks = world.size();
  // Value ids 10..15; completion order 13 (never produced), 12, 10, 15, 11, 14. Sizes in floats.
  const std::vector<GradientCompletion> order = {{13, -1}, {12, 0}, {10, 3}, {15, 4}, {11, 9}, {14, 12}};
  const std::unordered_map<int, Shape> shapes = {{10, {2, 3}}, {11, {4}}, {12, {5}}, {13, {3}}, {14, {30}}, {15, {1, 2}}};
  std::unordered_map<int, Tensor> gradients;
  for (const auto& [parameter, shape] : shapes) gradients[parameter] = Tensor::zeros(shape);
  // 40 bytes: {13, 12} (32 bytes), {10, 15} (32), {11} (16: + 14 would exceed), {14} alone (120 bytes).
  BucketedAllReduce buckets(order, gradients, 40, world, cpu_backend());
  ASSERT_EQ(buckets.size(), 4u);
  EXPECT_EQ(buckets.bucket(0), (std::vector<int>{13, 12}));
  EXPECT_EQ(buckets.bucket(1), (std::vector<int>{10, 15}));
  EXPECT_EQ(buckets.bucket(2), (std::vector<int>{11}));
  EXPECT_EQ(buckets.bucket(3), (std::vector<int>{14}));
  EXPECT_EQ(buckets.bucket_bytes(3), 120);
  for (const auto& [parameter, shape] : shapes) EXPECT_EQ(gradients.at(parameter).shape(), shape);

  for (int step = 0; step < 2; ++step) {
    for (auto& [parameter, gradient] : gradients) gradient.zero();
    buckets.begin(2);  // two hand-overs per gradient, as two sub-microbatches
    for (const GradientCompletion& completion : order) {
      if (completion.last_step < 0) continue;
      const Tensor& gradient = gradients.at(completion.parameter);
      for (std::int64_t i = 0; i < gradient.numel(); ++i)
        gradient.data<float>()[i] = element(world.rank(), completion.parameter - 10, i, step);
      buckets.gradient_ready(completion.parameter);
      buckets.gradient_ready(completion.parameter);
      buckets.gradient_ready(99);  // not in a bucket (a tied parameter): ignored
    }
    const double before_finish = now_us();
    std::vector<io::TraceEvent> trace;
    buckets.finish(step, 0.0, trace);
    ASSERT_EQ(trace.size(), buckets.size());
    for (std::size_t b = 0; b < trace.size(); ++b) {
      EXPECT_EQ(trace[b].name, "AllReduce bucket " + std::to_string(b));
      EXPECT_EQ(trace[b].track, io::kGradientAllReduceTrack);
      EXPECT_EQ(trace[b].step, step);
      EXPECT_LT(trace[b].start_us, before_finish) << "bucket " << b << " started during the hand-overs";
      EXPECT_GE(trace[b].duration_us, 0);
    }
    for (const auto& [parameter, gradient] : gradients) {
      for (std::int64_t i = 0; i < gradient.numel(); ++i) {
        float expected = 0;
        for (int r = 0; r < ranks && parameter != 13; ++r) expected += element(r, parameter - 10, i, step);
        EXPECT_EQ(gradient.data<float>()[i], expected) << "parameter " << parameter << " element " << i;
      }
    }
  }
}

TEST(BucketedAllReduce, MissingHandOversStillReduceInFinishAndExtraOnesAreErrors) {
  comm::Communicator& world = testing::mpi_world();
  const std::vector<GradientCompletion> order = {{1, 0}, {2, 1}};
  std::unordered_map<int, Tensor> gradients = {{1, Tensor::full({3}, 1.0, DType::F32)}, {2, Tensor::full({3}, 2.0, DType::F32)}};
  BucketedAllReduce buckets(order, gradients, 12, world, cpu_backend());
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(gradients.at(2).to_float_vector(), (std::vector<float>{2, 2, 2})) << "values kept in the bucket views";
  buckets.begin(1);
  buckets.gradient_ready(1);
  EXPECT_THROW(buckets.gradient_ready(1), Error);
  std::vector<io::TraceEvent> trace;
  buckets.finish(0, 0.0, trace);  // bucket 1 never handed over: started here
  EXPECT_EQ(trace.size(), 2u);
  EXPECT_EQ(gradients.at(2).to_float_vector(), std::vector<float>(3, 2.0f * world.size()));
}

}  // namespace
}  // namespace partrain::runtime
