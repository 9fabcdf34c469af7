// MPI tests of comm::MpiCommunicator (run under mpiexec with 2, 3 or 4 ranks; see ctest/CMakeLists.txt).
// Every rank runs every test; each test makes the same sequence of collective calls on every rank
// (EXPECT_*, never an early return between collectives) so that a failure cannot hang the others.
#include <gtest/gtest.h>
#include <mpi.h>

#include <time.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/mpi_communicator.h"
#include "core/error.h"
#include "core/tensor.h"
#include "support/mpi_test_main.h"
#include "support/errors.h"

namespace partrain::comm {
namespace {

MpiCommunicator& world() { return testing::mpi_world(); }

using testing::expect_error;

TEST(MpiCommunicator, WorldMatchesMpiCommWorld) {
  int rank = -1, size = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  EXPECT_EQ(world().rank(), rank);
  EXPECT_EQ(world().size(), size);
  EXPECT_STREQ(world().backend_name(), "mpi");
  EXPECT_GE(world().max_tag(), 32767);
  ASSERT_EQ(world().global_ranks().size(), static_cast<std::size_t>(size));
  for (int i = 0; i < size; ++i) EXPECT_EQ(world().global_ranks()[static_cast<std::size_t>(i)], i);
  EXPECT_EQ(group_rank_of(world(), rank), rank);
  EXPECT_EQ(group_rank_of(world(), size), -1);
}

TEST(MpiCommunicator, RingSendReceiveEveryDtypeMatchedByTag) {
  const int n = world().size(), r = world().rank();
  const int next = (r + 1) % n, previous = (r + n - 1) % n;
  auto f32_values = [](int sender) {
    std::vector<float> values(12);
    for (int i = 0; i < 12; ++i) values[static_cast<std::size_t>(i)] = 100.0f * sender + i + 0.5f;
    return values;
  };
  auto bf16_values = [](int sender) {  // small integers and quarters: exact in bf16
    std::vector<BFloat16> values;
    for (int i = 0; i < 5; ++i) values.emplace_back(static_cast<float>(sender) + 0.25f * i);
    return values;
  };
  auto i32_values = [](int sender) {
    std::vector<std::int32_t> values;
    for (int i = 0; i < 7; ++i) values.push_back(-1000 * sender - i);
    return values;
  };
  auto i64_values = [](int sender) {
    std::vector<std::int64_t> values;
    for (int i = 0; i < 2; ++i) values.push_back((std::int64_t{sender} + 1) * (std::int64_t{1} << 40) + i);
    return values;
  };
  const Tensor send_f32 = Tensor::from_vector<float>({3, 4}, f32_values(r));
  const Tensor send_bf16 = Tensor::from_vector<BFloat16>({5}, bf16_values(r));
  const Tensor send_i32 = Tensor::from_vector<std::int32_t>({7}, i32_values(r));
  const Tensor send_i64 = Tensor::from_vector<std::int64_t>({2}, i64_values(r));
  const Tensor receive_f32 = Tensor::zeros({3, 4}, DType::F32);
  const Tensor receive_bf16 = Tensor::zeros({5}, DType::BF16);
  const Tensor receive_i32 = Tensor::zeros({7}, DType::I32);
  const Tensor receive_i64 = Tensor::zeros({2}, DType::I64);

  std::vector<Request> requests;
  // Receives in the reverse order of the sends: only the tags can match them correctly.
  requests.push_back(world().receive(receive_i64, previous, 14));
  requests.push_back(world().receive(receive_i32, previous, 13));
  requests.push_back(world().receive(receive_bf16, previous, 12));
  requests.push_back(world().receive(receive_f32, previous, 11));
  requests.push_back(world().send(send_f32, next, 11));
  requests.push_back(world().send(send_bf16, next, 12));
  requests.push_back(world().send(send_i32, next, 13));
  requests.push_back(world().send(send_i64, next, 14));
  wait_all(requests);
  for (const Request& request : requests) EXPECT_TRUE(request.done());

  const std::vector<float> expected_f32 = f32_values(previous);
  EXPECT_EQ(std::vector<float>(receive_f32.data<float>(), receive_f32.data<float>() + 12), expected_f32);
  const std::vector<BFloat16> expected_bf16 = bf16_values(previous);
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(static_cast<float>(receive_bf16.data<BFloat16>()[i]), static_cast<float>(expected_bf16[i]));
  EXPECT_EQ(std::vector<std::int32_t>(receive_i32.data<std::int32_t>(), receive_i32.data<std::int32_t>() + 7),
            i32_values(previous));
  EXPECT_EQ(std::vector<std::int64_t>(receive_i64.data<std::int64_t>(), receive_i64.data<std::int64_t>() + 2),
            i64_values(previous));
}

// Values that identify the sender, the tag and the element (exact in fp32: below 2^24).
float message_value(int sender, int tag, std::int64_t element) {
  return static_cast<float>(sender * (1 << 21) + tag * (1 << 19) + element);
}

TEST(MpiCommunicator, ExchangeWithBothNeighboursInOneGroupedCallLargeMessages) {
  // 1 MiB per message: beyond the eager limit, so blocking sends in this order would deadlock.
  const int n = world().size(), r = world().rank();
  const int left = (r + n - 1) % n, right = (r + 1) % n;
  const std::int64_t count = 1 << 18;
  auto filled = [&](int sender, int tag) {
    Tensor tensor = Tensor::empty({count}, DType::F32);
    for (std::int64_t i = 0; i < count; ++i) tensor.data<float>()[i] = message_value(sender, tag, i);
    return tensor;
  };
  const Tensor from_left = Tensor::zeros({count}), from_right = Tensor::zeros({count});
  // Tag 1: a message to the left neighbour; tag 2: to the right one. Sends listed first on purpose.
  const std::vector<SendSpec> sends = {{filled(r, 1), left, 1}, {filled(r, 2), right, 2}};
  const std::vector<ReceiveSpec> receives = {{from_right, right, 1}, {from_left, left, 2}};
  Request request = world().exchange(sends, receives);
  EXPECT_FALSE(request.done());
  request.wait();
  EXPECT_TRUE(request.done());
  std::int64_t wrong_left = 0, wrong_right = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    wrong_left += from_left.data<float>()[i] != message_value(left, 2, i);
    wrong_right += from_right.data<float>()[i] != message_value(right, 1, i);
  }
  EXPECT_EQ(wrong_left, 0);
  EXPECT_EQ(wrong_right, 0);
}

TEST(MpiCommunicator, ExchangeWithItselfAndIntoRowSlices) {
  const int r = world().rank();
  const std::int64_t rows = 512, columns = 256;  // 512 KiB
  Tensor source = Tensor::empty({rows, columns});
  for (std::int64_t i = 0; i < rows * columns; ++i) source.data<float>()[i] = message_value(r, 3, i % (1 << 18));
  const Tensor destination = Tensor::zeros({rows, columns});
  // Two halves into row slices of one tensor (how sample ranges of a microbatch are redistributed).
  const std::vector<SendSpec> sends = {{source.slice_rows(0, rows / 2), r, 3}, {source.slice_rows(rows / 2, rows), r, 4}};
  const std::vector<ReceiveSpec> receives = {{destination.slice_rows(rows / 2, rows), r, 4},
                                             {destination.slice_rows(0, rows / 2), r, 3}};
  world().exchange(sends, receives).wait();
  EXPECT_EQ(destination.to_float_vector(), source.to_float_vector());
}

TEST(MpiCommunicator, TestPollsUntilTheMessageArrives) {
  const int n = world().size(), r = world().rank();
  const Tensor received = Tensor::zeros({4}, DType::I32);
  Request receive = world().receive(received, (r + n - 1) % n, 21);
  EXPECT_FALSE(receive.test());  // nothing is sent before every rank has passed the barrier
  world().barrier();
  Request send = world().send(Tensor::from_vector<std::int32_t>({4}, {r, r + 1, r + 2, r + 3}), (r + 1) % n, 21);
  while (!receive.test()) {
  }
  send.wait();
  const int p = (r + n - 1) % n;
  EXPECT_EQ(std::vector<std::int32_t>(received.data<std::int32_t>(), received.data<std::int32_t>() + 4),
            (std::vector<std::int32_t>{p, p + 1, p + 2, p + 3}));
  EXPECT_TRUE(receive.test());  // stays complete
}

// With sleeping waits (on by default where the node has more ranks than CPUs) a rank waiting for a
// receive, an all-reduce or a barrier leaves its core to others: rank 0 sleeps 200 ms before it takes
// part, and the others' CPU time over their wait stays under half of it (a spinning wait burns all
// of it, or two thirds with 3–4 ranks on 2 cores; waking every 50–250 µs to test costs 5% of it on a
// quiet machine, a quarter beside a loaded CI run). The results are those of the blocking calls.
TEST(MpiCommunicator, SleepingWaitsLeaveTheCoreToOthers) {
  const int n = world().size(), r = world().rank();
  const bool before = MpiCommunicator::sleeping_waits_enabled();
  MpiCommunicator::set_sleeping_waits(true);
  const auto cpu_seconds = [] {
    timespec now{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
    return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
  };
  const auto wall_seconds = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  };
  for (const char* what : {"receive", "all_reduce_scalar", "barrier"}) {
    world().barrier();
    const double cpu = cpu_seconds(), wall = wall_seconds();
    double sum = 0;
    const Tensor received = Tensor::zeros({2});
    if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (std::string(what) == "receive") {
      if (r == 0) {
        for (int peer = 1; peer < n; ++peer) world().send(Tensor::from_vector<float>({2}, {1.0f, 2.0f}), peer, 31).wait();
      } else {
        world().receive(received, 0, 31).wait();
        EXPECT_EQ(received.data<float>()[1], 2.0f);
      }
    } else if (std::string(what) == "all_reduce_scalar") {
      sum = world().all_reduce_scalar(r + 1.0, ReduceOp::Sum);
      EXPECT_DOUBLE_EQ(sum, n * (n + 1) / 2.0);
    } else {
      world().barrier();
    }
    const double waited = wall_seconds() - wall, used = cpu_seconds() - cpu;
    if (r != 0) {
      EXPECT_GT(waited, 0.15) << what;
      EXPECT_LT(used, 0.5 * waited) << what << ": " << used << " s of CPU over a " << waited << " s wait";
    }
  }
  MpiCommunicator::set_sleeping_waits(before);
}

TEST(MpiCommunicator, DestroyingAnUnfinishedRequestWaitsForIt) {
  const int n = world().size(), r = world().rank();
  const Tensor received = Tensor::zeros({3});
  Request send;
  {
    Request receive = world().receive(received, (r + n - 1) % n, 22);
    send = world().send(Tensor::from_vector<float>({3}, {1.0f * r, 2.0f * r, 3.0f * r}), (r + 1) % n, 22);
  }  // the receive's destructor waited: the data is in place without wait()
  const float p = static_cast<float>((r + n - 1) % n);
  EXPECT_EQ(received.to_float_vector(), (std::vector<float>{p, 2 * p, 3 * p}));
  send.wait();
}

TEST(MpiCommunicator, AllReduceF32SumMaxMinMatchClosedForms) {
  const int n = world().size(), r = world().rank();
  const std::int64_t count = 1000;
  auto make = [&] {
    std::vector<float> values(count);
    for (std::int64_t i = 0; i < count; ++i)
      values[static_cast<std::size_t>(i)] = static_cast<float>((r + 1) * (r + 1)) + 0.5f * i;
    return Tensor::from_vector<float>({10, 100}, values);
  };
  const Tensor sum = make(), max = make(), min = make();
  world().all_reduce(sum);
  world().all_reduce(max, ReduceOp::Max);
  world().all_reduce(min, ReduceOp::Min);
  const double squares = n * (n + 1) * (2.0 * n + 1) / 6;  // sum over ranks of (r+1)^2
  std::int64_t wrong = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    wrong += sum.data<float>()[i] != static_cast<float>(squares + 0.5 * n * i);
    wrong += max.data<float>()[i] != static_cast<float>(n * n + 0.5 * i);
    wrong += min.data<float>()[i] != static_cast<float>(1 + 0.5 * i);
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(sum.data<float>()[7], static_cast<float>(squares + 3.5 * n));
}

TEST(MpiCommunicator, AllReduceIntegersAndBf16RoundedOnce) {
  const int n = world().size(), r = world().rank();
  const std::int64_t big = std::int64_t{1} << 33;
  const Tensor i64 = Tensor::from_vector<std::int64_t>({2}, {r * big + 1, -r});
  world().all_reduce(i64);
  EXPECT_EQ(i64.data<std::int64_t>()[0], big * n * (n - 1) / 2 + n);
  EXPECT_EQ(i64.data<std::int64_t>()[1], -n * (n - 1) / 2);
  const Tensor i32 = Tensor::from_vector<std::int32_t>({2}, {r * 7, -r * 7});
  world().all_reduce(i32, ReduceOp::Max);
  EXPECT_EQ(i32.data<std::int32_t>()[0], (n - 1) * 7);
  EXPECT_EQ(i32.data<std::int32_t>()[1], 0);
  // bf16: rank 0 holds 256, the others 1. Accumulated in fp32 the sum is 255 + n, rounded once;
  // adding in bf16 would lose every 1 (256 + 1 rounds to 256).
  const Tensor bf16 = Tensor::from_vector<BFloat16>({2}, {BFloat16(r == 0 ? 256.0f : 1.0f), BFloat16(0.5f * (r + 1))});
  world().all_reduce(bf16);
  EXPECT_EQ(static_cast<float>(bf16.data<BFloat16>()[0]), static_cast<float>(BFloat16(255.0f + n)));
  EXPECT_EQ(static_cast<float>(bf16.data<BFloat16>()[1]), 0.25f * n * (n + 1));
  // f16 likewise: rank 0 holds 2048 (fp16's spacing there is 2), the others 1: 2047 + n in fp32,
  // rounded once (adding in fp16 would stay at 2048 from 3 ranks on).
  const Tensor f16 = Tensor::from_vector<Float16>({2}, {Float16(r == 0 ? 2048.0f : 1.0f), Float16(0.5f * (r + 1))});
  world().all_reduce(f16);
  EXPECT_EQ(static_cast<float>(f16.data<Float16>()[0]), static_cast<float>(Float16(2047.0f + n)));
  EXPECT_EQ(static_cast<float>(f16.data<Float16>()[1]), 0.25f * n * (n + 1));
}

TEST(MpiCommunicator, AllReduceAsyncSeveralInFlight) {
  const int n = world().size(), r = world().rank();
  const Tensor f32 = Tensor::from_vector<float>({3}, {1.0f * r, 2.0f, -1.0f * r});
  const Tensor bf16 = Tensor::from_vector<BFloat16>({1}, {BFloat16(r == 0 ? 256.0f : 1.0f)});
  const Tensor i32 = Tensor::from_vector<std::int32_t>({1}, {r});
  std::vector<Request> requests;
  requests.push_back(world().all_reduce_async(f32));
  requests.push_back(world().all_reduce_async(bf16));
  requests.push_back(world().all_reduce_async(i32, ReduceOp::Max));
  wait_all(requests);
  EXPECT_EQ(f32.to_float_vector(), (std::vector<float>{n * (n - 1) / 2.0f, 2.0f * n, -n * (n - 1) / 2.0f}));
  EXPECT_EQ(static_cast<float>(bf16.data<BFloat16>()[0]), static_cast<float>(BFloat16(255.0f + n)));
  EXPECT_EQ(i32.data<std::int32_t>()[0], n - 1);
}

// A gradient bucket's size, reduced in place without blocking (the bucketed all-reduce's call), with
// a count no rank count divides (the ring's uneven segments).
TEST(MpiCommunicator, AllReduceAsyncLargeInPlace) {
  const int n = world().size(), r = world().rank();
  constexpr std::int64_t kCount = (1 << 20) + 3;
  std::vector<float> values(kCount);
  for (std::int64_t i = 0; i < kCount; ++i) values[static_cast<std::size_t>(i)] = static_cast<float>((i % 7) + r);
  const Tensor buffer = Tensor::from_vector<float>({kCount}, values);
  world().all_reduce_async(buffer).wait();
  const float* sums = buffer.data<float>();
  std::int64_t wrong = 0;
  for (std::int64_t i = 0; i < kCount; ++i) wrong += sums[i] != static_cast<float>(n * (i % 7) + n * (n - 1) / 2);
  EXPECT_EQ(wrong, 0);
}

// MpiSession asks Open MPI's non-blocking all-reduce for its ring (the in-place default is a binomial
// tree, 2.4x slower for ResNet's gradients on 2 ranks), unless the user chose an algorithm. Read back
// through MPI's tool interface; skipped under an MPI without that variable.
TEST(MpiCommunicator, NonblockingAllReduceUsesTheRing) {
  int provided = 0;
  ASSERT_EQ(MPI_T_init_thread(MPI_THREAD_SINGLE, &provided), MPI_SUCCESS);
  int index = -1;
  if (MPI_T_cvar_get_index("coll_libnbc_iallreduce_algorithm", &index) != MPI_SUCCESS) {
    MPI_T_finalize();
    GTEST_SKIP() << "this MPI has no coll_libnbc_iallreduce_algorithm (not Open MPI's libnbc)";
  }
  MPI_T_cvar_handle handle;
  int count = 0, algorithm = -1;
  ASSERT_EQ(MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count), MPI_SUCCESS);
  EXPECT_EQ(MPI_T_cvar_read(handle, &algorithm), MPI_SUCCESS);
  MPI_T_cvar_handle_free(&handle);
  MPI_T_finalize();
  const char* chosen = std::getenv(kNonblockingAllReduceAlgorithmVariable);
  ASSERT_NE(chosen, nullptr);  // MpiSession sets it when the user did not
  EXPECT_EQ(algorithm, std::atoi(chosen));
}

