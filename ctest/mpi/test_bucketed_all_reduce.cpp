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
#include "runtime/zero_partition.h"
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

// ZeRO-1 with segments: each bucket is reduce-scattered on its own; rank r owns the r-th part of
// every segment, so after the buckets every piece holds the sum of its elements, and all_gather puts
// every rank's updated elements back in place.
TEST(BucketedAllReduce, ZeroSegmentsAreReduceScatteredBucketByBucket) {
  comm::Communicator& world = testing::mpi_world();
  const int ranks = world.size();
  const std::vector<Shape> shapes = {{3, 2}, {5}, {1}, {7}, {2, 2}};  // parameter i: value id 20 + i
  std::vector<Tensor> parameters;
  std::unordered_map<int, Tensor> gradients;
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    parameters.push_back(Tensor::zeros(shapes[i]));
    gradients[20 + static_cast<int>(i)] = Tensor::full(shapes[i], 100.0, DType::F32);  // replaced below
  }
  // Completion order 23, 21, 24, 20, 22 in buckets {23}, {21, 24}, {20, 22}.
  const std::vector<GradientCompletion> order = {{23, 0}, {21, 1}, {24, 2}, {20, 3}, {22, 3}};
  ZeroPartition zero(parameters, world, cpu_backend(), {{3}, {1, 4}, {0, 2}});
  BucketedAllReduce buckets(zero, {20, 21, 22, 23, 24}, order, gradients, cpu_backend());
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets.bucket(1), (std::vector<int>{21, 24}));
  EXPECT_EQ(gradients.at(24).to_float_vector(), std::vector<float>(4, 100.0f)) << "values kept in the views";
  for (auto& [parameter, gradient] : gradients) gradient.zero();
  buckets.begin(1);
  for (const GradientCompletion& completion : order) {
    const Tensor& gradient = gradients.at(completion.parameter);
    for (std::int64_t i = 0; i < gradient.numel(); ++i)
      gradient.data<float>()[i] = element(world.rank(), completion.parameter - 20, i, 0);
    buckets.gradient_ready(completion.parameter);
  }
  std::vector<io::TraceEvent> trace;
  buckets.finish(0, 0.0, trace);
  ASSERT_EQ(trace.size(), 3u);
  EXPECT_EQ(trace[2].name, "ReduceScatter bucket 2");
  const std::vector<Tensor> parts = zero.reduced_parts();
  ASSERT_EQ(parts.size(), zero.pieces().size());
  std::int64_t owned = 0;
  for (std::size_t k = 0; k < parts.size(); ++k) {
    const ZeroPartition::Piece& piece = zero.pieces()[k];
    ASSERT_EQ(parts[k].numel(), piece.end - piece.begin);
    owned += piece.end - piece.begin;
    for (std::int64_t i = piece.begin; i < piece.end; ++i) {
      float expected = 0;
      for (int r = 0; r < ranks; ++r) expected += element(r, static_cast<int>(piece.parameter), i, 0);
      EXPECT_EQ(parts[k].data<float>()[i - piece.begin], expected) << "parameter " << piece.parameter << " element " << i;
    }
  }
  // Every element is owned by exactly one rank.
  const double total = world.all_reduce_scalar(static_cast<double>(owned));
  EXPECT_EQ(total, 6 + 5 + 1 + 7 + 4);
  // Each rank writes 1000·(rank + 1) + 100·parameter + element into its elements; all_gather (in
  // place, through the spent gradient buffer) gives every rank the owners' values, each in its place.
  const auto written = [](int rank, std::size_t parameter, std::int64_t i) {
    return static_cast<float>(1000 * (rank + 1) + 100 * static_cast<int>(parameter) + i);
  };
  for (const ZeroPartition::Piece& piece : zero.pieces()) {
    const Tensor view = ZeroPartition::view(parameters[piece.parameter], piece);
    for (std::int64_t i = 0; i < view.numel(); ++i) view.data<float>()[i] = written(world.rank(), piece.parameter, piece.begin + i);
  }
  zero.all_gather(parameters);
  for (std::size_t p = 0; p < parameters.size(); ++p) {
    const std::vector<float> values = parameters[p].to_float_vector();
    double sum = 0;
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(values.size()); ++i) {
      const int owner = static_cast<int>(values[i] / 1000) - 1;
      EXPECT_TRUE(owner >= 0 && owner < ranks && values[i] == written(owner, p, i))
          << "parameter " << p << " element " << i << ": " << values[i];
      sum += values[i];
    }
    // The same values on every rank.
    EXPECT_EQ(world.all_reduce_scalar(sum, comm::ReduceOp::Max), world.all_reduce_scalar(sum, comm::ReduceOp::Min));
  }
  // From the pieces alone, gathered in bf16 (mixed precision's working copies): every element is its
  // owner's f32 value rounded to bf16, as converting the whole f32 parameter would give.
  std::vector<Tensor> pieces;
  for (const ZeroPartition::Piece& piece : zero.pieces()) pieces.push_back(ZeroPartition::view(parameters[piece.parameter], piece).clone());
  zero.all_gather_pieces(pieces, DType::BF16);
  for (std::size_t p = 0; p < parameters.size(); ++p) {
    const Tensor gathered = zero.gathered_view(p, DType::BF16);
    ASSERT_EQ(gathered.shape(), parameters[p].shape());
    EXPECT_EQ(gathered.to_float_vector(), to_dtype(parameters[p], DType::BF16, cpu_backend()).to_float_vector())
        << "parameter " << p;
  }
}

}  // namespace
}  // namespace partrain::runtime
