// The executor's action methods one by one on a one-stage plan of a tiny classifier (one rank, MPI
// singleton), each against an independent reference: Forward and Backward against the interpreter
// run directly, Recompute against a plain forward (bit-identical saved tensors), Step against one
// SGD or AdamW update computed by hand; and train_step against its own action list run through
// run_action. Send, Receive and AllReduce need two ranks: ctest/mpi/test_executor_communication.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "comm/mpi_communicator.h"
#include "support/mpi_environment.h"
#include "graph/autodiff.h"
#include "graph/interpreter.h"
#include "graph/saved_tensors.h"
#include "graph/subgraph.h"
#include "kernels/cpu/cpu_backend.h"
#include "runtime/executor.h"
#include "support/executor_fixtures.h"

namespace partrain::runtime {
namespace {

using testing::MpiEnvironment;
[[maybe_unused]] ::testing::Environment* const g_mpi_environment =
    ::testing::AddGlobalTestEnvironment(new MpiEnvironment);

constexpr std::int64_t kGlobalBatch = 8, kMicrobatchSize = 4;  // two microbatches per step
constexpr std::uint64_t kSeed = 1234;                         // RuntimeOptions' default seed

/// The tiny classifier as one stage on one rank, and its executor. Not copyable: the executor
/// keeps references to the graph, plan and data.
class OneStage {
 public:
  explicit OneStage(RecomputePolicy recompute = RecomputePolicy::None, const std::string& optimizer = "adamw",
                    RuntimeOptions options = {}) {
    std::vector<int> tasks = model.first_tasks();
    for (int task : model.second_tasks()) tasks.push_back(task);
    plan = testing::tiny_plan(model, {tasks}, {1}, kGlobalBatch, 2, optimizer);
    plan.stages[0].recompute = recompute;
    // Stage-aware: Dropout and the first Gemm are recomputed, the rest keeps its activations.
    if (recompute == RecomputePolicy::StageAware) plan.stages[0].recompute_until_task = model.second_tasks().front();
    options.seed = kSeed;
    executor = std::make_unique<PipelineExecutor>(model.graph, plan, MpiEnvironment::world(), cpu_backend(), data,
                                                  model.initial_values(), options);
  }
  OneStage(const OneStage&) = delete;
  OneStage& operator=(const OneStage&) = delete;

  const StageProgram& program() const { return executor->programs().front(); }