TEST(MpiCommunicator, AllReduceCoalescedBucket) {
  const int n = world().size(), r = world().rank();
  const std::vector<Tensor> bucket = {Tensor::full({3}, 1.0 + r), Tensor::full({2, 2}, 10.0 * (r + 1)),
                                      Tensor::zeros({0}), Tensor::full({5}, -0.5 * r)};
  world().all_reduce_coalesced(bucket);
  const float triangle = n * (n - 1) / 2.0f;
  EXPECT_EQ(bucket[0].to_float_vector(), std::vector<float>(3, n + triangle));
  EXPECT_EQ(bucket[1].to_float_vector(), std::vector<float>(4, 10.0f * (n + triangle)));
  EXPECT_EQ(bucket[3].to_float_vector(), std::vector<float>(5, -0.5f * triangle));
  const std::vector<Tensor> mixed = {Tensor::zeros({1}), Tensor::zeros({1}, DType::I32)};
  expect_error([&] { world().all_reduce_coalesced(mixed); }, "tensor 1 has dtype i32");
}

TEST(MpiCommunicator, AllReduceScalar) {
  const int n = world().size(), r = world().rank();
  EXPECT_EQ(world().all_reduce_scalar((r + 1.0) * (r + 1.0)), n * (n + 1) * (2.0 * n + 1) / 6);
  EXPECT_EQ(world().all_reduce_scalar(r * 0.25, ReduceOp::Max), (n - 1) * 0.25);
  EXPECT_EQ(world().all_reduce_scalar(10.0 - r, ReduceOp::Min), 11.0 - n);
}

