// MPI tests of comm::NcclCommunicator (run under mpiexec with 1 and 2 ranks). Every rank uses GPU
// (local rank % device count). Without a GPU the NCCL tests are skipped with a message. When ranks
// share a GPU (2 ranks on a 1-GPU machine) NCCL cannot run: the NCCL tests are skipped and only the
// shared-GPU check is tested. As in ctest/mpi, every rank makes the same sequence of collective calls
// (EXPECT_*, never an early return between collectives) so that a failure cannot hang the others.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "comm/mpi_communicator.h"
#include "kernels/cuda/nccl_communicator.h"
#include "core/backend.h"
#include "core/cuda_ordering.h"
#include "core/tensor.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.cuh"
#include "runtime/bucketed_all_reduce.h"
#include "runtime/zero_partition.h"
#include "support/errors.h"
#include "support/mpi_test_main.h"

namespace partrain::comm {
namespace {

using testing::expect_error;

MpiCommunicator& world() { return testing::mpi_world(); }

/// This process's rank among the ranks of its node.
int local_rank() {
  MPI_Comm local = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &local);
  int rank = 0;
  MPI_Comm_rank(local, &rank);
  MPI_Comm_free(&local);
  return rank;
}

int gpu_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

/// Collective: the CUDA backend of GPU (local rank % device count), or null on every rank when some
/// rank has no GPU.
cuda::CudaBackend* gpu_backend() {
  static bool decided = false;
  static cuda::CudaBackend* backend = nullptr;
  if (decided) return backend;
  decided = true;
  const int count = gpu_count();
  const int local = local_rank();
  if (world().all_reduce_scalar(count, ReduceOp::Min) < 1) return nullptr;
  backend = &cuda::cuda_backend(local % count);
  return backend;
}

std::string host_name() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

// ---------------- checks that need no NCCL communicator ----------------

TEST(NcclSetup, MakeNcclCommunicatorNeedsTheCudaBackend) {
  expect_error([] { (void)make_nccl_communicator(MpiCommunicator::world(), cpu_backend()); },
               "needs the CUDA backend");
}

TEST(NcclSetup, DistinctGpuCheckAgreesWithPciBusIds) {
  cuda::CudaBackend* backend = gpu_backend();
  if (!backend) GTEST_SKIP() << "no GPU on some rank (" << gpu_count() << " here): NCCL tests skipped";
  // The expectation from PCI bus ids, independently of the UUIDs that the check compares.
  char bus[64] = {};
  EXPECT_EQ(cudaDeviceGetPCIBusId(bus, sizeof bus, backend->device().index), cudaSuccess);
  const std::vector<std::string> all = world().all_gather_bytes(host_name() + " " + bus);
  bool expected = true;
  for (std::size_t i = 0; i < all.size(); ++i)
    for (std::size_t j = i + 1; j < all.size(); ++j) expected = expected && all[i] != all[j];

  const bool distinct = ranks_have_distinct_gpus(world(), *backend);
  EXPECT_EQ(distinct, expected);
  const std::string finding = shared_gpu_description(world(), *backend);
  EXPECT_EQ(finding.empty(), distinct) << finding;
  if (world().size() == 1) {
    EXPECT_TRUE(distinct);
  }
  if (!distinct) {
    EXPECT_NE(finding.find("share the GPU"), std::string::npos) << finding;
    std::printf("[rank %d] %d ranks share a GPU: expecting the NCCL communicator to refuse them\n", world().rank(),
                world().size());
    // Collective and consistent: every rank throws the same error before NCCL is initialised.
    expect_error([&] { NcclCommunicator refused(MpiCommunicator::world(), *backend); }, "share the GPU");
  }
}

// ---------------- NCCL tests: one communicator for the suite ----------------

class NcclCommunicatorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    backend_ = gpu_backend();
    if (!backend_) {
      skip_ = "no GPU on some rank: NCCL tests skipped";
      return;
    }
    if (!ranks_have_distinct_gpus(world(), *backend_)) {
      skip_ = std::to_string(world().size()) + " ranks share " + std::to_string(gpu_count()) +
              " GPU(s); NCCL needs one GPU per rank: NCCL tests skipped (the shared-GPU check is tested)";
      return;
    }
    try {
      nccl_ = std::make_unique<NcclCommunicator>(MpiCommunicator::world(), *backend_);
    } catch (const std::exception& error) {  // construction agrees: every rank fails together
      error_ = error.what();
    }
  }
  static void TearDownTestSuite() { nccl_.reset(); }

  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    ASSERT_TRUE(error_.empty()) << "NcclCommunicator construction failed: " << error_;
  }

  static NcclCommunicator& nccl() { return *nccl_; }
  static cuda::CudaBackend& gpu() { return *backend_; }
  static Tensor on_gpu(const Tensor& host) { return to_backend(host, *backend_); }
  /// A host copy (the copy waits for the stream, so queued NCCL work is complete).
  static std::vector<float> floats(const Tensor& tensor) { return to_host(tensor, *backend_).to_float_vector(); }
  template <typename T>
  static std::vector<T> values(const Tensor& tensor) {
    const Tensor host = to_host(tensor, *backend_);
    return std::vector<T>(host.data<T>(), host.data<T>() + host.numel());
  }

  static inline cuda::CudaBackend* backend_ = nullptr;
  static inline std::unique_ptr<NcclCommunicator> nccl_;
  static inline std::string skip_, error_;
};

