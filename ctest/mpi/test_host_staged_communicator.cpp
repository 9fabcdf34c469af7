// MPI tests of comm::HostStagedCommunicator (run under mpiexec with 2, 3 or 4 ranks; see
// ctest/CMakeLists.txt): every operation through the host-staged communicator gives, bit for bit,
// what the same operation gives through the plain MpiCommunicator on the same values.
//
// The "device" is a CPU backend whose copies are deferred until synchronise() (DeferredCopyBackend
// below), as a GPU's copies are asynchronous on its stream: a communicator that let MPI read a staged
// copy before synchronising, or that returned before its results were copied back, would send or
// leave uninitialised memory and the comparison would fail. As in test_communicator.cpp, every rank
// makes the same sequence of collective calls (EXPECT_*, never an early return between collectives).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/device_communicator.h"
#include "comm/host_staged_communicator.h"
#include "comm/mpi_communicator.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/tensor.h"
#include "kernels/cpu/cpu_backend.h"
#include "support/errors.h"
#include "support/mpi_test_main.h"

namespace partrain::comm {
namespace {

using testing::expect_error;

MpiCommunicator& world() { return testing::mpi_world(); }

/// The CPU backend, except that copy() only queues the copy and synchronise() performs the queue in
/// order: the asynchronous copies of a GPU stream, on the host.
class DeferredCopyBackend final : public Backend {
 public:
  Device device() const override { return cpu_device(); }
  std::string name() const override { return "deferred-copy cpu"; }
  void synchronise() override {
    for (const auto& [destination, source] : pending_)
      if (source.nbytes()) std::memcpy(destination.raw_data(), source.raw_data(), source.nbytes());
    pending_.clear();
    ++synchronisations_;
  }
  void copy(const Tensor& destination, const Tensor& source) override {
    PARTRAIN_CHECK(destination.numel() == source.numel() && destination.dtype() == source.dtype(),
                   "DeferredCopyBackend::copy: mismatched tensors");
    pending_.push_back({destination, source});
  }
  // The rest is not used by the communicator; it runs on the CPU backend after the queued copies.
  void fill_zero(const Tensor& tensor) override { synchronise(), cpu().fill_zero(tensor); }
  void accumulate(const Tensor& accumulator, const Tensor& value) override {
    synchronise(), cpu().accumulate(accumulator, value);
  }
  void convert(const Tensor& destination, const Tensor& source) override {
    synchronise(), cpu().convert(destination, source);
  }
  double sum_of_squares(std::span<const Tensor> tensors, std::span<const double> weights) override {
    synchronise();
    return cpu().sum_of_squares(tensors, weights);
  }
  void scale(const Tensor& tensor, double factor) override { synchronise(), cpu().scale(tensor, factor); }
  void adamw_update(const Tensor& parameter, const Tensor& gradient, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                    const AdamWUpdate& update) override {
    synchronise(), cpu().adamw_update(parameter, gradient, exp_avg, exp_avg_sq, update);
  }
  void sgd_update(const Tensor& parameter, const Tensor& gradient, const Tensor& momentum_buffer,
                  const SgdUpdate& update) override {
    synchronise(), cpu().sgd_update(parameter, gradient, momentum_buffer, update);
  }

  /// Copies queued and not yet performed.
  std::size_t pending() const { return pending_.size(); }
  int synchronisations() const { return synchronisations_; }