TEST(MpiCommunicator, BroadcastTensorsAndBytes) {
  const int n = world().size(), r = world().rank();
  const int root = n - 1;
  std::vector<float> values(12);
  for (int i = 0; i < 12; ++i) values[static_cast<std::size_t>(i)] = 1.5f * i + 7;
  const Tensor f32 = r == root ? Tensor::from_vector<float>({4, 3}, values) : Tensor::zeros({4, 3});
  const Tensor i64 = Tensor::from_vector<std::int64_t>({2}, {r * 3, -r});
  world().broadcast(f32, root);
  world().broadcast(i64, 0);
  EXPECT_EQ(f32.to_float_vector(), values);
  EXPECT_EQ(i64.data<std::int64_t>()[0], 0);
  EXPECT_EQ(i64.data<std::int64_t>()[1], 0);

  std::string text = "stale text on rank " + std::to_string(r);
  std::string expected(std::string("plan\0json ", 10) + std::string(3000, 'x') + "from root");
  if (r == root) text = expected;
  world().broadcast_bytes(text, root);
  EXPECT_EQ(text, expected);
  std::string empty = r == 0 ? "" : "not empty";
  world().broadcast_bytes(empty, 0);
  EXPECT_EQ(empty, "");
}

std::string rank_bytes(int rank) { return std::string(static_cast<std::size_t>(rank) * 5, static_cast<char>('a' + rank)) + (rank % 2 ? std::string("\0!", 2) : ""); }