std::vector<float> rounded_to_bf16(const std::vector<float>& values) {
  std::vector<float> result;
  for (const float value : values) result.push_back(static_cast<float>(BFloat16(value)));
  return result;
}

Tensor bf16_tensor(const Shape& shape, const std::vector<float>& values) {
  std::vector<BFloat16> converted;
  for (const float value : values) converted.emplace_back(value);
  return Tensor::from_vector<BFloat16>(shape, converted);
}

TEST_F(NcclCommunicatorTest, MirrorsTheControlCommunicator) {
  EXPECT_STREQ(nccl().backend_name(), "nccl");
  EXPECT_EQ(nccl().rank(), world().rank());
  EXPECT_EQ(nccl().size(), world().size());
  ASSERT_EQ(nccl().global_ranks().size(), world().global_ranks().size());
  for (std::size_t i = 0; i < world().global_ranks().size(); ++i)
    EXPECT_EQ(nccl().global_ranks()[i], world().global_ranks()[i]);
  EXPECT_GE(nccl().max_tag(), 32767);
  EXPECT_EQ(nccl().backend().device(), gpu().device());
}

TEST_F(NcclCommunicatorTest, AllReduceF32SumMaxMin) {
  const int n = nccl().size(), r = nccl().rank();
  // Halves and small integers: every partial sum is exact in fp32, whatever NCCL's order.
  auto input = [](int rank) {
    std::vector<float> v;
    for (int i = 0; i < 6; ++i) v.push_back(static_cast<float>((rank + 1) * (i + 1)) + (i % 2 ? -0.5f : 0.5f) * rank);
    return v;
  };
  const Tensor sum = on_gpu(Tensor::from_vector<float>({2, 3}, input(r)));
  const Tensor max = on_gpu(Tensor::from_vector<float>({2, 3}, input(r)));
  const Tensor min = on_gpu(Tensor::from_vector<float>({6}, input(r)));
  nccl().all_reduce(sum);
  nccl().all_reduce(max, ReduceOp::Max);
  nccl().all_reduce(min, ReduceOp::Min);
  std::vector<float> expected_sum(6, 0.0f), expected_max = input(0), expected_min = input(0);
  for (int rank = 0; rank < n; ++rank)
    for (std::size_t i = 0; i < 6; ++i) {
      expected_sum[i] += input(rank)[i];
      expected_max[i] = std::max(expected_max[i], input(rank)[i]);
      expected_min[i] = std::min(expected_min[i], input(rank)[i]);
    }
  EXPECT_EQ(floats(sum), expected_sum);
  EXPECT_EQ(floats(max), expected_max);
  EXPECT_EQ(floats(min), expected_min);
}

// ZeRO-1's collectives on the GPU give what the MPI communicator (the reference) gives on the host.
TEST_F(NcclCommunicatorTest, ReduceScatterAndAllGatherMatchTheMpiCommunicator) {
  const int n = nccl().size(), r = nccl().rank();
  constexpr int kPart = 7;
  std::vector<float> values(static_cast<std::size_t>(kPart * n));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>((r + 1) * (i + 1)) * 0.5f;
  const Tensor host_input = Tensor::from_vector<float>({kPart * n}, values);
  const Tensor host_part = Tensor::zeros({kPart}), host_gathered = Tensor::zeros({kPart * n});
  world().reduce_scatter(host_input, host_part);
  world().all_gather(host_part, host_gathered);
  const Tensor part = on_gpu(Tensor::zeros({kPart})), gathered = on_gpu(Tensor::zeros({kPart * n}));
  nccl().reduce_scatter(on_gpu(host_input), part);
  nccl().all_gather(part, gathered);
  EXPECT_EQ(floats(part), host_part.to_float_vector());
  EXPECT_EQ(floats(gathered), host_gathered.to_float_vector());
  // In bf16 (ZeRO-1's gather of the working copies under mixed precision), in place.
  const Tensor host_whole = Tensor::zeros({kPart * n}, DType::BF16);
  cpu_backend().convert(host_whole.slice_rows(r * kPart, (r + 1) * kPart), host_part);
  const Tensor whole = on_gpu(host_whole);
  world().all_gather(host_whole.slice_rows(r * kPart, (r + 1) * kPart), host_whole);
  nccl().all_gather(whole.slice_rows(r * kPart, (r + 1) * kPart), whole);
  EXPECT_EQ(floats(whole), host_whole.to_float_vector());
}