 private:
  static Backend& cpu() { return cpu_backend(); }
  std::vector<std::pair<Tensor, Tensor>> pending_;
  int synchronisations_ = 0;
};

DeferredCopyBackend& device() {
  static DeferredCopyBackend backend;
  return backend;
}

/// A host-staged communicator over every rank (collective).
std::unique_ptr<HostStagedCommunicator> staged_world() {
  std::vector<int> everyone(world().global_ranks().begin(), world().global_ranks().end());
  return std::make_unique<HostStagedCommunicator>(world().group(everyone), device());
}

/// `count` values of `dtype` that differ by rank and `salt`; floats with many significant bits, so
/// that a sum in another order or precision would differ in the last bits.
Tensor values(DType dtype, std::int64_t count, int salt = 0) {
  const int rank = world().rank();
  std::vector<float> floats;
  for (std::int64_t i = 0; i < count; ++i)
    floats.push_back(0.1f * static_cast<float>(rank + 1) * static_cast<float>(salt + 1) +
                     0.0137f * static_cast<float>(i) - 0.3f * static_cast<float>((i + rank) % 3));
  switch (dtype) {
    case DType::F32: return Tensor::from_vector({count}, floats);
    case DType::BF16: {
      std::vector<BFloat16> narrow;
      for (const float value : floats) narrow.emplace_back(value);
      return Tensor::from_vector({count}, narrow);
    }
    case DType::I32: {
      std::vector<std::int32_t> integers;
      for (std::int64_t i = 0; i < count; ++i) integers.push_back(static_cast<std::int32_t>(1000 * rank - 7 * i + salt));
      return Tensor::from_vector({count}, integers);
    }
    case DType::I64: {
      std::vector<std::int64_t> integers;
      for (std::int64_t i = 0; i < count; ++i) integers.push_back((std::int64_t{rank} + 1) * (std::int64_t{1} << 35) - i + salt);
      return Tensor::from_vector({count}, integers);
    }
  }
  return {};
}

/// True when both tensors hold the same bytes.
bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

const DType kDtypes[] = {DType::F32, DType::BF16, DType::I32, DType::I64};
const ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min};

TEST(HostStagedCommunicator, DescribesTheHostCommunicator) {
  const auto staged = staged_world();
  EXPECT_EQ(staged->rank(), world().rank());
  EXPECT_EQ(staged->size(), world().size());
  EXPECT_STREQ(staged->backend_name(), "host-staged");
  EXPECT_EQ(staged->max_tag(), staged->host().max_tag());
  EXPECT_GE(staged->max_tag(), 32767);
  ASSERT_EQ(staged->global_ranks().size(), world().global_ranks().size());
  for (std::size_t i = 0; i < world().global_ranks().size(); ++i)
    EXPECT_EQ(staged->global_ranks()[i], world().global_ranks()[i]);
}

TEST(HostStagedCommunicator, AllReduceEveryDtypeAndOpMatchesMpi) {
  const auto staged = staged_world();
  for (const DType dtype : kDtypes)
    for (const ReduceOp op : kOps) {
      const Tensor expected = values(dtype, 37);
      const Tensor tensor = values(dtype, 37);
      world().all_reduce(expected, op);
      staged->all_reduce(tensor, op);
      EXPECT_TRUE(same_bytes(tensor, expected)) << dtype_name(dtype) << " " << reduce_op_name(op);
      EXPECT_EQ(device().pending(), 0u) << "all_reduce returned with copies not performed";
    }
}

TEST(HostStagedCommunicator, AllReduceAsyncWaitAndTestMatchMpi) {
  const auto staged = staged_world();
  const Tensor expected_f32 = values(DType::F32, 1000, 1), expected_bf16 = values(DType::BF16, 300, 2);
  // The host communicator's own non-blocking all-reduce: its algorithm (Open MPI's ring, see
  // MpiSession) adds in another order than the blocking one from 3 ranks on.
  world().all_reduce_async(expected_f32).wait();
  world().all_reduce_async(expected_bf16, ReduceOp::Sum).wait();
  const Tensor by_wait = values(DType::F32, 1000, 1), by_test = values(DType::BF16, 300, 2);
  Request waited = staged->all_reduce_async(by_wait);
  Request tested = staged->all_reduce_async(by_test, ReduceOp::Sum);
  while (!tested.test()) {
  }
  EXPECT_TRUE(tested.done());
  waited.wait();
  EXPECT_TRUE(same_bytes(by_wait, expected_f32));
  EXPECT_TRUE(same_bytes(by_test, expected_bf16));
  EXPECT_EQ(device().pending(), 0u);
}

TEST(HostStagedCommunicator, AllReduceCoalescedOfViewsMatchesMpi) {
  const auto staged = staged_world();
  for (const ReduceOp op : kOps) {
    const Tensor whole_expected = values(DType::F32, 64, 3), whole = values(DType::F32, 64, 3);
    const Tensor other_expected = values(DType::F32, 5, 4), other = values(DType::F32, 5, 4);
    const std::vector<Tensor> expected{whole_expected.slice_rows(10, 40), other_expected,
                                       whole_expected.slice_rows(50, 60)};
    const std::vector<Tensor> tensors{whole.slice_rows(10, 40), other, whole.slice_rows(50, 60)};
    world().all_reduce_coalesced(expected, op);
    staged->all_reduce_coalesced(tensors, op);
    // The rows outside the views are untouched on both.
    EXPECT_TRUE(same_bytes(whole, whole_expected)) << reduce_op_name(op);
    EXPECT_TRUE(same_bytes(other, other_expected)) << reduce_op_name(op);
  }
  const std::vector<Tensor> bf16_expected{values(DType::BF16, 9, 5), values(DType::BF16, 4, 6)};
  const std::vector<Tensor> bf16{values(DType::BF16, 9, 5), values(DType::BF16, 4, 6)};
  world().all_reduce_coalesced(bf16_expected);
  staged->all_reduce_coalesced(bf16);
  for (std::size_t i = 0; i < bf16.size(); ++i) EXPECT_TRUE(same_bytes(bf16[i], bf16_expected[i])) << i;
  staged->all_reduce_coalesced({});  // nothing to do, on every rank
}

TEST(HostStagedCommunicator, ReduceScatterAndAllGatherMatchMpi) {
  const auto staged = staged_world();
  const std::int64_t part = 13, whole = part * world().size();
  const Tensor input = values(DType::F32, whole, 7);
  const Tensor expected = Tensor::zeros({part}), output = Tensor::zeros({part}), async_output = Tensor::zeros({part});
  world().reduce_scatter(input.clone(), expected);
  staged->reduce_scatter(input.clone(), output);
  EXPECT_TRUE(same_bytes(output, expected));
  Request request = staged->reduce_scatter_async(input.clone(), async_output);
  request.wait();
  EXPECT_TRUE(same_bytes(async_output, expected));

  const Tensor mine = values(DType::F32, part, 8);
  const Tensor gathered_expected = Tensor::zeros({whole}), gathered = Tensor::zeros({whole});
  world().all_gather(mine, gathered_expected);
  staged->all_gather(mine, gathered);
  EXPECT_TRUE(same_bytes(gathered, gathered_expected));
  EXPECT_EQ(device().pending(), 0u);

  expect_error([&] { staged->reduce_scatter(Tensor::zeros({whole + 1}), output); }, "reduce_scatter");
  expect_error([&] { staged->all_gather(mine, Tensor::zeros({whole + 1})); }, "all_gather");
}

// ZeRO-1 in mixed precision gathers bf16 in place: each rank's part already sits in its slot of the
// whole buffer (runtime/zero_partition.cpp).
TEST(HostStagedCommunicator, InPlaceBf16AllGatherMatchesMpi) {
  const auto staged = staged_world();
  const std::int64_t part = 11, whole = part * world().size();
  const std::int64_t begin = part * world().rank();
  const Tensor expected = values(DType::BF16, whole, 9), gathered = values(DType::BF16, whole, 9);
  world().all_gather(expected.slice_rows(begin, begin + part), expected);
  staged->all_gather(gathered.slice_rows(begin, begin + part), gathered);
  EXPECT_TRUE(same_bytes(gathered, expected));
  EXPECT_EQ(device().pending(), 0u);
}

TEST(HostStagedCommunicator, BroadcastFromEveryRootMatchesMpi) {
  const auto staged = staged_world();
  for (int root = 0; root < world().size(); ++root)
    for (const DType dtype : kDtypes) {
      const Tensor expected = values(dtype, 21, root), tensor = values(dtype, 21, root);
      world().broadcast(expected, root);
      staged->broadcast(tensor, root);
      EXPECT_TRUE(same_bytes(tensor, expected)) << "root " << root << " " << dtype_name(dtype);
    }
  expect_error([&] { staged->broadcast(values(DType::F32, 3), world().size()); }, "out of range");
}

TEST(HostStagedCommunicator, RingSendReceiveMatchedByTagIntoViews) {
  const auto staged = staged_world();
  const int n = world().size(), r = world().rank();
  const int next = (r + 1) % n, previous = (r + n - 1) % n;
  // Two messages to the next rank, received in the other order (MPI matches by tag), the second
  // into rows of a larger tensor.
  const Tensor first = values(DType::F32, 6, 10), second = values(DType::BF16, 8, 11);
  const Tensor first_expected = Tensor::zeros({6}), second_expected = Tensor::zeros({8}, DType::BF16);
  {
    Request a = world().send(first, next, 1), b = world().send(second, next, 2);
    Request d = world().receive(second_expected, previous, 2), c = world().receive(first_expected, previous, 1);
    d.wait(), c.wait(), a.wait(), b.wait();
  }
  const Tensor first_received = Tensor::full({6}, -1.0);
  const Tensor rows = Tensor::full({12}, -1.0, DType::BF16);
  Request a = staged->send(first, next, 1), b = staged->send(second, next, 2);
  Request d = staged->receive(rows.slice_rows(2, 10), previous, 2);
  Request c = staged->receive(first_received, previous, 1);
  while (!d.test()) {
  }
  c.wait(), a.wait(), b.wait();
  EXPECT_TRUE(same_bytes(first_received, first_expected));
  EXPECT_TRUE(same_bytes(rows.slice_rows(2, 10), second_expected));
  const std::vector<float> outside = rows.to_float_vector();
  for (const std::size_t i : {0, 1, 10, 11}) EXPECT_EQ(outside[i], -1.0f) << "row " << i << " was overwritten";
  EXPECT_EQ(device().pending(), 0u);
}

TEST(HostStagedCommunicator, SendReadsTheStagedCopyAfterSynchronising) {
  // A changed source after send() returns must not change the message: the staged copy was made
  // (and synchronised) before send() returned.
  const auto staged = staged_world();
  const int n = world().size(), r = world().rank();
  const Tensor message = values(DType::I64, 9, 12);
  const Tensor expected = Tensor::zeros({9}, DType::I64), received = Tensor::zeros({9}, DType::I64);
  {
    Request send = world().send(message, (r + 1) % n, 5);
    world().receive(expected, (r + n - 1) % n, 5).wait();
    send.wait();
  }
  const int before = device().synchronisations();
  Request send = staged->send(message, (r + 1) % n, 5);
  EXPECT_GT(device().synchronisations(), before) << "send() did not synchronise the backend";
  message.zero();
  staged->receive(received, (r + n - 1) % n, 5).wait();
  send.wait();
  EXPECT_TRUE(same_bytes(received, expected));
}

TEST(HostStagedCommunicator, ExchangeWithEveryRankMatchesMpi) {
  const auto staged = staged_world();
  const int n = world().size();
  std::vector<SendSpec> sends, staged_sends;
  std::vector<ReceiveSpec> expected, received;
  for (int peer = 0; peer < n; ++peer) {
    const Tensor message = values(DType::F32, 4 + peer, 20 + peer);
    sends.push_back({message, peer, 3});
    staged_sends.push_back({message.clone(), peer, 3});
  }
  // Rank r receives 4 + r elements from every peer.
  for (int peer = 0; peer < n; ++peer) {
    expected.push_back({Tensor::zeros({4 + world().rank()}), peer, 3});
    received.push_back({Tensor::zeros({4 + world().rank()}), peer, 3});
  }
  world().exchange(sends, expected).wait();
  staged->exchange(staged_sends, received).wait();
  for (int peer = 0; peer < n; ++peer)
    EXPECT_TRUE(same_bytes(received[static_cast<std::size_t>(peer)].tensor, expected[static_cast<std::size_t>(peer)].tensor))
        << "from rank " << peer;
  EXPECT_EQ(device().pending(), 0u);
}

TEST(HostStagedCommunicator, SubgroupsAreHostStagedAndMatchMpiSubgroups) {
  const auto staged = staged_world();
  const int r = world().rank();
  // Each rank passes the list of its own group: the even ranks and the odd ranks.
  std::vector<int> mine;
  for (int rank = r % 2; rank < world().size(); rank += 2) mine.push_back(rank);
  const std::unique_ptr<Communicator> host_group = world().group(mine);
  const std::unique_ptr<Communicator> staged_group = staged->group(mine);
  ASSERT_TRUE(staged_group != nullptr);
  EXPECT_STREQ(staged_group->backend_name(), "host-staged");
  EXPECT_EQ(staged_group->size(), host_group->size());
  EXPECT_EQ(staged_group->rank(), host_group->rank());
  const Tensor expected = values(DType::F32, 17, 30), tensor = values(DType::F32, 17, 30);
  host_group->all_reduce(expected);
  staged_group->all_reduce(tensor);
  EXPECT_TRUE(same_bytes(tensor, expected));
  Request request = staged_group->all_reduce_async(tensor);  // the group's own requests work too
  host_group->all_reduce(expected);
  request.wait();
  EXPECT_TRUE(same_bytes(tensor, expected));

  // The same list on every rank: ranks outside it get nullptr.
  const std::vector<int> first_two{1, 0};
  const std::unique_ptr<Communicator> pair = staged->group(first_two);
  EXPECT_EQ(pair != nullptr, r < 2);
  if (pair) {
    EXPECT_EQ(pair->rank(), 1 - r);
    const Tensor sum = values(DType::I32, 3, 40);
    pair->all_reduce(sum);
    const std::int32_t* result = sum.data<std::int32_t>();
    for (int i = 0; i < 3; ++i) EXPECT_EQ(result[i], 1000 - 14 * i + 80) << i;  // ranks 0 and 1, by hand
  }
}

TEST(HostStagedCommunicator, BytesScalarsAndBarrierGoToTheHostCommunicator) {
  const auto staged = staged_world();
  const int n = world().size(), r = world().rank();
  EXPECT_EQ(staged->all_reduce_scalar(r + 0.5), n * (n - 1) / 2.0 + 0.5 * n);
  std::string bytes = r == 1 ? "from one" : "";
  staged->broadcast_bytes(bytes, 1);
  EXPECT_EQ(bytes, "from one");
  const std::vector<std::string> all = staged->all_gather_bytes(std::to_string(r));
  ASSERT_EQ(all.size(), static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) EXPECT_EQ(all[static_cast<std::size_t>(i)], std::to_string(i));
  EXPECT_EQ(staged->gather_bytes("x", 0).size(), r == 0 ? static_cast<std::size_t>(n) : 0u);
  staged->barrier();
}

TEST(HostStagedCommunicator, RejectsUndefinedTensors) {
  const auto staged = staged_world();
  expect_error([&] { staged->all_reduce(Tensor()); }, "undefined");
  expect_error([&] { (void)staged->send(Tensor(), 0, 0); }, "undefined");
}

// ---- the environment variables of comm/device_communicator.h ----

/// Sets an environment variable for the scope (unset afterwards).
class ScopedEnvironment {
 public:
  ScopedEnvironment(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedEnvironment() { ::unsetenv(name_); }

 private:
  const char* name_;
};

TEST(DeviceCommunicatorEnvironment, ChoiceIsReadAndCheckedEvenOnTheCpu) {
  EXPECT_EQ(device_communicator_from_environment(), DeviceCommunicatorChoice::Auto);
  {
    ScopedEnvironment host("PARTRAIN_DEVICE_COMMUNICATOR", "host");
    EXPECT_EQ(device_communicator_from_environment(), DeviceCommunicatorChoice::Host);
    EXPECT_TRUE(make_device_world(world(), cpu_backend()) == nullptr);  // the CPU uses MPI directly
  }
  {
    ScopedEnvironment nccl("PARTRAIN_DEVICE_COMMUNICATOR", "nccl");
    EXPECT_EQ(device_communicator_from_environment(), DeviceCommunicatorChoice::Nccl);
  }
  {
    ScopedEnvironment bad("PARTRAIN_DEVICE_COMMUNICATOR", "gloo");
    expect_error([] { (void)make_device_world(world(), cpu_backend()); }, "PARTRAIN_DEVICE_COMMUNICATOR=\"gloo\"");
  }
}

TEST(DeviceCommunicatorEnvironment, NcclTimeoutInSeconds) {
  using std::chrono::milliseconds;
  EXPECT_EQ(nccl_timeout_from_environment(milliseconds(600000)), milliseconds(600000));
  {
    ScopedEnvironment minute("PARTRAIN_NCCL_TIMEOUT_SECONDS", "60");
    EXPECT_EQ(nccl_timeout_from_environment(milliseconds(600000)), milliseconds(60000));
  }
  {
    ScopedEnvironment fraction("PARTRAIN_NCCL_TIMEOUT_SECONDS", "2.5");
    EXPECT_EQ(nccl_timeout_from_environment(milliseconds(600000)), milliseconds(2500));
  }
  {
    ScopedEnvironment unlimited("PARTRAIN_NCCL_TIMEOUT_SECONDS", "0");
    EXPECT_EQ(nccl_timeout_from_environment(milliseconds(600000)), milliseconds(0));
  }
  for (const char* bad : {"ten", "-1", "60s", "1e9", "nan"}) {
    ScopedEnvironment variable("PARTRAIN_NCCL_TIMEOUT_SECONDS", bad);
    expect_error([] { (void)nccl_timeout_from_environment(std::chrono::milliseconds(1)); },
                 std::string("PARTRAIN_NCCL_TIMEOUT_SECONDS=\"") + bad + "\"");
  }
}

}  // namespace
}  // namespace partrain::comm