TEST(MpiCommunicator, GatherAndAllGatherBytes) {
  const int n = world().size(), r = world().rank();
  const int root = 1 % n;
  const std::vector<std::string> gathered = world().gather_bytes(rank_bytes(r), root);
  if (r == root) {
    ASSERT_EQ(gathered.size(), static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) EXPECT_EQ(gathered[static_cast<std::size_t>(i)], rank_bytes(i)) << "rank " << i;
  } else {
    EXPECT_TRUE(gathered.empty());
  }
  const std::vector<std::string> all = world().all_gather_bytes(rank_bytes(r));
  ASSERT_EQ(all.size(), static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) EXPECT_EQ(all[static_cast<std::size_t>(i)], rank_bytes(i)) << "rank " << i;
}

TEST(MpiCommunicator, GroupOfConsecutivePairsReducesPerGroup) {
  // {0,1}, {2,3} (a lone {2} at 3 ranks): every rank passes the list of its own group.
  const int n = world().size(), r = world().rank();
  std::vector<int> members = {r - r % 2};
  if (members[0] + 1 < n) members.push_back(members[0] + 1);
  std::unique_ptr<Communicator> pair = world().group(members);
  ASSERT_NE(pair, nullptr);
  EXPECT_EQ(pair->size(), static_cast<int>(members.size()));
  EXPECT_EQ(pair->rank(), r % 2);
  EXPECT_EQ(std::vector<int>(pair->global_ranks().begin(), pair->global_ranks().end()), members);
  const Tensor values = Tensor::from_vector<float>({2}, {r + 1.0f, 10.0f});
  pair->all_reduce(values);
  float expected = 0;
  for (int member : members) expected += member + 1.0f;
  EXPECT_EQ(values.to_float_vector(), (std::vector<float>{expected, 10.0f * members.size()}));
  // Point-to-point inside the group uses group ranks.
  if (pair->size() == 2) {
    const Tensor received = Tensor::zeros({1}, DType::I32);
    std::vector<Request> requests;
    requests.push_back(pair->receive(received, 1 - pair->rank(), 5));
    requests.push_back(pair->send(Tensor::from_vector<std::int32_t>({1}, {100 + r}), 1 - pair->rank(), 5));
    wait_all(requests);
    EXPECT_EQ(received.data<std::int32_t>()[0], 100 + (r ^ 1));
  }
  // Nested: the first member of each pair alone.
  std::unique_ptr<Communicator> single = pair->group(std::vector<int>{members[0]});
  EXPECT_EQ(single != nullptr, r == members[0]);
  if (single) {
    EXPECT_EQ(single->all_reduce_scalar(r + 0.5), r + 0.5);
  }
}