// The overlapped, bucketed gradient reduction (issue 18) on the GPU: async reduce-scatter, and DDP's
// bucketed all-reduce and ZeRO-1's bucketed reduce-scatter over NCCL give what they give over MPI on
// the host.
TEST_F(NcclCommunicatorTest, AsyncReduceScatterAndBucketedReductionsMatchTheMpiCommunicator) {
  const int n = nccl().size(), r = nccl().rank();
  constexpr int kPart = 5;
  std::vector<float> values(static_cast<std::size_t>(kPart * n));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>((r + 2) * (i + 1)) * 0.25f;
  const Tensor host_input = Tensor::from_vector<float>({kPart * n}, values);
  const Tensor host_part = Tensor::zeros({kPart}), part = on_gpu(Tensor::zeros({kPart}));
  Request host_request = world().reduce_scatter_async(host_input, host_part);
  Request device_request = nccl().reduce_scatter_async(on_gpu(host_input), part);
  host_request.wait();
  device_request.wait();
  EXPECT_EQ(floats(part), host_part.to_float_vector());

  // Gradients of value ids 0..3 completed in the order 2, 0, 3, 1; 40-byte buckets.
  const std::vector<Shape> shapes = {{2, 3}, {5}, {3}, {4, 2}};
  const std::vector<runtime::GradientCompletion> order = {{2, 0}, {0, 1}, {3, 2}, {1, 3}};
  auto gradient_values = [&](std::size_t parameter, std::int64_t numel) {
    std::vector<float> v;
    for (std::int64_t i = 0; i < numel; ++i) v.push_back(static_cast<float>((r + 1) * (parameter + 1) + i) * 0.5f);
    return v;
  };
  for (const bool zero : {false, true}) {
    SCOPED_TRACE(zero ? "ZeRO-1 reduce-scatter" : "all-reduce");
    std::unordered_map<int, Tensor> host_gradients, device_gradients;
    std::vector<Tensor> host_parameters, device_parameters;
    for (std::size_t p = 0; p < shapes.size(); ++p) {
      host_gradients[static_cast<int>(p)] = Tensor::zeros(shapes[p]);
      device_gradients[static_cast<int>(p)] = on_gpu(Tensor::zeros(shapes[p]));
      host_parameters.push_back(Tensor::zeros(shapes[p]));
      device_parameters.push_back(on_gpu(Tensor::zeros(shapes[p])));
    }
    const std::vector<std::vector<std::size_t>> segments = {{2, 0}, {3}, {1}};
    std::unique_ptr<runtime::ZeroPartition> host_zero, device_zero;
    std::unique_ptr<runtime::BucketedAllReduce> host, device;
    if (zero) {
      host_zero = std::make_unique<runtime::ZeroPartition>(host_parameters, world(), cpu_backend(), segments);
      device_zero = std::make_unique<runtime::ZeroPartition>(device_parameters, nccl(), gpu(), segments);
      host = std::make_unique<runtime::BucketedAllReduce>(*host_zero, std::vector<int>{0, 1, 2, 3}, order, host_gradients,
                                                          cpu_backend());
      device = std::make_unique<runtime::BucketedAllReduce>(*device_zero, std::vector<int>{0, 1, 2, 3}, order,
                                                            device_gradients, gpu());
    } else {
      host = std::make_unique<runtime::BucketedAllReduce>(order, host_gradients, 40, world(), cpu_backend());
      device = std::make_unique<runtime::BucketedAllReduce>(order, device_gradients, 40, nccl(), gpu());
    }
    ASSERT_EQ(device->size(), 3u);
    host->begin(1);
    device->begin(1);
    for (const runtime::GradientCompletion& completion : order) {
      const Tensor& host_gradient = host_gradients.at(completion.parameter);
      const Tensor filled = Tensor::from_vector<float>(
          host_gradient.shape(), gradient_values(static_cast<std::size_t>(completion.parameter), host_gradient.numel()));
      cpu_backend().copy(host_gradient, filled);
      gpu().copy(device_gradients.at(completion.parameter), on_gpu(filled));
      host->gradient_ready(completion.parameter);
      device->gradient_ready(completion.parameter);
    }
    std::vector<io::TraceEvent> trace;
    host->finish(0, 0.0, trace);
    device->finish(0, 0.0, trace);
    EXPECT_EQ(trace.size(), 6u);
    if (zero) {
      const std::vector<Tensor> host_parts = host_zero->reduced_parts(), device_parts = device_zero->reduced_parts();
      ASSERT_EQ(device_parts.size(), host_parts.size());
      for (std::size_t k = 0; k < host_parts.size(); ++k) EXPECT_EQ(floats(device_parts[k]), host_parts[k].to_float_vector());
    } else {
      for (std::size_t p = 0; p < shapes.size(); ++p)
        EXPECT_EQ(floats(device_gradients.at(static_cast<int>(p))), host_gradients.at(static_cast<int>(p)).to_float_vector())
            << "parameter " << p;
    }
  }
}

