// The Plan (rank map, sample ranges, validation, JSON) and the shared plan-building steps
// (layer groups, predictions, microbatch choice, memory errors) on the tiny reference models.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <numeric>

#include "core/error.h"
#include "graph/subgraph.h"
#include "models/model.h"
#include "plan/plan.h"
#include "plan/schedule.h"
#include "plan/schedule_topology.h"
#include "plan/schedule_checker.h"
#include "partition/common/plan_builder.h"
#include "partition/planner.h"
#include "support/errors.h"
#include "support/tiny_models.h"
#include <nlohmann/json.hpp>

namespace partrain::partition {
namespace {

using testing::error_message;
using testing::tiny_model_config;

// Costs straight from the graph's per-task figures: 1 GFLOP/s, backward = 2 × forward, no
// transient memory. Simple enough to predict by hand below.
class TaskSumCostModel : public CostModel {
 public:
  explicit TaskSumCostModel(const Graph& graph, double memory_bytes) : graph_(graph) { device_.memory_bytes = memory_bytes; }
  profile::Measurement measure(std::span<const int> tasks, std::int64_t batch) const override {
    profile::Measurement m;
    for (int id : tasks) {
      const Task& task = graph_.task(id);
      const double scale = task.constant ? 1.0 : static_cast<double>(batch);
      m.forward_seconds += task.cost.forward_flops * scale / 1e9;
      m.parameter_bytes += task.cost.parameter_bytes;
      m.activation_bytes += task.cost.activation_bytes * scale;
    }
    m.backward_seconds = 2 * m.forward_seconds;
    m.peak_bytes = m.activation_bytes;
    return m;
  }
  double transfer_seconds(double, bool) const override { return 0.0; }
  double allreduce_seconds(double bytes, int replicas, bool) const override {
    return replicas > 1 ? bytes / 1e9 : 0.0;
  }
  std::string description() const override { return "task sums at 1 GFLOP/s"; }
  const DeviceSpec& device() const override { return device_; }