TEST(MpiCommunicator, GroupFromOneListEverywhereFollowsItsOrder) {
  const int n = world().size(), r = world().rank();
  const std::vector<int> members = {n - 1, 0};  // group rank 0 is global rank n-1
  std::unique_ptr<Communicator> ends = world().group(members);
  EXPECT_EQ(ends != nullptr, r == 0 || r == n - 1);
  if (ends) {
    EXPECT_EQ(ends->size(), 2);
    EXPECT_EQ(ends->rank(), r == n - 1 ? 0 : 1);
    std::string text = ends->rank() == 0 ? "from global " + std::to_string(r) : "";
    ends->broadcast_bytes(text, 0);
    EXPECT_EQ(text, "from global " + std::to_string(n - 1));
  }
}

TEST(MpiCommunicator, GroupRejectsBadListsOnEveryRank) {
  const int n = world().size(), r = world().rank();
  expect_error([&] { world().group(std::vector<int>{0, n}); }, "rank " + std::to_string(n) + " is not a member");
  expect_error([&] { world().group(std::vector<int>{0, 1, 0}); }, "appears twice");
  expect_error([&] { world().group(std::vector<int>{}); }, "empty");
  // Only rank 0 passes a bad list: every rank fails instead of waiting for it.
  const std::vector<int> everyone = [&] {
    std::vector<int> all;
    for (int i = 0; i < n; ++i) all.push_back(i);
    return all;
  }();
  expect_error([&] { world().group(r == 0 ? std::vector<int>{-3} : everyone); },
               r == 0 ? "rank -3 is not a member" : "rank 0 of the communicator passed an invalid rank list");
  // Rank 0 claims {0, 1}, rank 1 claims {1}: the members disagree.
  expect_error([&] { world().group(r == 0 ? std::vector<int>{0, 1} : std::vector<int>{r}); }, "different lists");
  // The world still works afterwards.
  EXPECT_EQ(world().all_reduce_scalar(1.0), n);
}