TEST_F(NcclCommunicatorTest, AllReduceBf16SumIsRoundedOnceAndMaxIsExact) {
  const int n = nccl().size(), r = nccl().rank();
  // Integers below 256 are exact in bf16; their sums (exact in fp32) mostly are not, so the result
  // is the once-rounded fp32 sum.
  auto sum_input = [](int rank) {
    std::vector<float> v;
    for (int i = 0; i < 8; ++i) v.push_back(static_cast<float>(101 + 3 * rank + 17 * i));
    return v;
  };
  auto max_input = [](int rank) {
    std::vector<float> v;
    for (int i = 0; i < 8; ++i) v.push_back((i % 2 ? -1.0f : 1.0f) * (1.0f + 0.25f * rank + static_cast<float>(i)));
    return v;
  };
  const Tensor sum = on_gpu(bf16_tensor({8}, sum_input(r)));
  const Tensor max = on_gpu(bf16_tensor({2, 4}, max_input(r)));
  nccl().all_reduce(sum);
  nccl().all_reduce(max, ReduceOp::Max);
  std::vector<float> exact_sum(8, 0.0f), expected_max = max_input(0);
  for (int rank = 0; rank < n; ++rank)
    for (std::size_t i = 0; i < 8; ++i) {
      exact_sum[i] += sum_input(rank)[i];
      expected_max[i] = std::max(expected_max[i], max_input(rank)[i]);
    }
  EXPECT_EQ(floats(sum), rounded_to_bf16(exact_sum));
  EXPECT_EQ(floats(max), expected_max);
}

TEST_F(NcclCommunicatorTest, AllReduceIntegers) {
  const int n = nccl().size(), r = nccl().rank();
  const Tensor i32 = on_gpu(Tensor::from_vector<std::int32_t>({3}, {r + 1, -1000 * r, 7}));
  const std::int64_t big = std::int64_t{1} << 40;
  const Tensor i64 = on_gpu(Tensor::from_vector<std::int64_t>({2}, {big * (r + 1), -big * (r + 1)}));
  nccl().all_reduce(i32);
  nccl().all_reduce(i64, ReduceOp::Max);
  const std::int32_t triangle = n * (n + 1) / 2;
  EXPECT_EQ(values<std::int32_t>(i32), (std::vector<std::int32_t>{triangle, -1000 * (triangle - n), 7 * n}));
  EXPECT_EQ(values<std::int64_t>(i64), (std::vector<std::int64_t>{big * n, -big}));
}

TEST_F(NcclCommunicatorTest, CoalescedAllReduceOfThreeTensors) {
  const int n = nccl().size(), r = nccl().rank();
  const std::vector<Shape> shapes = {{2, 3}, {5}, {4, 1, 2}};
  auto input = [](std::size_t k, int rank, std::int64_t count) {
    std::vector<float> v;
    for (std::int64_t i = 0; i < count; ++i) v.push_back(static_cast<float>(10 * k + i) + 0.5f * rank);
    return v;
  };
  const float rank_sum = 0.5f * static_cast<float>(n * (n - 1) / 2);
  // f32 (packed with device-to-device copies), then bf16 (packed through an f32 conversion).
  std::vector<Tensor> f32, bf16;
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    f32.push_back(on_gpu(Tensor::from_vector<float>(shapes[k], input(k, r, numel(shapes[k])))));
    bf16.push_back(on_gpu(bf16_tensor(shapes[k], input(k, r, numel(shapes[k])))));
  }
  nccl().all_reduce_coalesced(f32);
  nccl().all_reduce_coalesced(bf16);
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    std::vector<float> expected = input(k, 0, numel(shapes[k]));
    for (float& value : expected) value = value * static_cast<float>(n) + rank_sum;
    EXPECT_EQ(f32[k].shape(), shapes[k]);
    EXPECT_EQ(floats(f32[k]), expected) << "tensor " << k;
    EXPECT_EQ(floats(bf16[k]), rounded_to_bf16(expected)) << "bf16 tensor " << k;
  }
  // i32 max: packed with copies in its own dtype.
  std::vector<Tensor> ints = {on_gpu(Tensor::from_vector<std::int32_t>({2}, {r, -r})),
                              on_gpu(Tensor::from_vector<std::int32_t>({1}, {100 + r}))};
  nccl().all_reduce_coalesced(ints, ReduceOp::Max);
  EXPECT_EQ(values<std::int32_t>(ints[0]), (std::vector<std::int32_t>{n - 1, 0}));
  EXPECT_EQ(values<std::int32_t>(ints[1]), (std::vector<std::int32_t>{100 + n - 1}));
  // Host and device tensors in one call: the device ones through NCCL, the host one through MPI.
  std::vector<Tensor> mixed = {on_gpu(Tensor::full({3}, r + 1.0)), Tensor::full({2}, 2.0 * r)};
  nccl().all_reduce_coalesced(mixed);
  EXPECT_EQ(floats(mixed[0]), std::vector<float>(3, static_cast<float>(n * (n + 1) / 2)));
  EXPECT_EQ(mixed[1].to_float_vector(), std::vector<float>(2, static_cast<float>(n * (n - 1))));
}