 private:
  const Graph& graph_;
  DeviceSpec device_;
};

Plan two_stage_plan(const Graph& graph) {
  const std::vector<LayerGroup> groups = layer_groups(graph);
  Plan plan;
  plan.planner = "test";
  plan.graph_hash = graph.hash();
  plan.world_size = 6;
  plan.pipeline_replicas = 2;
  plan.global_batch = 12;
  plan.microbatches = 2;
  plan.stages.resize(2);
  plan.stages[0].tasks = join_groups(groups, 0, 2);
  plan.stages[0].replicas = 2;
  plan.stages[1].tasks = join_groups(groups, 2, groups.size());
  plan.stages[1].replicas = 1;
  return plan;
}

TEST(LayerGroups, CoverEveryTaskInConvexGroupsInPipelineOrder) {
  for (const char* type : {"bert", "gpt", "resnet"}) {
    const Graph graph = build_model(tiny_model_config(type));
    const std::vector<LayerGroup> groups = layer_groups(graph);
    ASSERT_GE(groups.size(), 3u) << type;
    std::vector<int> seen(graph.tasks().size(), 0);
    std::vector<int> group_of(graph.tasks().size(), -1);
    for (std::size_t g = 0; g < groups.size(); ++g) {
      std::vector<int> non_constant;
      for (int task : groups[g].tasks) {
        ++seen[task];
        if (!graph.task(task).constant) {
          non_constant.push_back(task);
          group_of[task] = static_cast<int>(g);
        }
      }
      EXPECT_TRUE(is_convex(graph, non_constant)) << type << " group " << groups[g].name;
    }
    for (const Task& task : graph.tasks()) {
      if (task.constant) {
        EXPECT_GE(seen[task.id], 1) << task.name;
        continue;
      }
      EXPECT_EQ(seen[task.id], 1) << task.name;
      for (int output : task.outputs)
        for (int consumer : graph.value(output).consumers)
          if (!graph.task(consumer).constant) {
            EXPECT_GE(group_of[consumer], group_of[task.id]) << task.name;
          }
    }
  }
  const std::vector<LayerGroup> bert = layer_groups(build_model(tiny_model_config("bert")));
  EXPECT_EQ(bert[0].name, "embeddings");
  EXPECT_EQ(bert[1].name, "encoder.layer.0");
  EXPECT_EQ(bert[2].name, "encoder.layer.1");
}

TEST(Plan, RankMapAndReplicaSamples) {
  const Graph graph = build_model(tiny_model_config("bert"));
  const Plan plan = two_stage_plan(graph);
  EXPECT_EQ(plan.devices_per_pipeline_replica(), 3);
  EXPECT_EQ(plan.microbatch_size(), 3);
  // pipeline-replica-major, then stage, then replica: ranks 0,1 = pipeline replica 0 stage 0; 2 = pipeline replica 0 stage 1; 3.. pipeline replica 1
  const std::vector<std::array<int, 3>> expected = {{0, 0, 0}, {0, 0, 1}, {0, 1, 0}, {1, 0, 0}, {1, 0, 1}, {1, 1, 0}};
  for (int rank = 0; rank < 6; ++rank) {
    const Placement placement = plan.placement_of(rank);
    EXPECT_EQ(placement.pipeline_replica, expected[rank][0]);
    EXPECT_EQ(placement.stage, expected[rank][1]);
    EXPECT_EQ(placement.replica, expected[rank][2]);
    EXPECT_EQ(plan.rank_of(placement), rank);
  }
  EXPECT_EQ(plan.replica_samples(0, 0), (std::pair<std::int64_t, std::int64_t>{0, 2}));
  EXPECT_EQ(plan.replica_samples(0, 1), (std::pair<std::int64_t, std::int64_t>{2, 3}));
  EXPECT_EQ(plan.replica_samples(1, 0), (std::pair<std::int64_t, std::int64_t>{0, 3}));
  EXPECT_NE(error_message([&] { plan.placement_of(6); }).find("rank 6 is outside"), std::string::npos);
  EXPECT_NO_THROW(plan.validate(graph));
}

TEST(Plan, TensorParallelRankMapGroupsAndSchedule) {
  const Graph graph = build_model(tiny_model_config("bert"));
  Plan plan = two_stage_plan(graph);  // 2 pipeline replicas x (2 + 1 replicas)
  plan.tensor_parallel = 2;
  plan.world_size = 12;
  EXPECT_EQ(plan.devices_per_pipeline_replica(), 6);
  // A tensor-parallel group is 2 consecutive ranks: rank 5 is pipeline replica 0, stage 1, replica 0, tensor rank 1.
  const Placement placement = plan.placement_of(5);
  EXPECT_EQ(placement.pipeline_replica, 0);
  EXPECT_EQ(placement.stage, 1);
  EXPECT_EQ(placement.replica, 0);
  EXPECT_EQ(placement.tensor_rank, 1);
  for (int rank = 0; rank < 12; ++rank) EXPECT_EQ(plan.rank_of(plan.placement_of(rank)), rank);
  EXPECT_EQ(tensor_group(plan, plan.placement_of(2)), (std::vector<int>{2, 3}));
  EXPECT_EQ(stage_group(plan, 0, 1), (std::vector<int>{1, 3, 7, 9}));  // the stage's data-parallel group of tensor rank 1
  // Every rank's list is deadlock-free and complete, and talks only to its own tensor rank.
  const Schedule schedule = generate_schedule(plan);
  EXPECT_NO_THROW(check_schedule(plan, schedule));
  for (int rank = 0; rank < 12; ++rank)
    for (const Action& action : schedule[rank])
      if (action.peer >= 0) EXPECT_EQ(plan.placement_of(action.peer).tensor_rank, plan.placement_of(rank).tensor_rank);
  // The plan JSON keeps the degree; a plan without the key (made before) reads as 1.
  EXPECT_EQ(Plan::from_json(plan.to_json(), "test").tensor_parallel, 2);
  nlohmann::json old = plan.to_json();
  old.erase("tensor_parallel");
  EXPECT_EQ(Plan::from_json(old, "test").tensor_parallel, 1);
  // Sequence parallelism: kept in the JSON, false when absent (plans made before it), only with t > 1.
  EXPECT_FALSE(Plan::from_json(plan.to_json(), "test").sequence_parallel);
  plan.sequence_parallel = true;
  EXPECT_TRUE(Plan::from_json(plan.to_json(), "test").sequence_parallel);
  nlohmann::json without = plan.to_json();
  without.erase("sequence_parallel");
  EXPECT_FALSE(Plan::from_json(without, "test").sequence_parallel);
  Plan one = two_stage_plan(graph);
  one.sequence_parallel = true;
  EXPECT_NE(error_message([&] { one.validate(graph); }).find("sequence_parallel needs tensor_parallel > 1, got 1"),
            std::string::npos);
}

TEST(Plan, ValidationNamesTheProblem) {
  const Graph graph = build_model(tiny_model_config("bert"));
  const Plan good = two_stage_plan(graph);
  Plan plan = good;
  plan.stages[1].tasks.clear();
  EXPECT_NE(error_message([&] { plan.validate(graph); }).find("stage 1 is empty"), std::string::npos);
  plan = good;
  std::swap(plan.stages[0], plan.stages[1]);
  EXPECT_NE(error_message([&] { plan.validate(graph); }).find("out of pipeline order"), std::string::npos);
  plan = good;
  plan.stages[1].tasks.pop_back();
  EXPECT_EQ(error_message([&] { plan.validate(graph); }), "plan (test): task loss is in no stage");
  plan = good;
  plan.stages[0].tasks.push_back(plan.stages[1].tasks.back());
  EXPECT_EQ(error_message([&] { plan.validate(graph); }), "plan (test): task loss is in stages 0 and 1");
  plan = good;
  plan.world_size = 8;
  EXPECT_NE(error_message([&] { plan.validate(graph); }).find("world size 8 is not 2 pipeline replicas x 3"),
            std::string::npos);
  plan = good;
  plan.global_batch = 10;
  EXPECT_NE(error_message([&] { plan.validate(graph); }).find("does not divide"), std::string::npos);
  plan = good;
  // A set with a hole (a layer's first and last task without the middle) is not convex.
  const std::vector<LayerGroup> groups = layer_groups(graph);
  plan.stages.resize(3);
  plan.stages[2] = plan.stages[1];
  plan.stages[1].tasks = groups[1].tasks;
  plan.stages[0].tasks = groups[0].tasks;
  const int middle = groups[1].tasks[groups[1].tasks.size() / 2];
  plan.stages[1].tasks.erase(std::find(plan.stages[1].tasks.begin(), plan.stages[1].tasks.end(), middle));
  plan.stages[2].tasks.insert(std::lower_bound(plan.stages[2].tasks.begin(), plan.stages[2].tasks.end(), middle), middle);
  plan.stages[2].tasks = join_groups(groups, 2, groups.size());
  plan.stages[2].tasks.insert(std::lower_bound(plan.stages[2].tasks.begin(), plan.stages[2].tasks.end(), middle), middle);
  plan.stages[2].replicas = 1;
  plan.world_size = 2 * 4;
  const std::string message = error_message([&] { plan.validate(graph); });
  EXPECT_TRUE(message.find("not convex") != std::string::npos || message.find("out of pipeline order") != std::string::npos)
      << message;
}

// A loss piece (BERT's MLM cross-entropy, a scalar per replica) may cross only between stages whose
// replicas hold the same samples; the planners' shared step moves its producer after the cut instead.
TEST(Plan, LossPiecesCrossOnlyBetweenEqualReplicas) {
  const Graph graph = build_model(tiny_model_config("bert"));
  std::vector<int> ordered;
  for (const Task& task : graph.tasks())
    if (!task.constant) ordered.push_back(task.id);
  const auto mlm_loss = std::find_if(ordered.begin(), ordered.end(),
                                     [&](int task) { return graph.task(task).name == "cls.predictions.loss"; });
  ASSERT_NE(mlm_loss, ordered.end());
  Plan plan;
  plan.planner = "test";
  plan.world_size = 3;
  plan.global_batch = 4;
  plan.microbatches = 2;
  plan.stages.resize(2);
  plan.stages[0].replicas = 2;
  const std::vector<std::vector<int>> stages = attach_constant_tasks(
      graph, {std::vector<int>(ordered.begin(), mlm_loss + 1), std::vector<int>(mlm_loss + 1, ordered.end())});
  plan.stages[0].tasks = stages[0];
  plan.stages[1].tasks = stages[1];
  ASSERT_EQ(unbatched_crossings(graph, plan.stages).size(), 1u);
  EXPECT_EQ(error_message([&] { plan.validate(graph); }),
            "plan (test): cls.predictions.loss has no batch dimension (a reduction over a replica's samples) and "
            "crosses from stage 0 (2 replicas) to stage 1 (1 replicas); it can only cross between stages with "
            "equal replicas");
  Plan equal = plan;
  equal.stages[1].replicas = 2;
  equal.world_size = 4;
  EXPECT_NO_THROW(equal.validate(graph));  // exchanged whole between replicas with the same samples

  EXPECT_TRUE(move_loss_pieces_off_unequal_boundaries(graph, plan));
  EXPECT_NO_THROW(plan.validate(graph));
  EXPECT_TRUE(unbatched_crossings(graph, plan.stages).empty());
  EXPECT_TRUE(std::binary_search(plan.stages[1].tasks.begin(), plan.stages[1].tasks.end(), *mlm_loss));
  EXPECT_FALSE(move_loss_pieces_off_unequal_boundaries(graph, plan));
}

TEST(Plan, JsonRoundTripThroughAFile) {
  const Graph graph = build_model(tiny_model_config("gpt"));
  Plan plan = two_stage_plan(graph);
  plan.schedule = ScheduleKind::GPipe;
  plan.stages[0].recompute = RecomputePolicy::StageBoundaries;
  plan.stages[1].forward_seconds = 0.25;
  plan.stages[1].memory_bytes = 12345;
  plan.predicted_step_seconds = 1.5;
  plan.precision = Precision::Bf16;
  plan.optimizer = "sgd";
  plan.optimizer_state_copies = 1;
  const std::string path = (std::filesystem::temp_directory_path() / "partrain_test_plan.json").string();
  plan.save(path);
  const Plan loaded = Plan::load(path);
  std::filesystem::remove(path);
  EXPECT_EQ(loaded.to_json(), plan.to_json());
  EXPECT_EQ(loaded.graph_hash, graph.hash());
  EXPECT_EQ(loaded.schedule, ScheduleKind::GPipe);
  EXPECT_EQ(loaded.stages[0].recompute, RecomputePolicy::StageBoundaries);
  EXPECT_EQ(loaded.stages[1].tasks, plan.stages[1].tasks);
  EXPECT_EQ(loaded.precision, Precision::Bf16);
  EXPECT_EQ(loaded.optimizer, "sgd");
  EXPECT_EQ(loaded.optimizer_state_copies, 1);
  EXPECT_NO_THROW(loaded.validate(graph));
  Plan inconsistent = loaded;
  inconsistent.optimizer_state_copies = 2;  // SGD keeps one state tensor per parameter
  EXPECT_NE(error_message([&] { inconsistent.validate(graph); }).find("optimizer 'sgd' with 2 state copies"),
            std::string::npos);
  nlohmann::json old = plan.to_json();
  old["version"] = 1;
  EXPECT_NE(error_message([&] { Plan::from_json(old, "old.json"); }).find("old.json: a plan of format version 1"),
            std::string::npos);
  EXPECT_NE(error_message([] { Plan::from_json(nlohmann::json{{"format", "other"}}, "x.json"); }).find("x.json: not a partrain plan"),
            std::string::npos);
  EXPECT_NE(error_message([&] { loaded.validate(build_model(tiny_model_config("bert"))); }).find("another model"), std::string::npos);
  // fp16 (dynamic loss scaling) is recorded and read back like bf16; an unknown precision is named.
  nlohmann::json fp16 = plan.to_json();
  fp16["precision"] = "fp16";
  EXPECT_EQ(Plan::from_json(fp16, "fp16.json").precision, Precision::Fp16);
  EXPECT_EQ(Plan::from_json(fp16, "fp16.json").to_json().at("precision"), "fp16");
  EXPECT_EQ(compute_dtype_of(Precision::Fp16), DType::F16);
  EXPECT_EQ(compute_dtype_of(Precision::Bf16), DType::BF16);
  EXPECT_EQ(compute_dtype_of(Precision::Fp32), DType::F32);
  fp16["precision"] = "fp8";
  EXPECT_NE(error_message([&] { Plan::from_json(fp16, "fp8.json"); }).find("unknown precision 'fp8' (expected fp32, bf16 or fp16)"),
            std::string::npos);
}

TEST(Plan, InterleavedJsonRoundTripAndValidation) {
  // gpt-tiny in 4 model chunks on 2 pipeline stages (v = 2): chunk c on stage c mod 2.
  const Graph graph = build_model(tiny_model_config("gpt"));
  const std::vector<LayerGroup> groups = layer_groups(graph);  // embeddings, h.0, h.1, ln_f, head, loss
  ASSERT_EQ(groups.size(), 6u);
  Plan plan;
  plan.planner = "test";
  plan.graph_hash = graph.hash();
  plan.global_batch = 8;
  plan.microbatches = 2;
  plan.schedule = ScheduleKind::Interleaved;
  plan.virtual_stages = 2;
  const std::vector<std::pair<std::size_t, std::size_t>> chunks = {{0, 1}, {1, 2}, {2, 3}, {3, 6}};
  for (const auto& [first, last] : chunks) {
    PlanStage stage;
    stage.tasks = join_groups(groups, first, last);
    stage.replicas = 2;
    plan.stages.push_back(stage);
  }
  plan.world_size = 4;
  EXPECT_NO_THROW(plan.validate(graph));
  const Plan loaded = Plan::from_json(plan.to_json(), "test");
  EXPECT_EQ(loaded.virtual_stages, 2);
  EXPECT_EQ(loaded.schedule, ScheduleKind::Interleaved);
  EXPECT_EQ(loaded.to_json(), plan.to_json());
  EXPECT_EQ(loaded.chunks_of_stage(0), (std::vector<int>{0, 2}));
  // A rank of stage 0 holds chunks 0 and 2 but computes one at a time: their held parts add up, and
  // the larger working part comes on top; a walked peak (rank_peak_bytes) takes precedence.
  plan.stages[0].memory_bytes = 100;
  plan.stages[0].working_bytes = 30;
  plan.stages[2].memory_bytes = 50;
  plan.stages[2].working_bytes = 20;
  EXPECT_DOUBLE_EQ(plan.rank_memory_bytes(0), 70 + 30 + 30);
  plan.rank_peak_bytes = {90, 80};
  EXPECT_DOUBLE_EQ(plan.rank_memory_bytes(0), 90);
  const Plan reloaded = Plan::from_json(plan.to_json(), "test");
  EXPECT_EQ(reloaded.rank_peak_bytes, plan.rank_peak_bytes);
  EXPECT_DOUBLE_EQ(reloaded.stages[2].working_bytes, 20);
  EXPECT_EQ(reloaded.to_json(), plan.to_json());
  plan.rank_peak_bytes.clear();
  Plan wrong = plan;
  wrong.world_size = 8;  // 2 stages x 2 replicas, not 4 chunks x 2
  EXPECT_NE(error_message([&] { wrong.validate(graph); }).find("world size 8 is not 1 pipeline replicas x 4"),
            std::string::npos);
  wrong = plan;
  wrong.stages[3].replicas = 1;
  EXPECT_NE(error_message([&] { wrong.validate(graph); }).find("model chunk 3 has 1 replicas"), std::string::npos);
  nlohmann::json old = plan.to_json();
  old.erase("virtual_stages");  // plans made before interleaving: one chunk per stage, then inconsistent here
  EXPECT_EQ(Plan::from_json(old, "test").virtual_stages, 1);
}

TEST(Plan, ZeroBubbleJsonRoundTripAndValidation) {
  // gpt-tiny in 4 model chunks in a V on 2 pipeline stages: chunks 0 and 3 on stage 0, 1 and 2 on 1.
  const Graph graph = build_model(tiny_model_config("gpt"));
  const std::vector<LayerGroup> groups = layer_groups(graph);
  Plan plan;
  plan.planner = "test";
  plan.graph_hash = graph.hash();
  plan.global_batch = 8;
  plan.microbatches = 3;  // zb_v takes any microbatch count
  plan.schedule = ScheduleKind::ZeroBubbleV;
  plan.virtual_stages = 2;
  const std::vector<std::pair<std::size_t, std::size_t>> chunks = {{0, 1}, {1, 2}, {2, 3}, {3, 6}};
  const std::vector<int> replicas = {1, 2, 2, 1};  // stage 0: 1 replica, stage 1: 2
  for (std::size_t c = 0; c < chunks.size(); ++c) {
    PlanStage stage;
    stage.tasks = join_groups(groups, chunks[c].first, chunks[c].second);
    stage.replicas = replicas[c];
    stage.weight_gradient_seconds = 0.001 * static_cast<double>(c + 1);
    plan.stages.push_back(stage);
  }
  plan.world_size = 3;
  plan.global_batch = 6;
  plan.microbatches = 3;
  EXPECT_NO_THROW(plan.validate(graph));
  const Plan loaded = Plan::from_json(plan.to_json(), "test");
  EXPECT_EQ(loaded.schedule, ScheduleKind::ZeroBubbleV);
  EXPECT_EQ(loaded.to_json(), plan.to_json());
  EXPECT_EQ(loaded.stages[2].weight_gradient_seconds, 0.003);
  EXPECT_EQ(loaded.chunks_of_stage(0), (std::vector<int>{0, 3}));
  EXPECT_EQ(loaded.chunks_of_stage(1), (std::vector<int>{1, 2}));
  EXPECT_EQ(loaded.stage_of_chunk(3), 0);
  EXPECT_EQ(loaded.local_chunk_index(2), 1);
  Plan wrong = plan;
  wrong.stages[3].replicas = 2;  // chunk 3 runs on stage 0, which has 1 replica
  EXPECT_NE(error_message([&] { wrong.validate(graph); }).find("model chunk 3 has 2 replicas"), std::string::npos);
  wrong = plan;
  wrong.virtual_stages = 3;
  EXPECT_NE(error_message([&] { wrong.validate(graph); }).find("zb_v schedule needs virtual_stages = 2"), std::string::npos);
  plan.schedule = ScheduleKind::ZeroBubbleH1;  // one chunk per stage
  EXPECT_NE(error_message([&] { plan.validate(graph); }).find("needs the interleaved or zb_v schedule"), std::string::npos);
}

TEST(Plan, SummariesNameLayerRanges) {
  const Graph graph = build_model(tiny_model_config("bert"));
  const std::vector<LayerGroup> groups = layer_groups(graph);
  EXPECT_EQ(summarize_tasks(graph, join_groups(groups, 0, 3)), "embeddings, encoder.layer.0-1");
  const std::vector<int> part(groups[1].tasks.begin(), groups[1].tasks.begin() + 3);
  EXPECT_NE(summarize_tasks(graph, part).find("encoder.layer.0 (3 of "), std::string::npos);
}

// Two stages, stage 1 (the MLM head over all 3 samples of a microbatch) much slower than stage 0
// (2 of the 3 samples, on 2 replicas). By hand, with M = 4 and free transfers: stage 1 runs its M
// forwards and M backwards back to back once the first microbatch arrives (after stage 0's f0),
// and stage 0's last backward ends b0 after stage 1's last one; then stage 0's all-reduce and the
// optimizer step's all-reduce of the tied word embeddings. GPipe and
// 1F1B have this same step time; the closed form (M + S − 1) · max(f + b) would overestimate it.
TEST(PlanBuilder, PredictionsSimulateTheScheduleWithTheCostModel) {
  const Graph graph = build_model(tiny_model_config("bert"));
  const TaskSumCostModel cost(graph, 1e12);
  const std::vector<LayerGroup> groups = layer_groups(graph);
  const std::vector<std::vector<int>> stages = {join_groups(groups, 0, 2), join_groups(groups, 2, groups.size())};
  const profile::Measurement first = cost.measure(stages[0], 2), second = cost.measure(stages[1], 3);
  ASSERT_GT(second.forward_seconds, first.forward_seconds);
  for (const ScheduleKind schedule : {ScheduleKind::GPipe, ScheduleKind::OneForwardOneBackward}) {
    SCOPED_TRACE(schedule_name(schedule));
    PlannerOptions options;
    options.world_size = 3;
    options.global_batch = 12;
    options.microbatches = 4;
    options.recompute = "none";
    options.schedule = schedule;
    const Plan plan = plan_from_stages(graph, stages, {2, 1}, cost, options, "test");
    ASSERT_EQ(plan.microbatches, 4);
    ASSERT_EQ(plan.microbatch_size(), 3);
    EXPECT_DOUBLE_EQ(plan.stages[0].forward_seconds, first.forward_seconds);
    EXPECT_DOUBLE_EQ(plan.stages[1].backward_seconds, second.backward_seconds);
    // The word embeddings are tied to the MLM head's decoder: reduced in the optimizer step over the
    // 3 ranks of both stages, not in stage 0's data-parallel all-reduce (stage 0 has 2 replicas).
    const double tied = static_cast<double>(graph.value(graph.value_id("bert.embeddings.word_embeddings.weight")).type.bytes(1));
    const double allreduce = (first.parameter_bytes - tied) / 1e9;
    EXPECT_NEAR(plan.stages[0].allreduce_seconds, allreduce, 1e-15);
    EXPECT_DOUBLE_EQ(plan.stages[1].allreduce_seconds, 0.0);
    EXPECT_NEAR(plan.stages[0].tied_allreduce_seconds, tied / 1e9, 1e-15);
    EXPECT_NEAR(plan.stages[1].tied_allreduce_seconds, tied / 1e9, 1e-15);
    const double pipeline = first.forward_seconds + 4 * (second.forward_seconds + second.backward_seconds) +
                            first.backward_seconds;
    const double by_hand = pipeline + allreduce + tied / 1e9;  // then the tied all-reduce, the step's barrier
    EXPECT_NEAR(plan.predicted_step_seconds, by_hand, 1e-12);
    // Stage 1 is busy 4 (f1 + b1) of the pipeline phase, stage 0's two replicas 4 (f0 + b0) each.
    const double busy = 4 * (second.forward_seconds + second.backward_seconds) +
                        2 * 4 * (first.forward_seconds + first.backward_seconds);
    EXPECT_NEAR(plan.predicted_bubble_fraction, 1 - busy / (3 * pipeline), 1e-9);
    // 1F1B: stage 0 keeps min(S - 0, M) = 2 microbatches in flight, stage 1 one; GPipe all 4.
    // AdamW: 4 state bytes per byte.
    const double in_flight = schedule == ScheduleKind::GPipe ? 4 : 2;
    EXPECT_NEAR(plan.stages[0].memory_bytes, first.parameter_bytes * 4 + in_flight * first.activation_bytes, 1e-3);
    EXPECT_EQ(plan.stages[0].summary, "embeddings, encoder.layer.0");
  }
}

// ZeRO-1 shards a stage's optimizer state and adds its reduced gradient part over a data-parallel
// group of more than one rank, and leaves parameters tied to another stage whole (the runtime reduces
// those over the stages sharing them): bert's word embeddings on stage 0 (2 replicas) and the MLM
// decoder on stage 1 (1 replica, nothing to shard over).
TEST(PlanBuilder, ZeroShardsTheUntiedParametersOfGroupsLargerThanOne) {
  const Graph graph = build_model(tiny_model_config("bert"));
  const TaskSumCostModel cost(graph, 1e12);
  const std::vector<LayerGroup> groups = layer_groups(graph);
  const std::vector<std::vector<int>> stages = {join_groups(groups, 0, 2), join_groups(groups, 2, groups.size())};
  const profile::Measurement first = cost.measure(stages[0], 3), second = cost.measure(stages[1], 6);
  PlannerOptions options;
  options.world_size = 3;
  options.global_batch = 12;
  options.microbatches = 2;
  options.recompute = "none";
  options.zero = 1;
  const Plan plan = plan_from_stages(graph, stages, {2, 1}, cost, options, "test");
  ASSERT_EQ(plan.microbatch_size(), 6);
  const double tied = static_cast<double>(graph.value(graph.value_id("bert.embeddings.word_embeddings.weight")).type.bytes(1));
  // AdamW in fp32: weights 1 + gradients 1 + (Adam 2 + reduced part 1) / 2 on stage 0's untied bytes;
  // 4 on the tied ones and on every byte of stage 1.
  EXPECT_NEAR(plan.stages[0].memory_bytes, (first.parameter_bytes - tied) * 3.5 + tied * 4 + 2 * first.activation_bytes, 1e-3);
  EXPECT_NEAR(plan.stages[1].memory_bytes, second.parameter_bytes * 4 + second.activation_bytes, 1e-3);
  EXPECT_DOUBLE_EQ(plan.stages[0].working_bytes, first.peak_bytes - first.activation_bytes);
}

// Merak's stage-aware recomputation (merak.txt §6.2): with memory between "stage 0 recomputes
// everything" and "stage 0 keeps everything", stage 0 keeps as many of its last layers as fit and
// recomputes the others; the last stage (no microbatch in flight beyond its own) keeps all. The
// expected figures are computed here from the memory accounting (model state + per in-flight
// microbatch its inputs and kept activations + one microbatch's full activations).
TEST(PlanBuilder, StageAwareRecomputationKeepsTheLayersTheMemoryAllows) {
  const Graph graph = build_model(tiny_model_config("bert"));
  PlannerOptions options;
  options.world_size = 2;
  options.global_batch = 8;
  options.microbatches = 4;
  options.memory_margin = 0;
  options.recompute = "stage_aware";
  const std::vector<LayerGroup> groups = layer_groups(graph);
  const std::vector<std::vector<int>> stages = {join_groups(groups, 0, 3), join_groups(groups, 3, groups.size())};
  // Stage 0's layers begin at groups 0, 1 and 2's first non-constant tasks.
  std::vector<int> starts;
  for (int g = 0; g < 3; ++g)
    for (int task : groups[g].tasks)
      if (!graph.task(task).constant) {
        starts.push_back(task);
        break;
      }
  std::sort(starts.begin(), starts.end());
  const TaskSumCostModel probe(graph, 1e12);
  const profile::Measurement first = probe.measure(stages[0], 2), second = probe.measure(stages[1], 2);
  // 1F1B with recomputation: stage 0 keeps 2 microbatches (of 2 samples) in flight, stage 1 one.
  const auto tasks_from = [&](int start) {
    std::vector<int> tasks;
    for (int task : stages[0])
      if (task >= start) tasks.push_back(task);
    return tasks;
  };
  std::vector<double> memory_keeping(4);  // index: layers kept
  for (int kept = 0; kept <= 3; ++kept) {
    const double kept_bytes = kept == 0 ? 0.0 : probe.measure(tasks_from(starts[3 - kept]), 2).activation_bytes;
    memory_keeping[kept] = kept == 3 ? first.parameter_bytes * 4 + 2 * first.activation_bytes
                                     : first.parameter_bytes * 4 + 2 * (first.boundary_input_bytes + kept_bytes) +
                                           (first.activation_bytes - kept_bytes);
  }
  const double keep_second = second.parameter_bytes * 4 + second.activation_bytes;
  ASSERT_LT(keep_second, memory_keeping[1]);
  for (int kept = 1; kept <= 2; ++kept) {
    ASSERT_LT(memory_keeping[kept - 1], memory_keeping[kept]);
    // Just above what keeping `kept` layers needs: exactly those are kept.
    const TaskSumCostModel cost(graph, memory_keeping[kept] * (1 + 1e-9));
    const Plan plan = plan_from_stages(graph, stages, {1, 1}, cost, options, "test");
    EXPECT_EQ(plan.stages[0].recompute, RecomputePolicy::StageAware) << kept;
    EXPECT_EQ(plan.stages[0].recompute_until_task, starts[3 - kept]) << kept;
    std::vector<int> prefix;
    for (int task : stages[0])
      if (task < starts[3 - kept]) prefix.push_back(task);
    EXPECT_NEAR(plan.stages[0].backward_seconds, first.backward_seconds + probe.measure(prefix, 2).forward_seconds, 1e-12);
    EXPECT_NEAR(plan.stages[0].memory_bytes, memory_keeping[kept], 1e-3);
    EXPECT_EQ(plan.stages[1].recompute, RecomputePolicy::None);
    EXPECT_NEAR(plan.stages[1].memory_bytes, keep_second, 1e-3);
    // The JSON round trip keeps the boundary, and the validator takes it.
    const Plan again = Plan::from_json(plan.to_json(), "round trip");
    EXPECT_EQ(again.stages[0].recompute_until_task, plan.stages[0].recompute_until_task);
    again.validate(graph);
  }
  // Below what recomputing stage 0 whole needs nothing fits: everything recomputes; above keeping
  // everything nothing does.
  const Plan tight = plan_from_stages(graph, stages, {1, 1}, TaskSumCostModel(graph, memory_keeping[0]), options, "test");
  EXPECT_EQ(tight.stages[0].recompute, RecomputePolicy::StageBoundaries);
  EXPECT_EQ(tight.stages[0].recompute_until_task, -1);
  const Plan roomy = plan_from_stages(graph, stages, {1, 1}, TaskSumCostModel(graph, memory_keeping[3]), options, "test");
  EXPECT_EQ(roomy.stages[0].recompute, RecomputePolicy::None);
  // A boundary outside the stage is refused.
  Plan bad = plan_from_stages(graph, stages, {1, 1}, TaskSumCostModel(graph, memory_keeping[1] * (1 + 1e-9)), options, "test");
  bad.stages[0].recompute_until_task = bad.stages[0].tasks.front();
  EXPECT_THROW(bad.validate(graph), partrain::Error);
}

// recompute = "auto" (issue 24): each stage takes the policy that repeats the least forward work and
// fits — none, then selective (the attention cores), then every layer, then the whole stage — and
// the plan records it. GPT-tiny with 6 layers over 2 stages (h.0–4 | h.5 and the head), 1F1B with 4
// microbatches (stage 0 holds 2 in flight, stage 1 one). At every memory level between the fixed
// policies' figures, each stage's choice is the first of those whose fixed-policy plan fits it, with
// that plan's memory and backward time.
TEST(PlanBuilder, AutoRecomputationChoosesPerStageTheCheapestThatFits) {
  ModelConfig config = tiny_model_config("gpt");
  config.layers = 6;
  const Graph graph = build_model(config);
  PlannerOptions options;
  options.world_size = 2;
  options.global_batch = 8;
  options.microbatches = 4;
  options.memory_margin = 0;
  const std::vector<LayerGroup> groups = layer_groups(graph);
  std::size_t cut = 0;
  while (groups[cut].name != "h.5") ++cut;
  const std::vector<std::vector<int>> stages = {join_groups(groups, 0, cut), join_groups(groups, cut, groups.size())};
  DeviceSpec roomy;
  roomy.memory_bytes = 1e12;
  const auto figures = [&](const std::string& recompute) {
    PlannerOptions fixed = options;
    fixed.recompute = recompute;
    return plan_from_stages(graph, stages, {1, 1}, *make_analytic_cost_model(graph, roomy), fixed, "test");
  };
  const std::vector<std::string> order = {"none", "selective", "layers", "boundaries"};
  std::vector<Plan> fixed;
  for (const std::string& name : order) fixed.push_back(figures(name));
  const Plan &none = fixed[0], &selective = fixed[1], &layers = fixed[2];
  // Selective repeats the attention cores' forward (a little), layers the stage's (all of it), and
  // the backward pays it.
  for (int s = 0; s < 2; ++s) {
    EXPECT_GT(selective.stages[s].recompute_seconds, 0);
    EXPECT_LT(selective.stages[s].recompute_seconds, 0.5 * layers.stages[s].recompute_seconds);
    EXPECT_NEAR(layers.stages[s].backward_seconds - none.stages[s].backward_seconds, layers.stages[s].recompute_seconds, 1e-15);
    // The last stage's loss block checkpoints the logits, which its "none" keeps too: no less there.
    EXPECT_LE(layers.stages[s].memory_bytes, none.stages[s].memory_bytes);
  }
  EXPECT_LT(layers.stages[0].memory_bytes, selective.stages[0].memory_bytes);
  EXPECT_LT(selective.stages[0].memory_bytes, none.stages[0].memory_bytes);

  std::vector<double> levels;
  for (const Plan& plan : fixed)
    for (const PlanStage& stage : plan.stages) levels.push_back(stage.memory_bytes * (1 + 1e-9));
  int differing = 0;
  for (double memory : levels) {
    DeviceSpec device;
    device.memory_bytes = memory;
    Plan chosen;
    try {
      chosen = plan_from_stages(graph, stages, {1, 1}, *make_analytic_cost_model(graph, device), options, "test");
    } catch (const Error&) {
      continue;  // below what some stage needs under every policy
    }
    for (int s = 0; s < 2; ++s) {
      std::size_t expected = 0;
      while (expected + 1 < fixed.size() && fixed[expected].stages[s].memory_bytes > memory) ++expected;
      EXPECT_EQ(recompute_name(chosen.stages[s].recompute), order[expected]) << "stage " << s << " at " << memory;
      EXPECT_DOUBLE_EQ(chosen.stages[s].memory_bytes, fixed[expected].stages[s].memory_bytes) << s;
      EXPECT_DOUBLE_EQ(chosen.stages[s].backward_seconds, fixed[expected].stages[s].backward_seconds) << s;
    }
    differing += chosen.stages[0].recompute != chosen.stages[1].recompute;
  }
  EXPECT_GT(differing, 0) << "no memory level gives the two stages different policies";

  Plan every_two = figures("layers");
  every_two.stages[0].recompute_layers = 2;
  const Plan again = Plan::from_json(every_two.to_json(), "round trip");
  EXPECT_EQ(again.stages[0].recompute, RecomputePolicy::Layers);
  EXPECT_EQ(again.stages[0].recompute_layers, 2);
  again.validate(graph);
  Plan bad = again;
  bad.stages[0].recompute_layers = 0;
  EXPECT_THROW(bad.validate(graph), partrain::Error);
  EXPECT_NE(format_plan_table(again).find("layers/2"), std::string::npos);
}

// §6.2's rule across stages: stage i keeps α_i = min(1, n_1·α_1 / n_i) of its layers (rounded down),
// n_i the microbatches it holds beyond the one in its backward, with α_1 as large as the memory
// allows. GPT with 12 layers on 4 stages of 3 under scp, M = 8; the memory is set to what the
// plan with stage 0 keeping 2 of its layers (embedding + 3 blocks) needs.
TEST(PlanBuilder, StageAwareRecomputationFollowsMeraksRuleAcrossStages) {
  ModelConfig config = tiny_model_config("gpt");
  config.layers = 12;
  const Graph graph = build_model(config);
  PlannerOptions options;
  options.world_size = 4;
  options.global_batch = 8;
  options.microbatches = 8;
  options.memory_margin = 0;
  options.schedule = ScheduleKind::ShiftedCriticalPath;
  options.recompute = "stage_aware";
  const std::vector<LayerGroup> groups = layer_groups(graph);
  const std::size_t per_stage = groups.size() / 4;
  std::vector<std::vector<int>> stages;
  for (std::size_t s = 0; s < 4; ++s)
    stages.push_back(join_groups(groups, s * per_stage, s == 3 ? groups.size() : (s + 1) * per_stage));
  // The layers of each stage: the groups it holds.
  std::vector<int> layers(4);
  for (std::size_t s = 0; s < 4; ++s) layers[s] = static_cast<int>((s == 3 ? groups.size() : (s + 1) * per_stage) - s * per_stage);
  // Find the memory at which stage 0 keeps exactly 2 layers: scan upwards from a tight device.
  const TaskSumCostModel probe(graph, 1e12);
  Plan found;
  double memory = 0;
  for (double bytes = 1e6; bytes < 1e10 && found.stages.empty(); bytes *= 1.02) {
    Plan plan;
    try {
      plan = plan_from_stages(graph, stages, {1, 1, 1, 1}, TaskSumCostModel(graph, bytes), options, "test");
    } catch (const partrain::Error&) {
      continue;  // too small for any recomputation
    }
    if (plan.stages[0].recompute == RecomputePolicy::StageAware) {
      int kept = 0;
      for (int g = 0; g < layers[0]; ++g)
        for (int task : groups[g].tasks)
          if (!graph.task(task).constant) {
            kept += task >= plan.stages[0].recompute_until_task;
            break;
          }
      if (kept >= 2) {
        found = plan;
        memory = bytes;
      }
    }
  }
  ASSERT_FALSE(found.stages.empty()) << "no memory gave stage 0 a partial recomputation";
  const auto kept_layers = [&](const PlanStage& stage, int s) {
    if (stage.recompute == RecomputePolicy::None) return layers[s];
    if (stage.recompute == RecomputePolicy::StageBoundaries) return 0;
    int kept = 0;
    for (std::size_t g = s * per_stage; g < s * per_stage + static_cast<std::size_t>(layers[s]); ++g)
      for (int task : groups[g].tasks)
        if (!graph.task(task).constant) {
          kept += task >= stage.recompute_until_task;
          break;
        }
    return kept;
  };
  const double alpha_first = static_cast<double>(kept_layers(found.stages[0], 0)) / layers[0];
  std::vector<int> extra(4);
  for (int s = 0; s < 4; ++s)
    extra[s] = partrain::microbatches_in_flight(ScheduleKind::ShiftedCriticalPath, s, 4, 8, true) - 1;
  extra[3] = 0;  // scp's last stage never recomputes
  EXPECT_GT(extra[0], extra[1]);
  for (int s = 1; s < 4; ++s) {
    const double alpha = extra[s] == 0 ? 1.0 : std::min(1.0, alpha_first * extra[0] / extra[s]);
    EXPECT_EQ(kept_layers(found.stages[s], s), static_cast<int>(std::floor(alpha * layers[s] + 1e-9))) << "stage " << s;
  }
  std::printf("α_1 = %.3f; layers kept per stage: %d/%d %d/%d %d/%d %d/%d\n", alpha_first, kept_layers(found.stages[0], 0),
              layers[0], kept_layers(found.stages[1], 1), layers[1], kept_layers(found.stages[2], 2), layers[2],
              kept_layers(found.stages[3], 3), layers[3]);
  for (const PlanStage& stage : found.stages) EXPECT_LE(stage.memory_bytes, memory);
  // Every generated list stays complete and deadlock-free with partly recomputed stages.
  EXPECT_EQ(error_message([&] { partrain::check_schedule(found, partrain::generate_schedule(found)); }), "");
}

TEST(PlanBuilder, ChoosesMicrobatchesAndReportsTheMemoryNeeded) {
  const Graph graph = build_model(tiny_model_config("gpt"));
  PlannerOptions options;
  options.world_size = 2;
  options.global_batch = 16;
  const std::vector<LayerGroup> groups = layer_groups(graph);
  const std::vector<std::vector<int>> stages = {join_groups(groups, 0, 2), join_groups(groups, 2, groups.size())};
  const TaskSumCostModel roomy(graph, 1e12);
  const Plan plan = plan_from_stages(graph, stages, {1, 1}, roomy, options, "test");
  // With equal costs per sample the bubble (M + S − 1)/M shrinks as M grows: the largest M wins.
  EXPECT_EQ(plan.microbatches, 16);
  const TaskSumCostModel tight(graph, 1e5);
  const std::string message = error_message([&] { plan_from_stages(graph, stages, {1, 1}, tight, options, "test"); });
  EXPECT_NE(message.find("test: the plan does not fit in"), std::string::npos) << message;
  EXPECT_NE(message.find("it needs at least"), std::string::npos) << message;
  EXPECT_NE(error_message([&] { equal_replicas(4, 3); }).find("do not divide"), std::string::npos);
}

}  // namespace
}  // namespace partrain::partition