  testing::TinyClassifier model;
  testing::TinyClassifierData data;
  Plan plan;
  std::unique_ptr<PipelineExecutor> executor;
};

Action forward_of(int microbatch, bool activations_recomputed = false) {
  return Action::forward(microbatch, 0, kMicrobatchSize, activations_recomputed);
}

// The interpreter's forward and backward of microbatches 0 and 1 of `step` from the initial values,
// the loss gradient seeded with each microbatch's share of the batch: the parameter gradients.
TensorMap reference_gradients(const OneStage& stage, std::int64_t step) {
  const Graph& graph = stage.model.graph;
  const BackwardProgram program = build_backward(graph, whole_graph(graph));
  TensorMap grads;
  for (const auto& [value, tensor] : stage.model.initial_values()) grads[value] = Tensor::zeros(tensor.shape());
  for (int microbatch = 0; microbatch < 2; ++microbatch) {
    const std::int64_t first = microbatch * kMicrobatchSize;
    const TensorMap values = testing::reference_forward(stage.model, stage.data, stage.model.initial_values(), kSeed,
                                                        step, kGlobalBatch, first, kMicrobatchSize);
    grads[stage.model.loss] = Tensor::full({}, static_cast<double>(kMicrobatchSize) / kGlobalBatch);
    ExecutionOptions options;
    options.training = true;
    options.random = testing::sample_random(kSeed, step, first);
    run_backward(graph, program, values, grads, cpu_backend(), options);
  }
  return grads;
}

TEST(ExecutorActions, ForwardComputesTheInterpretersLossAndKeepsOnlyTheSavedTensors) {
  OneStage stage;
  PipelineExecutor::Pass pass = stage.executor->begin_training_pass(3);
  stage.executor->run_action(forward_of(1), pass);  // samples [4, 8) of step 3

  const TensorMap reference = testing::reference_forward(stage.model, stage.data, stage.model.initial_values(), kSeed,
                                                         3, kGlobalBatch, kMicrobatchSize, kMicrobatchSize);
  const float loss = reference.at(stage.model.loss).to_float_vector().at(0);
  EXPECT_EQ(stage.executor->loss_sum(pass), static_cast<double>(kMicrobatchSize) / kGlobalBatch * loss);

  const PipelineExecutor::MicrobatchState& state = pass.microbatches.at(1);
  EXPECT_TRUE(pass.microbatches.at(0).values.empty());  // microbatch 0 untouched
  const std::vector<int>& saved = stage.program().saved;
  ASSERT_FALSE(saved.empty());
  for (int value : saved)
    EXPECT_TRUE(testing::bitwise_equal(state.values.at(value), reference.at(value))) << stage.model.graph.value(value).name;
  EXPECT_TRUE(testing::bitwise_equal(state.values.at(stage.model.loss), reference.at(stage.model.loss)));
  // What the backward does not read is let go of once the forward is done.
  for (const auto& [value, tensor] : state.values) {
    if (!is_microbatch_value(stage.model.graph, value) || value == stage.model.loss) continue;
    const bool is_saved = std::find(saved.begin(), saved.end(), value) != saved.end();
    EXPECT_EQ(tensor.defined(), is_saved) << stage.model.graph.value(value).name;
  }
}

TEST(ExecutorActions, BackwardAccumulatesTheInterpretersGradients) {
  OneStage stage;
  PipelineExecutor::Pass pass = stage.executor->begin_training_pass(2);
  for (int microbatch = 0; microbatch < 2; ++microbatch) {
    stage.executor->run_action(forward_of(microbatch), pass);
    stage.executor->run_action(Action::backward(microbatch, 0, kMicrobatchSize), pass);
    EXPECT_TRUE(pass.microbatches.at(microbatch).values.empty());  // nothing held after its backward
  }
  const TensorMap reference = reference_gradients(stage, 2);
  ASSERT_EQ(stage.executor->gradients().size(), 4u);
  for (const auto& [value, gradient] : stage.executor->gradients()) {
    const Tensor& expected = reference.at(value);
    const std::vector<float> actual = gradient.to_float_vector(), wanted = expected.to_float_vector();
    ASSERT_EQ(actual.size(), wanted.size());
    double norm = 0;
    for (float element : wanted) norm += double(element) * element;
    EXPECT_GT(norm, 1e-8) << stage.model.graph.value(value).name;  // a gradient that can be wrong
    for (std::size_t i = 0; i < actual.size(); ++i)
      EXPECT_NEAR(actual[i], wanted[i], 1e-6 * std::max(1.0, std::abs(double(wanted[i]))))
          << stage.model.graph.value(value).name << "[" << i << "]";
  }
}

// A recomputed Forward keeps only what the recomputation starts from; the Recompute restores the
// saved tensors a plain forward keeps, bit for bit.
void expect_recompute_reproduces_forward(RecomputePolicy policy) {
  OneStage stage(policy);
  const Graph& graph = stage.model.graph;
  PipelineExecutor::Pass plain = stage.executor->begin_training_pass(1);
  stage.executor->run_action(forward_of(0), plain);

  PipelineExecutor::Pass recomputed = stage.executor->begin_training_pass(1);
  stage.executor->run_action(forward_of(0, true), recomputed);
  EXPECT_EQ(stage.executor->loss_sum(recomputed), stage.executor->loss_sum(plain));
  const PipelineExecutor::MicrobatchState& state = recomputed.microbatches.at(0);
  const std::vector<int>& kept_values = stage.program().kept_values;
  for (const auto& [value, tensor] : state.values) {
    if (!is_microbatch_value(graph, value) || !tensor.defined()) continue;
    const bool starts_recompute = value == stage.model.x || value == stage.model.labels ||
                                  std::find(kept_values.begin(), kept_values.end(), value) != kept_values.end();
    EXPECT_TRUE(starts_recompute) << graph.value(value).name << " was kept for the backward";
  }
  EXPECT_TRUE(state.values.at(stage.model.x).defined() && state.values.at(stage.model.labels).defined());
  EXPECT_FALSE(state.values.count(stage.model.hidden) && state.values.at(stage.model.hidden).defined());
  EXPECT_EQ(kept_values.empty(), policy == RecomputePolicy::StageBoundaries);

  stage.executor->run_action(Action::recompute(0, 0, kMicrobatchSize), recomputed);
  for (int value : stage.program().saved)
    EXPECT_TRUE(testing::bitwise_equal(state.values.at(value), plain.microbatches.at(0).values.at(value)))
        << graph.value(value).name;
  EXPECT_EQ(stage.executor->loss_sum(recomputed), stage.executor->loss_sum(plain));  // the recomputation adds no loss
}

TEST(ExecutorActions, RecomputeOfAWholeStageReproducesTheForwardsSavedTensors) {
  expect_recompute_reproduces_forward(RecomputePolicy::StageBoundaries);
}

TEST(ExecutorActions, StageAwareRecomputeReproducesTheForwardsSavedTensors) {
  expect_recompute_reproduces_forward(RecomputePolicy::StageAware);
}

// Runs a step's forwards and backwards, then Step: the update against `update` (old parameter,
// clipped gradient, weight decay) computed by hand in double precision.
template <typename Update>
void expect_step_is_one_update(const std::string& optimizer, Update update) {
  RuntimeOptions options;
  options.lr_schedule = LearningRateSchedule(0.1, 0.0, 0, 1, LearningRateSchedule::Decay::Constant);
  options.grad_clip = 1e-3;  // below the gradients' norm: the clipping shows in the update
  OneStage stage(RecomputePolicy::None, optimizer, options);
  PipelineExecutor::Pass pass = stage.executor->begin_training_pass(0);
  for (int microbatch = 0; microbatch < 2; ++microbatch) {
    stage.executor->run_action(forward_of(microbatch), pass);
    stage.executor->run_action(Action::backward(microbatch, 0, kMicrobatchSize), pass);
  }
  std::unordered_map<int, std::vector<float>> before, gradients;
  double squares = 0;
  for (const auto& [value, gradient] : stage.executor->gradients()) {
    gradients[value] = gradient.to_float_vector();
    before[value] = stage.executor->state().at(value).to_float_vector();
    for (float element : gradients[value]) squares += double(element) * element;
  }
  stage.executor->run_action(Action::step(), pass);

  const double norm = std::sqrt(squares);
  EXPECT_NEAR(pass.grad_norm, norm, 1e-6 * norm);
  EXPECT_EQ(pass.lr, 0.1);
  const double scale = 1e-3 / (norm + 1e-6);  // torch.nn.utils.clip_grad_norm_
  ASSERT_LT(scale, 0.5);
  for (const auto& [value, old] : before) {
    const bool decay = stage.model.graph.value(value).type.shape.size() > 1;  // not biases
    const std::vector<float> now = stage.executor->state().at(value).to_float_vector();
    for (std::size_t i = 0; i < old.size(); ++i)
      EXPECT_NEAR(now[i], update(old[i], gradients[value][i] * scale, decay ? 0.01 : 0.0, 0.1), 1e-6)
          << stage.model.graph.value(value).name << "[" << i << "]";
  }
}

TEST(ExecutorActions, StepIsOneSgdUpdateOfTheClippedGradients) {
  // torch.optim.SGD's first update (the momentum buffer starts as the gradient): p − lr (g + λ p).
  expect_step_is_one_update("sgd", [](double parameter, double gradient, double decay, double lr) {
    return parameter - lr * (gradient + decay * parameter);
  });
}

TEST(ExecutorActions, StepIsOneAdamWUpdateOfTheClippedGradients) {
  // torch.optim.AdamW's first update: p (1 − lr λ) − lr m̂ / (√v̂ + ε), m̂ = g, v̂ = g².
  expect_step_is_one_update("adamw", [](double parameter, double gradient, double decay, double lr) {
    const double m = (1 - 0.9) * gradient, v = (1 - 0.999) * gradient * gradient;
    return parameter * (1 - lr * decay) - lr / (1 - 0.9) * m / (std::sqrt(v) / std::sqrt(1 - 0.999) + 1e-8);
  });
}

TEST(ExecutorActions, TrainStepRunsItsActionListThroughRunAction) {
  OneStage stepped, by_actions;
  const StepResult result = stepped.executor->train_step(0);
  PipelineExecutor::Pass pass = by_actions.executor->begin_training_pass(0);
  ASSERT_EQ(by_actions.executor->actions().back().kind, ActionKind::Step);
  for (const Action& action : by_actions.executor->actions()) by_actions.executor->run_action(action, pass);
  EXPECT_EQ(result.loss, by_actions.executor->loss_sum(pass));
  EXPECT_EQ(result.grad_norm, pass.grad_norm);
  for (const auto& [value, tensor] : stepped.executor->state())
    EXPECT_TRUE(testing::bitwise_equal(tensor, by_actions.executor->state().at(value)))
        << stepped.model.graph.value(value).name;
}

}  // namespace
}  // namespace partrain::runtime