TEST_F(NcclCommunicatorTest, BroadcastFromTheLastRank) {
  const int n = nccl().size(), r = nccl().rank(), root = n - 1;
  auto input = [](int rank) {
    std::vector<float> v;
    for (int i = 0; i < 12; ++i) v.push_back(7.0f * rank + static_cast<float>(i));
    return v;
  };
  const Tensor f32 = on_gpu(Tensor::from_vector<float>({3, 4}, input(r)));
  const Tensor i64 = on_gpu(Tensor::from_vector<std::int64_t>({3}, {r, 10 * r, (std::int64_t{1} << 50) + r}));
  nccl().broadcast(f32, root);
  nccl().broadcast(i64, root);
  EXPECT_EQ(floats(f32), input(root));
  EXPECT_EQ(values<std::int64_t>(i64), (std::vector<std::int64_t>{root, 10 * root, (std::int64_t{1} << 50) + root}));
  expect_error([&] { nccl().broadcast(f32, n); }, "out of range");
}

// Values that identify the sender, the message and the element (exact in fp32: below 2^24).
float message_value(int sender, int message, std::int64_t element) {
  return static_cast<float>(sender * (1 << 21) + message * (1 << 19) + element);
}

TEST_F(NcclCommunicatorTest, RingExchangeMatchesMessagesInPostingOrder) {
  const int n = nccl().size(), r = nccl().rank();
  const int next = (r + 1) % n, previous = (r + n - 1) % n;  // with one rank: itself
  auto filled = [](int sender, int message, const Shape& shape) {
    std::vector<float> v;
    for (std::int64_t i = 0; i < numel(shape); ++i) v.push_back(message_value(sender, message, i));
    return Tensor::from_vector<float>(shape, v);
  };
  const std::int64_t large = 1 << 20;  // 4 MiB: beyond any eager buffer
  const Tensor send_small = on_gpu(filled(r, 0, {3, 4}));
  const Tensor send_bf16 = on_gpu(bf16_tensor({5}, {1.0f * r, 0.5f, -2.0f, 3.25f, 100.0f + r}));
  const Tensor send_large = on_gpu(filled(r, 2, {large}));
  // The small message lands in rows [2, 5) of a larger tensor: receives write into views.
  const Tensor frame = gpu().zeros({6, 4});
  const Tensor receive_bf16 = gpu().zeros({5}, DType::BF16);
  const Tensor receive_large = gpu().zeros({large});
  // Sends listed first and tags that differ from the MPI tests' pattern: NCCL matches by order.
  const std::vector<SendSpec> sends = {{send_small, next, 5}, {send_bf16, next, 6}, {send_large, next, 7}};
  const std::vector<ReceiveSpec> receives = {
      {frame.slice_rows(2, 5), previous, 5}, {receive_bf16, previous, 6}, {receive_large, previous, 7}};
  Request request = nccl().exchange(sends, receives);
  request.wait();
  EXPECT_TRUE(request.done());

  std::vector<float> expected_frame(24, 0.0f);
  for (int i = 0; i < 12; ++i) expected_frame[static_cast<std::size_t>(8 + i)] = message_value(previous, 0, i);
  EXPECT_EQ(floats(frame), expected_frame);
  EXPECT_EQ(floats(receive_bf16), (std::vector<float>{1.0f * previous, 0.5f, -2.0f, 3.25f, 100.0f + previous}));
  const std::vector<float> got = floats(receive_large);
  std::int64_t wrong = 0;
  for (std::int64_t i = 0; i < large; ++i) wrong += got[static_cast<std::size_t>(i)] != message_value(previous, 2, i);
  EXPECT_EQ(wrong, 0);
}