namespace partrain::partition {
namespace {

// The ideals planner tries several device counts and skips infeasible ones, but the ideal cap
// ends the search with its own message (more devices cannot help).
TEST(TarnawskiPlanner, IdealCapEndsTheSearchAndInfeasibleCountsAreSkipped) {
  const Graph graph = build_model(tiny_model_config("bert"));
  const std::unique_ptr<CostModel> cost = make_analytic_cost_model(graph, DeviceSpec{});
  PlannerOptions options;
  options.planner = "ideals";
  options.world_size = 4;
  options.global_batch = 16;
  options.max_ideals = 5;
  EXPECT_NE(testing::error_message([&] { make_plan(graph, *cost, options); }).find("use the linearised planner"),
            std::string::npos);
  options.max_ideals = 200000;
  const Plan plan = make_plan(graph, *cost, options);
  EXPECT_EQ(plan.planner, "ideals");
  EXPECT_EQ(plan.world_size, 4);
}

// The ip planner solves the same contiguous problem as the ideals planner for every device count
// (the pipeline-ordered program of Tarnawski §5.1.3 searches the DP's splits), so on tiny models,
// solved to optimality, it finds plans as fast; asked for non-contiguous splits it says why
// training cannot run them.
TEST(TarnawskiPlanner, IntegerProgramPlansAsWellAsTheDpAndRefusesNonContiguousSplits) {
  for (const char* model : {"bert", "gpt"}) {
    const Graph graph = build_model(tiny_model_config(model));
    const std::unique_ptr<CostModel> cost = make_analytic_cost_model(graph, DeviceSpec{});
    PlannerOptions options;
    options.world_size = 4;
    options.global_batch = 16;
    options.planner = "ideals";
    const Plan dp = make_plan(graph, *cost, options);
    options.planner = "ip";
    options.ip_relative_gap = 0.0;
    const Plan ip = make_plan(graph, *cost, options);
    EXPECT_EQ(ip.planner, "ip") << model;
    EXPECT_NEAR(ip.predicted_step_seconds, dp.predicted_step_seconds, 1e-9 * dp.predicted_step_seconds) << model;
    EXPECT_EQ(ip.stages.size(), dp.stages.size()) << model;
    options.ip_contiguous = false;
    const std::string message = testing::error_message([&] { make_plan(graph, *cost, options); });
    EXPECT_NE(message.find("training needs contiguous ones"), std::string::npos) << message;
    EXPECT_NE(message.find("ip_contiguous = true"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace partrain::partition
