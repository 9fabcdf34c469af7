// Unit tests of the communicator of CAPSlog's trimmed profiling runs (app/trimmed_pipeline_communicator.h):
// receives give zeros of the right size, sends hold their tensor (allocator bytes) until waited for
// as an MPI send request does, collectives keep the rank's own data, groups contain this rank only
// when listed.
#include <gtest/gtest.h>

#include <vector>

#include "app/trimmed_pipeline_communicator.h"
#include "core/allocator.h"
#include "core/backend.h"
#include "core/error.h"
#include "kernels/cpu/cpu_backend.h"

namespace {

using namespace partrain;

TEST(TrimmedPipelineCommunicator, ReceivesZerosAndHoldsSendsUntilWaited) {
  Backend& backend = cpu_backend();
  app::TrimmedPipelineCommunicator world(4, 2, backend);
  EXPECT_EQ(world.rank(), 2);
  EXPECT_EQ(world.size(), 4);
  Tensor buffer = to_backend(Tensor::from_vector<float>({3}, {1, 2, 3}), backend);
  world.receive(buffer, 1, 7).wait();
  EXPECT_EQ(to_host(buffer, backend).to_float_vector(), (std::vector<float>{0, 0, 0}));

  CachingAllocator& allocator = backend.allocator();
  const std::size_t before = allocator.current_bytes();
  comm::Request request;
  {
    Tensor sent = backend.zeros({1 << 16});
    request = world.send(sent, 3, 7);
  }
  // The tensor handle is gone, but the pending send keeps its storage, as MPI's does.
  EXPECT_EQ(allocator.current_bytes(), before + CachingAllocator::rounded_size((1 << 16) * sizeof(float)));
  request.wait();
  EXPECT_EQ(allocator.current_bytes(), before);
}

TEST(TrimmedPipelineCommunicator, CollectivesKeepTheRanksDataAndGroupsListIt) {
  Backend& backend = cpu_backend();
  app::TrimmedPipelineCommunicator world(4, 1, backend);
  Tensor values = to_backend(Tensor::from_vector<float>({2}, {5, 6}), backend);
  world.all_reduce(values);
  EXPECT_EQ(to_host(values, backend).to_float_vector(), (std::vector<float>{5, 6}));
  EXPECT_EQ(world.all_reduce_scalar(3.5), 3.5);
  const std::vector<std::string> gathered = world.gather_bytes("x", 1);
  ASSERT_EQ(gathered.size(), 4u);
  EXPECT_EQ(gathered[1], "x");
  EXPECT_TRUE(world.gather_bytes("x", 0).empty());
  const std::vector<int> tied{0, 1, 3};
  std::unique_ptr<comm::Communicator> group = world.group(tied);
  ASSERT_NE(group, nullptr);
  EXPECT_EQ(group->rank(), 1);
  EXPECT_EQ(group->size(), 3);
  const std::vector<int> others{0, 3};
  EXPECT_EQ(world.group(others), nullptr);
  // reduce_scatter / all_gather move this rank's part only.
  std::unique_ptr<comm::Communicator> pair = world.group(std::vector<int>{0, 1});
  Tensor whole = to_backend(Tensor::from_vector<float>({4}, {1, 2, 3, 4}), backend);
  Tensor part = backend.zeros({2});
  pair->reduce_scatter(whole, part);
  EXPECT_EQ(to_host(part, backend).to_float_vector(), (std::vector<float>{3, 4}));
  EXPECT_THROW(app::TrimmedPipelineCommunicator(2, 2, backend), Error);
}

// The executor's coalesced all-reduces (tied parameters, unbucketed replicas) and ZeRO-1's in-place
// all-gather leave the rank's data as it is; ctest/cuda/test_cuda_backend.cpp does the same with
// device tensors, which the default all_reduce_coalesced (host tensors only) refused.
TEST(TrimmedPipelineCommunicator, CoalescedAllReduceAndInPlaceAllGatherKeepTheData) {
  Backend& backend = cpu_backend();
  app::TrimmedPipelineCommunicator world(2, 1, backend);
  const std::vector<Tensor> bucket{to_backend(Tensor::from_vector<float>({2}, {1, 2}), backend),
                                   to_backend(Tensor::from_vector<float>({3}, {3, 4, 5}), backend)};
  world.all_reduce_coalesced(bucket);
  EXPECT_EQ(to_host(bucket[0], backend).to_float_vector(), (std::vector<float>{1, 2}));
  EXPECT_EQ(to_host(bucket[1], backend).to_float_vector(), (std::vector<float>{3, 4, 5}));
  const Tensor whole = to_backend(Tensor::from_vector<float>({4}, {1, 2, 3, 4}), backend);
  world.all_gather(whole.slice_rows(2, 4), whole);  // this rank's part, in place
  EXPECT_EQ(to_host(whole, backend).to_float_vector(), (std::vector<float>{1, 2, 3, 4}));
}

}  // namespace
