#include "partition/planner.h"

#include <algorithm>

#include "core/error.h"
#include "partition/atomic.h"
#include "partition/blocks.h"
#include "partition/capslog.h"
#include "partition/graph_workload.h"
#include "partition/manual.h"
#include "partition/merak_shard.h"
#include "partition/plan_builder.h"
#include "partition/stage_dp.h"
#include "partition/uniform.h"

namespace partrain::partition {
namespace {

// RaNNC (Tanaka et al., IPDPS 2021): atomic components (§III-A) -> k blocks (§III-B) -> stage DP
// (§III-C, Algorithms 1 and 2).
Plan plan_rannc(const Graph& graph, const CostModel& cost, const PlannerOptions& options) {
  const std::vector<AtomicComponent> components = atomic_components(graph);
  const std::int64_t batch = std::max<std::int64_t>(1, options.global_batch / options.world_size);
  const profile::MemoryPolicy policy = stage_memory_policy(options, 0, 1, 1);
  BlockOptions block_options;
  block_options.blocks = options.blocks;
  block_options.batch = batch;
  block_options.task_seconds.assign(graph.tasks().size(), 0.0);
  block_options.task_memory_bytes.assign(graph.tasks().size(), 0.0);
  for (const Task& task : graph.tasks()) {
    const int id = task.id;
    const profile::Measurement m = cost.measure(std::span<const int>(&id, 1), batch);
    block_options.task_seconds[id] = m.forward_seconds + m.backward_seconds;
    block_options.task_memory_bytes[id] = m.parameter_bytes * profile::model_state_factor(policy) + m.activation_bytes;
  }
  block_options.memory_limit_bytes = options.usable_memory_bytes(cost.device());
  block_options.bandwidth_bytes_per_second = cost.device().link_bandwidth;
  if (options.progress) options.progress(0.05);
  const std::vector<Block> blocks = partition_blocks(graph, components, block_options);
  std::vector<std::vector<int>> block_tasks;
  block_tasks.reserve(blocks.size());
  for (const Block& block : blocks) block_tasks.push_back(block.tasks);
  if (options.progress) options.progress(0.2);
  return plan_stages_rannc(graph, block_tasks, cost, options);
}

}  // namespace

Plan make_plan(const Graph& graph, const CostModel& cost, const PlannerOptions& options) {
  PARTRAIN_CHECK(options.world_size > 0, "planning needs a positive world size, not " << options.world_size);
  PARTRAIN_CHECK(options.global_batch > 0, "planning needs a positive global batch, not " << options.global_batch);
  const std::string& name = options.planner;
  const int tensor_parallel = options.tensor_parallel;
  PARTRAIN_CHECK(tensor_parallel >= 1 && options.world_size % tensor_parallel == 0,
                 "tensor_parallel " << tensor_parallel << " does not divide the " << options.world_size << " devices");
  // Each tensor-parallel group of t ranks is one device of the stage-and-replica layout.
  PlannerOptions groups = options;
  groups.world_size = options.world_size / tensor_parallel;
  Plan plan;
  if (name == "rannc") {
    plan = plan_rannc(graph, cost, groups);
  } else if (name == "ideals" || name == "dpl") {
    plan = plan_tarnawski(graph, cost, groups, name == "dpl");
  } else if (name == "capslog") {
    plan = plan_capslog(graph, cost, groups);
  } else if (name == "merak") {
    plan = plan_merak(graph, cost, groups);
  } else if (name == "uniform") {
    plan = plan_uniform(graph, cost, groups);
  } else if (name == "manual") {
    plan = plan_manual(graph, cost, groups);
  } else {
    PARTRAIN_FAIL("unknown planner '" << name << "' (expected rannc, ideals, dpl, capslog, merak, uniform or manual)");
  }
  plan.precision = options.mixed_precision ? Precision::Bf16 : Precision::Fp32;
  plan.optimizer = options.optimizer;
  plan.optimizer_state_copies = options.optimizer_state_copies;
  // A planner that chose replicas per stage may have cut between a loss piece and its consumer.
  if (move_loss_pieces_off_unequal_boundaries(graph, plan)) predict_plan(plan, graph, cost, groups);
  plan.tensor_parallel = tensor_parallel;
  plan.zero = options.zero;
  plan.sub_pipelined_tmp = options.sub_pipelined_tmp && tensor_parallel > 1;
  plan.world_size = plan.pipeline_copies * plan.devices_per_copy();
  plan.validate(graph);
  if (options.progress) options.progress(1.0);
  return plan;
}

}  // namespace partrain::partition
