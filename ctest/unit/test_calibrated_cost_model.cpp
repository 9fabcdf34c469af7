// The calibrated cost model: layer measurements at a few batch sizes, shared out by FLOPs.
#include <gtest/gtest.h>

#include "core/error.h"
#include "models/model.h"
#include "partition/common/calibrated_cost_model.h"
#include "partition/common/plan_builder.h"
#include "support/tiny_models.h"
#include <nlohmann/json.hpp>

namespace partrain::partition {
namespace {

Graph tiny_bert() { return build_model(testing::tiny_model_config("bert")); }

// Synthetic measurements: layer g at batch b takes (g + 1) · b ms forward and twice that backward,
// except batch 4, which is 10% slower than linear (so interpolation is visible).
profile::ProfileDB synthetic_db(const Graph& graph, const std::vector<LayerGroup>& groups,
                               const std::string& dtype = "fp32") {
  profile::ProfileDB db(graph.hash(), "cpu", dtype);
  for (std::size_t g = 0; g < groups.size(); ++g)
    for (std::int64_t batch : {1, 2, 4}) {
      profile::Measurement m;
      m.forward_seconds = (g + 1) * batch * 1e-3 * (batch == 4 ? 1.1 : 1.0);
      m.backward_seconds = 2 * m.forward_seconds;
      db.insert(groups[g].tasks, batch, m);
    }
  return db;
}

// `db` with warm times of every layer: `forward` and `backward` times its flushed ones.
profile::ProfileDB with_warm_times(profile::ProfileDB db, const std::vector<LayerGroup>& groups, double forward,
                                   double backward) {
  for (const LayerGroup& group : groups)
    for (std::int64_t batch : db.batches(group.tasks)) {
      profile::Measurement m = *db.find(group.tasks, batch);
      m.warm_forward_seconds = forward * m.forward_seconds;
      m.warm_backward_seconds = backward * m.backward_seconds;
      db.insert(group.tasks, batch, m);
    }
  return db;
}

TEST(CalibratedCostModel, LayersAtMeasuredInterpolatedAndExtrapolatedBatches) {
  const Graph graph = tiny_bert();
  const std::vector<LayerGroup> groups = layer_groups(graph);
  const profile::ProfileDB db = synthetic_db(graph, groups);
  const DeviceSpec device;
  const std::unique_ptr<CostModel> model = make_calibrated_cost_model(graph, db, device);
  const std::unique_ptr<CostModel> analytic = make_analytic_cost_model(graph, device);
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const double unit = (g + 1) * 1e-3;
    EXPECT_NEAR(model->measure(groups[g].tasks, 2).forward_seconds, 2 * unit, 1e-12) << groups[g].name;
    EXPECT_NEAR(model->measure(groups[g].tasks, 2).backward_seconds, 4 * unit, 1e-12);
    // batch 3: halfway between 2 · unit and 4.4 · unit
    EXPECT_NEAR(model->measure(groups[g].tasks, 3).forward_seconds, 3.2 * unit, 1e-12);
    // batch 8: proportional from batch 4
    EXPECT_NEAR(model->measure(groups[g].tasks, 8).forward_seconds, 8.8 * unit, 1e-12);
    // byte counts are the analytic model's (exact)
    EXPECT_DOUBLE_EQ(model->measure(groups[g].tasks, 2).activation_bytes, analytic->measure(groups[g].tasks, 2).activation_bytes);
    EXPECT_DOUBLE_EQ(model->measure(groups[g].tasks, 2).parameter_bytes, analytic->measure(groups[g].tasks, 2).parameter_bytes);
  }
  // Two whole layers add up; part of a layer gets its share of the layer's FLOPs.
  const std::vector<int> two = join_groups(groups, 1, 3);
  EXPECT_NEAR(model->measure(two, 1).forward_seconds, 2e-3 + 3e-3, 1e-12);
  const LayerGroup& layer = groups[1];
  std::vector<int> part(layer.tasks.begin(), layer.tasks.begin() + layer.tasks.size() / 2);
  double part_flops = 0, layer_flops = 0;
  for (int task : layer.tasks)
    if (!graph.task(task).constant) layer_flops += graph.task(task).cost.forward_flops;
  for (int task : part)
    if (!graph.task(task).constant) part_flops += graph.task(task).cost.forward_flops;
  ASSERT_GT(part_flops, 0);
  ASSERT_LT(part_flops, layer_flops);
  EXPECT_NEAR(model->measure(part, 1).forward_seconds, 2e-3 * part_flops / layer_flops, 1e-12);
}

// A task set whose weights, gradients and working memory fit the cache of its rank is priced at the
// warm times (its data stays cached from pass to pass), a larger one at the flushed times; a cache
// without warm figures or without a known cache size is priced flushed throughout.
TEST(CalibratedCostModel, SetsThatFitTheCachePerRankArePricedWarm) {
  const Graph graph = tiny_bert();
  const std::vector<LayerGroup> groups = layer_groups(graph);
  profile::ProfileDB db = with_warm_times(synthetic_db(graph, groups), groups, 0.5, 0.75);
  const DeviceSpec device;
  const std::vector<int> layer = groups[1].tasks;
  const std::vector<int> whole = join_groups(groups, 0, static_cast<int>(groups.size()));
  const std::unique_ptr<CostModel> unknown = make_calibrated_cost_model(graph, db, device);
  const profile::Measurement flushed_layer = unknown->measure(layer, 2);
  const profile::Measurement flushed_whole = unknown->measure(whole, 2);
  EXPECT_NEAR(flushed_layer.forward_seconds, 4e-3, 1e-12);  // no cache size recorded: flushed times
  // A cache between the layer's footprint and the whole model's.
  const double layer_footprint = 2 * flushed_layer.parameter_bytes + flushed_layer.peak_bytes;
  const double whole_footprint = 2 * flushed_whole.parameter_bytes + flushed_whole.peak_bytes;
  ASSERT_LT(layer_footprint, whole_footprint);
  db.set_cache_bytes_per_rank(0.5 * (layer_footprint + whole_footprint));
  const std::unique_ptr<CostModel> model = make_calibrated_cost_model(graph, db, device);
  EXPECT_NEAR(model->measure(layer, 2).forward_seconds, 0.5 * flushed_layer.forward_seconds, 1e-12);
  EXPECT_NEAR(model->measure(layer, 2).backward_seconds, 0.75 * flushed_layer.backward_seconds, 1e-12);
  EXPECT_NEAR(model->measure(layer, 3).forward_seconds, 0.5 * unknown->measure(layer, 3).forward_seconds, 1e-12);
  EXPECT_NEAR(model->measure(whole, 2).forward_seconds, flushed_whole.forward_seconds, 1e-12);
  EXPECT_DOUBLE_EQ(model->measure(whole, 2).peak_bytes, flushed_whole.peak_bytes);
  // The figures survive the cache file.
  const profile::ProfileDB reread = profile::ProfileDB::from_json(db.to_json(), "test");
  EXPECT_DOUBLE_EQ(reread.cache_bytes_per_rank(), db.cache_bytes_per_rank());
  EXPECT_DOUBLE_EQ(reread.find(layer, 2)->warm_forward_seconds, db.find(layer, 2)->warm_forward_seconds);
  EXPECT_DOUBLE_EQ(reread.find(layer, 2)->warm_backward_seconds, db.find(layer, 2)->warm_backward_seconds);
}

// predict_plan prices each stage against the cache its node's other ranks leave it: two stages on a
// node of two ranks run warm when their data fits the node's cache together and from memory when it
// does not, whatever an even share would say; two data-parallel replicas of one stage alike.
TEST(CalibratedCostModel, StagesOnANodeShareItsCache) {
  const Graph graph = tiny_bert();
  const std::vector<LayerGroup> groups = layer_groups(graph);
  profile::ProfileDB db = with_warm_times(synthetic_db(graph, groups), groups, 0.5, 0.5);
  PlannerOptions options;
  options.world_size = 2;
  options.global_batch = 4;
  options.microbatches = 2;
  options.recompute = "none";
  const std::vector<std::vector<int>> stages = {join_groups(groups, 0, 2), join_groups(groups, 2, groups.size())};
  const DeviceSpec device;
  const std::unique_ptr<CostModel> probe = make_calibrated_cost_model(graph, db, device);
  const profile::Measurement first = probe->measure(stages[0], 2), second = probe->measure(stages[1], 2);
  const double together = cache_footprint_bytes(first) + cache_footprint_bytes(second);
  // The node's cache (2 ranks) just above and just below what both stages touch.
  for (const double factor : {1.001, 0.999}) {
    db.set_cache_bytes_per_rank(together * factor / 2, 2);
    const std::unique_ptr<CostModel> cost = make_calibrated_cost_model(graph, db, device);
    EXPECT_DOUBLE_EQ(cost->cache_share().bytes, together * factor);
    const Plan plan = plan_from_stages(graph, stages, {1, 1}, *cost, options, "test");
    const double scale = factor > 1 ? 0.5 : 1.0;  // warm: half the flushed times
    EXPECT_NEAR(plan.stages[0].forward_seconds, scale * first.forward_seconds + cost->transfer_seconds(first.boundary_output_bytes, false), 1e-12);
    EXPECT_NEAR(plan.stages[1].forward_seconds, scale * second.forward_seconds + cost->transfer_seconds(second.boundary_output_bytes, false), 1e-12);
  }
  // Data parallelism: each replica of the whole model beside another; a cache for one alone is not enough.
  const std::vector<int> whole = join_groups(groups, 0, groups.size());
  const profile::Measurement one = probe->measure(whole, 1);
  db.set_cache_bytes_per_rank(cache_footprint_bytes(one) * 1.5 / 2, 2);
  const std::unique_ptr<CostModel> cost = make_calibrated_cost_model(graph, db, device);
  const Plan replicas = plan_from_stages(graph, {whole}, {2}, *cost, options, "test");
  EXPECT_NEAR(replicas.stages[0].forward_seconds, one.forward_seconds, 1e-12);
  db.set_cache_bytes_per_rank(cache_footprint_bytes(one) * 2.01 / 2, 2);
  const std::unique_ptr<CostModel> roomy = make_calibrated_cost_model(graph, db, device);
  const Plan warm_replicas = plan_from_stages(graph, {whole}, {2}, *roomy, options, "test");
  EXPECT_NEAR(warm_replicas.stages[0].forward_seconds, 0.5 * one.forward_seconds, 1e-12);
}

// A profile measured in mixed precision counts the activations the stage keeps in bf16, as the
// runtime keeps them (the analytic model's byte counts with bf16 activations); gpt-tiny's first
// bf16 stage was priced 6.7% over its measured peak with them counted in fp32.
TEST(CalibratedCostModel, MixedPrecisionProfilesCountBf16Activations) {
  const Graph graph = tiny_bert();
  const std::vector<LayerGroup> groups = layer_groups(graph);
  const profile::ProfileDB fp32 = synthetic_db(graph, groups);
  const profile::ProfileDB bf16 = synthetic_db(graph, groups, "bf16");
  const DeviceSpec device;
  const std::vector<int>& layer = groups[1].tasks;  // an encoder layer: every value it keeps is a float activation
  const double full = make_calibrated_cost_model(graph, fp32, device)->measure(layer, 2).activation_bytes;
  const double half = make_calibrated_cost_model(graph, bf16, device)->measure(layer, 2).activation_bytes;
  EXPECT_GT(full, 0);
  EXPECT_DOUBLE_EQ(half, 0.5 * full);
  EXPECT_DOUBLE_EQ(half, make_analytic_cost_model(graph, device, true)->measure(layer, 2).activation_bytes);
}

// A profile measured by ranks sharing their node's cores (4 ranks on 2 cores) carries the sharing
// into the plan, whose step the simulator then prices with the cores shared: two stages on one core's
// worth of a node take the sum of their work, not the pipeline's step with a core each.
TEST(CalibratedCostModel, RanksSharingCoresReachThePlanAndItsStep) {
  const Graph graph = tiny_bert();
  const std::vector<LayerGroup> groups = layer_groups(graph);
  profile::ProfileDB db = synthetic_db(graph, groups);
  PlannerOptions options;
  options.world_size = 2;
  options.global_batch = 4;
  options.microbatches = 4;
  options.recompute = "none";
  options.schedule = ScheduleKind::GPipe;
  const std::vector<std::vector<int>> stages = {join_groups(groups, 0, 2), join_groups(groups, 2, groups.size())};
  const DeviceSpec device;
  const Plan own_cores = plan_from_stages(graph, stages, {1, 1}, *make_calibrated_cost_model(graph, db, device), options, "test");
  EXPECT_EQ(own_cores.ranks_per_node, 0);

  db.set_core_sharing(2, 1.0);
  const profile::ProfileDB reread = profile::ProfileDB::from_json(db.to_json(), "profile.json");
  EXPECT_EQ(reread.sharing_ranks_per_node(), 2);
  EXPECT_DOUBLE_EQ(reread.concurrent_ranks_per_node(), 1.0);
  const std::unique_ptr<CostModel> cost = make_calibrated_cost_model(graph, reread, device);
  EXPECT_EQ(cost->core_share().ranks_per_node, 2);
  const Plan shared = plan_from_stages(graph, stages, {1, 1}, *cost, options, "test");
  EXPECT_EQ(shared.ranks_per_node, 2);
  EXPECT_DOUBLE_EQ(shared.concurrent_ranks_per_node, 1.0);
  // One core, no replicas: some rank computes at every moment until the last backward, so that is
  // every action's work (boundary transfers folded in) end to end; then the tied embedding's
  // all-reduce and both optimizer steps at once, on the one core.
  double work = 0, tied = 0;
  for (const PlanStage& stage : shared.stages) {
    work += options.microbatches * (stage.forward_seconds + stage.backward_seconds);
    tied = std::max(tied, stage.tied_allreduce_seconds);
  }
  const double steps = shared.stages[0].optimizer_seconds + shared.stages[1].optimizer_seconds;
  EXPECT_NEAR(shared.predicted_step_seconds, work + tied + steps, 1e-9 * work);
  EXPECT_LT(own_cores.predicted_step_seconds, 0.9 * shared.predicted_step_seconds);
  nlohmann::json bad = db.to_json();
  bad["concurrent_ranks_per_node"] = -1;
  EXPECT_THROW(profile::ProfileDB::from_json(bad, "profile.json"), Error);
}

// Measured memory and communication replace the analytic working memory and the config's bandwidths.
TEST(CalibratedCostModel, MeasuredWorkingMemoryAndCommunication) {
  const Graph graph = tiny_bert();
  const std::vector<LayerGroup> groups = layer_groups(graph);
  profile::ProfileDB db = synthetic_db(graph, groups);
  DeviceSpec device;
  device.link_bandwidth = 1e9;
  const std::unique_ptr<CostModel> analytic = make_analytic_cost_model(graph, device);
  EXPECT_DOUBLE_EQ(make_calibrated_cost_model(graph, db, device)->transfer_seconds(1e6, false),
                   analytic->transfer_seconds(1e6, false));  // nothing measured yet: the config
  // Layer g's forward + backward peaks at (g + 1) MB above its stored activations at batch 2.
  for (std::size_t g = 0; g < groups.size(); ++g) {
    profile::Measurement m = *db.find(groups[g].tasks, 2);
    m.activation_bytes = 5e6;
    m.peak_bytes = 5e6 + (g + 1) * 1e6;
    db.insert(groups[g].tasks, 2, m);
  }
  profile::CommunicationProfile communication;
  communication.within_node = {2e-6, 5e9};
  communication.allreduce[2] = {3e-6, 2e9};
  db.set_communication(communication);
  const std::unique_ptr<CostModel> model = make_calibrated_cost_model(graph, db, device);
  const std::vector<int> two = join_groups(groups, 1, 3);  // layers 1 and 2: the larger transient is 3 MB
  const profile::Measurement m = model->measure(two, 2);
  EXPECT_DOUBLE_EQ(m.peak_bytes, m.activation_bytes + 3e6);
  EXPECT_DOUBLE_EQ(model->transfer_seconds(1e6, false), 2e-6 + 1e6 / 5e9);
  EXPECT_DOUBLE_EQ(model->allreduce_seconds(1e6, 2, false), communication.allreduce_seconds(1e6, 2));
  // Across nodes was not measured: the config's network bandwidth.
  EXPECT_DOUBLE_EQ(model->transfer_seconds(1e6, true), analytic->transfer_seconds(1e6, true));
  EXPECT_NE(model->description().find("communication measured"), std::string::npos);
  // The optimizer step: measured seconds per parameter byte, 0 for an optimizer not measured.
  EXPECT_DOUBLE_EQ(model->optimizer_step_seconds(1e6, "adamw"), 0.0);
  db.set_optimizer_seconds_per_byte("adamw", 2e-9);
  EXPECT_DOUBLE_EQ(make_calibrated_cost_model(graph, db, device)->optimizer_step_seconds(1e6, "adamw"), 2e-3);
  EXPECT_DOUBLE_EQ(make_calibrated_cost_model(graph, db, device)->optimizer_step_seconds(1e6, "sgd"), 0.0);
  const profile::ProfileDB copy = profile::ProfileDB::from_json(db.to_json(), "test");
  EXPECT_EQ(copy.optimizer_seconds_per_byte(), db.optimizer_seconds_per_byte());
}

TEST(CalibratedCostModel, RequestsCoverEveryLayerAndMissingLayersAreErrors) {
  const Graph graph = tiny_bert();
  const std::vector<LayerGroup> groups = layer_groups(graph);
  const std::vector<profile::ProfileRequest> requests = calibration_requests(graph, 6);
  ASSERT_EQ(requests.size(), groups.size() * 4);  // batches 1, 2, 4, 6
  EXPECT_EQ(requests[3].batch, 6);
  EXPECT_EQ(requests[4].tasks, groups[1].tasks);
  profile::ProfileDB partial(graph.hash(), "cpu", "fp32");
  partial.insert(groups[0].tasks, 1, {});
  try {
    make_calibrated_cost_model(graph, partial, DeviceSpec{});
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(error.message().find("layer " + groups[1].name + " was not profiled"), std::string::npos) << error.message();
  }
  profile::ProfileDB other(graph.hash() + 1, "cpu", "fp32");
  EXPECT_THROW(make_calibrated_cost_model(graph, other, DeviceSpec{}), Error);
}

}  // namespace
}  // namespace partrain::partition
