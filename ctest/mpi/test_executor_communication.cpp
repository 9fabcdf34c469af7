// The executor's communication actions on two ranks (ranks 0 and 1 of the world; the others sit
// out): SendActivation/ReceiveActivation and SendGradient/ReceiveGradient between the two stages of
// a tiny classifier deliver exactly the interpreter's boundary activation and its gradient, and
// AllReduce over two replicas of one stage leaves the sum of the replicas' gradients. The compute
// actions are tested on one rank in ctest/unit/test_executor_actions.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "graph/autodiff.h"
#include "graph/interpreter.h"
#include "graph/subgraph.h"
#include "kernels/cpu/cpu_backend.h"
#include "runtime/executor.h"
#include "support/executor_fixtures.h"
#include "support/mpi_test_main.h"

namespace partrain::runtime {
namespace {

constexpr std::int64_t kGlobalBatch = 8, kMicrobatchSize = 4;  // two microbatches per step
constexpr std::uint64_t kSeed = 1234;                         // RuntimeOptions' default seed

// Ranks 0 and 1 of the world as a group (collective over the world; nullptr on the other ranks).
std::unique_ptr<comm::Communicator> first_two_ranks() {
  return testing::mpi_world().group(std::vector<int>{0, 1});
}

TEST(ExecutorCommunication, SendAndReceiveCarryTheBoundaryActivationAndItsGradient) {
  const std::unique_ptr<comm::Communicator> pair = first_two_ranks();
  if (!pair) return;
  testing::TinyClassifier model;
  testing::TinyClassifierData data;
  const Plan plan = testing::tiny_plan(model, {model.first_tasks(), model.second_tasks()}, {1, 1}, kGlobalBatch, 2);
  RuntimeOptions options;
  options.seed = kSeed;
  PipelineExecutor executor(model.graph, plan, *pair, cpu_backend(), data, model.initial_values(), options);
  ASSERT_EQ(executor.programs().front().sent, (pair->rank() == 0 ? std::vector<int>{model.dropped} : std::vector<int>{}));

  // The references, on each rank from the whole graph: microbatch 1 of step 2.
  const std::int64_t step = 2, first = kMicrobatchSize;
  const TensorMap values = testing::reference_forward(model, data, model.initial_values(), kSeed, step, kGlobalBatch,
                                                      first, kMicrobatchSize);
  // The gradient of the boundary activation: the interpreter's backward of the second stage's tasks.
  const BackwardProgram second = build_backward(model.graph, extract_subgraph(model.graph, model.second_tasks()));
  TensorMap grads = {{model.loss, Tensor::full({}, static_cast<double>(kMicrobatchSize) / kGlobalBatch)}};
  ExecutionOptions backward_options;
  backward_options.random = testing::sample_random(kSeed, step, first);
  run_backward(model.graph, second, values, grads, cpu_backend(), backward_options);
  ASSERT_TRUE(grads.count(model.dropped));

  PipelineExecutor::Pass pass = executor.begin_training_pass(step);
  const int peer = 1 - pair->rank();
  if (pair->rank() == 0) {
    executor.run_action(Action::forward(1, 0, kMicrobatchSize, false), pass);
    executor.run_action(Action::transfer(ActionKind::SendActivation, 1, peer, 0, kMicrobatchSize), pass);
    executor.run_action(Action::transfer(ActionKind::ReceiveGradient, 1, peer, 0, kMicrobatchSize), pass);
    EXPECT_TRUE(testing::bitwise_equal(pass.microbatches.at(1).received_gradients.at(model.dropped),
                                       grads.at(model.dropped)));
  } else {
    executor.run_action(Action::transfer(ActionKind::ReceiveActivation, 1, peer, 0, kMicrobatchSize), pass);
    EXPECT_TRUE(testing::bitwise_equal(pass.microbatches.at(1).received.at(model.dropped), values.at(model.dropped)));
    executor.run_action(Action::forward(1, 0, kMicrobatchSize, false), pass);
    executor.run_action(Action::backward(1, 0, kMicrobatchSize), pass);
    EXPECT_TRUE(testing::bitwise_equal(pass.microbatches.at(1).outgoing_gradients.at(model.dropped),
                                       grads.at(model.dropped)));
    executor.run_action(Action::transfer(ActionKind::SendGradient, 1, peer, 0, kMicrobatchSize), pass);
  }
  comm::wait_all(pass.pending);
}

TEST(ExecutorCommunication, AllReduceLeavesTheSumOfTheReplicasGradients) {
  const std::unique_ptr<comm::Communicator> pair = first_two_ranks();
  if (!pair) return;
  testing::TinyClassifier model;
  testing::TinyClassifierData data;
  std::vector<int> tasks = model.first_tasks();
  for (int task : model.second_tasks()) tasks.push_back(task);
  const Plan plan = testing::tiny_plan(model, {tasks}, {2}, kGlobalBatch, 2);
  PipelineExecutor executor(model.graph, plan, *pair, cpu_backend(), data, model.initial_values(), RuntimeOptions{});
  ASSERT_NE(executor.gradient_buckets(), nullptr);  // the overlapped all-reduce

  // This replica's half of each microbatch. Not marked as the step's last backward (as train_step
  // marks it): the buckets' reductions would start during it and change the gradients in place
  // while this test reads them; so the AllReduce action starts every bucket itself.
  const auto [begin, end] = plan.replica_samples(0, pair->rank());
  PipelineExecutor::Pass pass = executor.begin_training_pass(0);
  for (int microbatch = 0; microbatch < 2; ++microbatch) {
    executor.run_action(Action::forward(microbatch, begin, end, false), pass);
    executor.run_action(Action::backward(microbatch, begin, end), pass);
  }
  // Each replica's gradients before the reduction, exchanged as bytes (not through the collective
  // under test); every parameter of this stage is untied, so all are reduced.
  std::vector<int> order;
  std::string bytes;
  for (const auto& [value, gradient] : executor.gradients()) order.push_back(value);
  std::sort(order.begin(), order.end());
  for (int value : order) {
    const std::vector<float> elements = executor.gradients().at(value).to_float_vector();
    bytes.append(reinterpret_cast<const char*>(elements.data()), elements.size() * sizeof(float));
  }
  const std::vector<std::string> replicas = pair->all_gather_bytes(bytes);
  ASSERT_EQ(replicas.size(), 2u);
  const std::vector<Action>& actions = executor.actions();
  const auto all_reduce = std::find_if(actions.begin(), actions.end(),
                                       [](const Action& action) { return action.kind == ActionKind::AllReduce; });
  ASSERT_NE(all_reduce, actions.end());
  EXPECT_EQ(all_reduce->group, (std::vector<int>{0, 1}));
  executor.run_action(*all_reduce, pass);

  std::size_t offset = 0;
  for (int value : order) {
    const std::vector<float> reduced = executor.gradients().at(value).to_float_vector();
    for (std::size_t i = 0; i < reduced.size(); ++i, offset += sizeof(float)) {
      float first = 0, second = 0;
      std::memcpy(&first, replicas[0].data() + offset, sizeof(float));
      std::memcpy(&second, replicas[1].data() + offset, sizeof(float));
      EXPECT_EQ(reduced[i], first + second) << model.graph.value(value).name << "[" << i << "]";
    }
  }
}

// Grouped transfers (RuntimeOptions::group_transfers, on by itself over NCCL, whose sends hold their
// stream until received): each run of sends goes out with the receives after it in one exchange. In
// 1F1B stage 0 sends microbatch 1's activation before it receives microbatch 0's gradient while
// stage 1 sends that gradient before it receives the activation; posted one by one on a stream each,
// they would wait on each other. Forced on over MPI, every schedule must train exactly as without.
TEST(ExecutorCommunication, GroupedTransfersTrainBitIdentically) {
  const std::unique_ptr<comm::Communicator> pair = first_two_ranks();
  if (!pair) return;
  testing::TinyClassifier model;
  testing::TinyClassifierData data;
  for (const ScheduleKind schedule : {ScheduleKind::OneForwardOneBackward, ScheduleKind::GPipe, ScheduleKind::ZeroBubbleH1}) {
    for (const int microbatches : {2, 4}) {
      Plan plan = testing::tiny_plan(model, {model.first_tasks(), model.second_tasks()}, {1, 1}, kGlobalBatch, microbatches);
      plan.schedule = schedule;
      std::vector<StepResult> results[2];
      for (const bool grouped : {false, true}) {
        RuntimeOptions options;
        options.seed = kSeed;
        options.group_transfers = grouped;
        PipelineExecutor executor(model.graph, plan, *pair, cpu_backend(), data, model.initial_values(), options);
        for (std::int64_t step = 0; step < 3; ++step) results[grouped].push_back(executor.train_step(step));
      }
      for (std::size_t step = 0; step < results[0].size(); ++step) {
        EXPECT_EQ(results[1][step].loss, results[0][step].loss)
            << schedule_name(schedule) << ", " << microbatches << " microbatches, step " << step;
        EXPECT_EQ(results[1][step].grad_norm, results[0][step].grad_norm)
            << schedule_name(schedule) << ", " << microbatches << " microbatches, step " << step;
      }
    }
  }
}

}  // namespace
}  // namespace partrain::runtime