TEST(MpiCommunicator, BadArgumentsAreClearErrors) {
  const int n = world().size();
  const Tensor tensor = Tensor::zeros({2});
  expect_error([&] { world().send(tensor, n, 0); },
               "send: destination " + std::to_string(n) + " is out of range for a communicator of size " +
                   std::to_string(n));
  expect_error([&] { world().receive(tensor, -1, 0); }, "receive: source -1 is out of range");
  expect_error([&] { world().send(tensor, 0, -2); }, "send: tag -2 is out of range");
  expect_error([&] { world().receive(Tensor(), 0, 0); }, "receive: the tensor is undefined");
  expect_error([&] { world().broadcast(tensor, n); }, "broadcast: root");
  // No operation of a rejected exchange is started: the valid send below must not be sent.
  const std::vector<SendSpec> sends = {{tensor, 0, 30}, {tensor, n + 5, 30}};
  expect_error([&] { world().exchange(sends, {}); }, "destination " + std::to_string(n + 5));
  try {
    world().send(tensor, n, 0);
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("mpi_communicator.cpp:"), std::string::npos) << error.what();
  }
  int pending = 0;
  MPI_Status status;
  MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, world().native(), &pending, &status);
  EXPECT_FALSE(pending);
  world().barrier();
}

TEST(MpiCommunicator, ReceiveOfTheWrongSizeIsAnErrorAtWait) {
  const int r = world().rank();
  if (r == 0) {
    std::vector<Request> requests;
    requests.push_back(world().send(Tensor::zeros({10}), 1, 5));
    requests.push_back(world().send(Tensor::zeros({6}), 1, 6));
    requests.push_back(world().send(Tensor::zeros({3}, DType::I32), 1, 7));
    wait_all(requests);
  } else if (r == 1) {
    expect_error([&] { world().receive(Tensor::zeros({8}), 0, 5).wait(); },
                 "receive into f32 [8] from rank 0 with tag 5 (world rank 1) failed: MPI_ERR_TRUNCATE");
    expect_error([&] { world().receive(Tensor::zeros({8}), 0, 6).wait(); },
                 "receive into f32 [8] from rank 0 with tag 6 (world rank 1): the message has 6 elements, the tensor 8");
    expect_error([&] { world().receive(Tensor::zeros({3}, DType::I64), 0, 7).wait(); },
                 "a size that is not a whole number of elements");
  }
  world().barrier();
}