TEST_F(NcclCommunicatorTest, PairedSendAndReceiveInMatchingOrder) {
  // Ranks 2k and 2k+1 talk; the even one sends first, the odd one receives first (an NCCL send
  // occupies the stream until its receive runs). A rank without a partner makes no call.
  const int n = nccl().size(), r = nccl().rank(), partner = r ^ 1;
  if (partner >= n) GTEST_SKIP() << "rank " << r << " has no partner among " << n << " rank(s)";
  const Tensor mine = on_gpu(Tensor::from_vector<float>({4}, {1.0f * r, 2.0f * r, 3.0f, 4.0f}));
  const Tensor ids = on_gpu(Tensor::from_vector<std::int64_t>({2}, {r, -r}));
  const Tensor theirs = gpu().zeros({4});
  const Tensor their_ids = gpu().zeros({2}, DType::I64);
  std::vector<Request> requests;
  if (r % 2 == 0) {
    requests.push_back(nccl().send(mine, partner, 1));
    requests.push_back(nccl().send(ids, partner, 2));
    requests.push_back(nccl().receive(theirs, partner, 1));
    requests.push_back(nccl().receive(their_ids, partner, 2));
  } else {
    requests.push_back(nccl().receive(theirs, partner, 1));
    requests.push_back(nccl().receive(their_ids, partner, 2));
    requests.push_back(nccl().send(mine, partner, 1));
    requests.push_back(nccl().send(ids, partner, 2));
  }
  wait_all(requests);
  for (const Request& request : requests) EXPECT_TRUE(request.done());
  EXPECT_EQ(floats(theirs), (std::vector<float>{1.0f * partner, 2.0f * partner, 3.0f, 4.0f}));
  EXPECT_EQ(values<std::int64_t>(their_ids), (std::vector<std::int64_t>{partner, -partner}));
}

TEST_F(NcclCommunicatorTest, AsyncAllReduceCompletesOnWaitAndTest) {
  const int n = nccl().size(), r = nccl().rank();
  const std::int64_t count = 1 << 16;
  const Tensor f32 = on_gpu(Tensor::full({count}, r + 0.5));
  const Tensor bf16 = on_gpu(bf16_tensor({3}, {100.0f + r, 1.0f, -3.0f * r}));
  const Tensor i64 = on_gpu(Tensor::from_vector<std::int64_t>({2}, {r, 5 - r}));
  Request f32_request = nccl().all_reduce_async(f32);
  Request bf16_request = nccl().all_reduce_async(bf16);
  Request i64_request = nccl().all_reduce_async(i64, ReduceOp::Min);
  // Under plain ordering an asynchronous collective completes before it returns (by design).
  if (gpu().ordering() == CudaOrdering::Overlap) {
    EXPECT_FALSE(f32_request.done());
  }
  // Poll one request with test() (bounded), wait for the others.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!f32_request.test() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  EXPECT_TRUE(f32_request.done());
  f32_request.wait();
  bf16_request.wait();
  i64_request.wait();
  EXPECT_TRUE(bf16_request.done());
  EXPECT_TRUE(i64_request.done());
  const float sum = static_cast<float>(n * (n - 1) / 2) + 0.5f * static_cast<float>(n);
  const std::vector<float> got = floats(f32);
  std::int64_t wrong = 0;
  for (const float value : got) wrong += value != sum;
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(floats(bf16), rounded_to_bf16({100.0f * n + static_cast<float>(n * (n - 1) / 2), 1.0f * n,
                                           -3.0f * static_cast<float>(n * (n - 1) / 2)}));
  EXPECT_EQ(values<std::int64_t>(i64), (std::vector<std::int64_t>{0, 5 - (n - 1)}));
}

// Positions where `a` and `b` differ in their bits (or all of the longer one's extra positions).
std::int64_t differing_bits(const std::vector<float>& a, const std::vector<float>& b) {
  std::int64_t differing = static_cast<std::int64_t>(a.size() > b.size() ? a.size() - b.size() : b.size() - a.size());
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) differing += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return differing;
}

// Positions where `got` is further than 1e-5 (relative, 1e-6 absolute) from the host reference.
std::int64_t far_from(const std::vector<float>& got, const std::vector<double>& expected) {
  std::int64_t far = static_cast<std::int64_t>(got.size() != expected.size());
  for (std::size_t i = 0; i < std::min(got.size(), expected.size()); ++i)
    far += !(std::abs(got[i] - expected[i]) <= 1e-6 + 1e-5 * std::abs(expected[i]));
  return far;
}