TEST(MpiCommunicator, ReduceScatterAndAllGatherAgainstSums) {
  const int n = world().size(), r = world().rank();
  constexpr int kPart = 5;
  // Rank r contributes value (r + 1) · (i + 1) at element i: the sum over ranks is (i + 1) · n(n+1)/2.
  std::vector<float> values(static_cast<std::size_t>(kPart * n));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>((r + 1) * (i + 1));
  const Tensor input = Tensor::from_vector<float>({kPart * n}, values);
  const Tensor part = Tensor::zeros({kPart});
  world().reduce_scatter(input, part);
  const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
  for (int i = 0; i < kPart; ++i)
    EXPECT_EQ(part.data<float>()[i], static_cast<float>(r * kPart + i + 1) * ranks_sum) << "element " << i;
  const Tensor gathered = Tensor::zeros({kPart * n});
  world().all_gather(part, gathered);
  for (int i = 0; i < kPart * n; ++i) EXPECT_EQ(gathered.data<float>()[i], static_cast<float>(i + 1) * ranks_sum);
  expect_error([&] { world().reduce_scatter(input, Tensor::zeros({kPart + 1})); }, "are not");
}

// In place (ZeRO-1's parameter gather into the spent gradient buffer): the input is this rank's own
// slot of the output, which MPI accepts only as MPI_IN_PLACE.
TEST(MpiCommunicator, AllGatherInPlace) {
  const int n = world().size(), r = world().rank();
  constexpr int kPart = 7;
  const Tensor whole = Tensor::full({kPart * n}, -1.0, DType::F32);
  const Tensor own = whole.slice_rows(r * kPart, (r + 1) * kPart);
  for (int i = 0; i < kPart; ++i) own.data<float>()[i] = static_cast<float>(100 * r + i);
  world().all_gather(own, whole);
  for (int q = 0; q < n; ++q)
    for (int i = 0; i < kPart; ++i)
      EXPECT_EQ(whole.data<float>()[q * kPart + i], static_cast<float>(100 * q + i)) << "rank " << q << " element " << i;
}

// In bf16 (ZeRO-1 gathers the working copies under mixed precision): the 16-bit elements travel as
// they are; an output of another dtype is refused.
TEST(MpiCommunicator, AllGatherInBf16InPlace) {
  const int n = world().size(), r = world().rank();
  constexpr int kPart = 6;
  const auto value = [](int rank, int i) { return 8.0f * static_cast<float>(rank) + 0.5f * static_cast<float>(i); };
  const Tensor whole = Tensor::full({kPart * n}, -1.0, DType::BF16);
  const Tensor own = whole.slice_rows(r * kPart, (r + 1) * kPart);
  for (int i = 0; i < kPart; ++i) own.data<BFloat16>()[i] = BFloat16(value(r, i));  // exact in bf16
  world().all_gather(own, whole);
  for (int q = 0; q < n; ++q)
    for (int i = 0; i < kPart; ++i)
      EXPECT_EQ(static_cast<float>(whole.data<BFloat16>()[q * kPart + i]), value(q, i)) << "rank " << q << " element " << i;
  expect_error([&] { world().all_gather(own, Tensor::zeros({kPart * n})); }, "one dtype");
  expect_error([&] { world().reduce_scatter(whole, own); }, "needs f32");
}

}  // namespace
}  // namespace partrain::comm