// The orderings (core/cuda_ordering.h) change when the work runs, never what it computes: the same
// collectives give the same bits under plain ordering (one stream, the host waits) and overlap
// ordering (NCCL on a communication stream ordered by events). Each collective's input is written
// by kernels queued just before it on the compute stream and its result read by a kernel queued
// just after: an overlap ordering that missed either event would reduce or read stale values (the
// tensors are large enough for the race to show). Both are also checked against sums computed on
// the host, so that a shared mistake fails too.
TEST_F(NcclCommunicatorTest, OverlapAndPlainOrderingsGiveBitIdenticalResults) {
  const int n = nccl().size(), r = nccl().rank();
  const std::int64_t count = (std::int64_t{1} << 20) + 3;
  // Fractional values, different on every rank: their sums round.
  auto value = [](int rank, std::int64_t i) {
    return static_cast<float>(std::sin(0.001 * static_cast<double>(i) * (rank + 1)) * 3.0 + 0.25 * rank);
  };
  std::vector<float> own(static_cast<std::size_t>(count));
  std::vector<double> sum(static_cast<std::size_t>(count), 0.0);
  for (std::int64_t i = 0; i < count; ++i) {
    own[static_cast<std::size_t>(i)] = value(r, i);
    for (int rank = 0; rank < n; ++rank) sum[static_cast<std::size_t>(i)] += value(rank, i);
  }
  const Tensor host = Tensor::from_vector<float>({count}, own);
  constexpr std::int64_t kSmall = 1000;  // the coalesced pair: [0, kSmall) and [kSmall, 3 kSmall)

  struct Results {
    std::vector<float> blocking, asynchronous, coalesced_first, coalesced_second;
  };
  auto run = [&](CudaOrdering ordering) {
    gpu().set_ordering(ordering);
    Results results;
    const Tensor source = on_gpu(host);
    // Blocking all-reduce of half the values, then own values added: Σ v / 2 + v_own.
    const Tensor a = gpu().empty({count});
    gpu().copy(a, source);
    gpu().scale(a, 0.5);
    nccl().all_reduce(a);
    gpu().accumulate(a, source);
    results.blocking = floats(a);
    // Asynchronous all-reduce with independent work queued before its wait: Σ v + 2 v_own.
    const Tensor b = gpu().empty({count});
    gpu().copy(b, source);
    Request request = nccl().all_reduce_async(b);
    const Tensor doubled = gpu().empty({count});
    gpu().copy(doubled, source);
    gpu().scale(doubled, 2.0);
    request.wait();
    gpu().accumulate(b, doubled);
    results.asynchronous = floats(b);
    // Coalesced all-reduce of two tensors (packed, reduced and unpacked on the communication
    // stream under overlap), then each doubled: 2 Σ v.
    const Tensor first = gpu().empty({kSmall}), second = gpu().empty({2 * kSmall});
    gpu().copy(first, source.slice_rows(0, kSmall));
    gpu().copy(second, source.slice_rows(kSmall, 3 * kSmall));
    nccl().all_reduce_coalesced(std::vector<Tensor>{first, second});
    gpu().scale(first, 2.0);
    gpu().scale(second, 2.0);
    results.coalesced_first = floats(first);
    results.coalesced_second = floats(second);
    return results;
  };
  const CudaOrdering original = gpu().ordering();
  const Results plain = run(CudaOrdering::Plain);
  const Results overlap = run(CudaOrdering::Overlap);
  gpu().set_ordering(original);

  EXPECT_EQ(differing_bits(overlap.blocking, plain.blocking), 0);
  EXPECT_EQ(differing_bits(overlap.asynchronous, plain.asynchronous), 0);
  EXPECT_EQ(differing_bits(overlap.coalesced_first, plain.coalesced_first), 0);
  EXPECT_EQ(differing_bits(overlap.coalesced_second, plain.coalesced_second), 0);

  std::vector<double> blocking(sum.size()), asynchronous(sum.size());
  for (std::size_t i = 0; i < sum.size(); ++i) {
    blocking[i] = 0.5 * sum[i] + own[i];
    asynchronous[i] = sum[i] + 2.0 * own[i];
  }
  const std::vector<double> coalesced_first(sum.begin(), sum.begin() + kSmall),
      coalesced_second(sum.begin() + kSmall, sum.begin() + 3 * kSmall);
  auto doubled = [](std::vector<double> values) {
    for (double& v : values) v *= 2.0;
    return values;
  };
  for (const Results* results : {&plain, &overlap}) {
    SCOPED_TRACE(results == &plain ? "plain" : "overlap");
    EXPECT_EQ(far_from(results->blocking, blocking), 0);
    EXPECT_EQ(far_from(results->asynchronous, asynchronous), 0);
    EXPECT_EQ(far_from(results->coalesced_first, doubled(coalesced_first)), 0);
    EXPECT_EQ(far_from(results->coalesced_second, doubled(coalesced_second)), 0);
  }
}

TEST_F(NcclCommunicatorTest, SubGroupsAreNcclCommunicators) {
  const int n = nccl().size(), r = nccl().rank();
  // 1. One list for everyone: the even ranks; the others get nullptr.
  std::vector<int> evens, odds;
  for (int rank = 0; rank < n; ++rank) (rank % 2 ? odds : evens).push_back(nccl().global_ranks()[rank]);
  std::unique_ptr<Communicator> even_group = nccl().group(evens);
  EXPECT_EQ(even_group != nullptr, r % 2 == 0);
  if (even_group) {
    EXPECT_STREQ(even_group->backend_name(), "nccl");
    EXPECT_EQ(even_group->size(), static_cast<int>(evens.size()));
    EXPECT_EQ(even_group->rank(), r / 2);
    const Tensor tensor = on_gpu(Tensor::full({4}, r + 1.0));
    even_group->all_reduce(tensor);
    float expected = 0.0f;
    for (const int rank : evens) expected += static_cast<float>(rank + 1);
    EXPECT_EQ(floats(tensor), std::vector<float>(4, expected));
  }
  even_group.reset();  // collective among its members
  // 2. Each rank passes the list of its own group (evens or odds): everyone gets a communicator.
  std::unique_ptr<Communicator> parity_group = nccl().group(r % 2 ? odds : evens);
  ASSERT_TRUE(parity_group != nullptr);
  const std::vector<int>& members = r % 2 ? odds : evens;
  EXPECT_EQ(parity_group->size(), static_cast<int>(members.size()));
  const Tensor tensor = on_gpu(Tensor::from_vector<std::int32_t>({1}, {r}));
  parity_group->all_reduce(tensor, ReduceOp::Max);
  EXPECT_EQ(values<std::int32_t>(tensor), (std::vector<std::int32_t>{members.back()}));
}

TEST_F(NcclCommunicatorTest, HostTensorsGoThroughTheControlCommunicator) {
  const int n = nccl().size(), r = nccl().rank();
  const int next = (r + 1) % n, previous = (r + n - 1) % n;
  const Tensor sum = Tensor::full({3}, r + 1.0);
  nccl().all_reduce(sum);
  EXPECT_EQ(sum.to_float_vector(), std::vector<float>(3, static_cast<float>(n * (n + 1) / 2)));
  const Tensor bf16 = bf16_tensor({2}, {1.0f * r, 2.0f});
  Request async = nccl().all_reduce_async(bf16, ReduceOp::Max);
  async.wait();
  EXPECT_EQ(bf16.to_float_vector(), (std::vector<float>{1.0f * (n - 1), 2.0f}));
  const Tensor broadcast = Tensor::full({2}, 10.0 * r);
  nccl().broadcast(broadcast, 0);
  EXPECT_EQ(broadcast.to_float_vector(), std::vector<float>(2, 0.0f));
  // A host ring (tags matched by MPI) and a mixed exchange with a device message in the same call.
  const Tensor host_out = Tensor::full({4}, 1.0 * r), host_in = Tensor::zeros({4});
  const Tensor device_out = on_gpu(Tensor::full({6}, 100.0 + r)), device_in = gpu().zeros({6});
  Request mixed = nccl().exchange(std::vector<SendSpec>{{host_out, next, 3}, {device_out, next, 4}},
                                  std::vector<ReceiveSpec>{{device_in, previous, 4}, {host_in, previous, 3}});
  mixed.wait();
  EXPECT_TRUE(mixed.done());
  EXPECT_EQ(host_in.to_float_vector(), std::vector<float>(4, 1.0f * previous));
  EXPECT_EQ(floats(device_in), std::vector<float>(6, 100.0f + previous));
  // Control data.
  EXPECT_EQ(nccl().all_reduce_scalar(r + 0.25, ReduceOp::Max), n - 1 + 0.25);
  std::string text = r == 0 ? "plan" : "";
  nccl().broadcast_bytes(text, 0);
  EXPECT_EQ(text, "plan");
  const std::vector<std::string> gathered = nccl().all_gather_bytes(std::to_string(r));
  ASSERT_EQ(gathered.size(), static_cast<std::size_t>(n));
  for (int rank = 0; rank < n; ++rank) EXPECT_EQ(gathered[static_cast<std::size_t>(rank)], std::to_string(rank));
  EXPECT_EQ(nccl().gather_bytes("x", 0).size(), r == 0 ? static_cast<std::size_t>(n) : 0u);
  nccl().barrier();
}

TEST_F(NcclCommunicatorTest, InvalidArgumentsAreErrorsBeforeAnythingStarts) {
  const int n = nccl().size();
  const Tensor tensor = gpu().zeros({2});
  expect_error([&] { (void)nccl().send(tensor, n, 0); }, "destination " + std::to_string(n) + " is out of range");
  expect_error([&] { (void)nccl().receive(tensor, -1, 0); }, "source -1 is out of range");
  expect_error([&] { (void)nccl().send(tensor, 0, -1); }, "tag -1 is out of range");
  expect_error([&] { (void)nccl().send(Tensor(), 0, 0); }, "undefined");
  expect_error([&] { nccl().all_reduce(Tensor()); }, "undefined");
  const std::vector<Tensor> mixed_dtypes = {tensor, gpu().zeros({2}, DType::BF16)};
  expect_error([&] { nccl().all_reduce_coalesced(mixed_dtypes); }, "has dtype bf16");
}

}  // namespace
}  // namespace partrain::comm
