#include "partition/planner.h"

#include "partition/common/recomputation.h"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "graph/tensor_parallel.h"
#include "partition/rannc/atomic.h"
#include "partition/rannc/blocks.h"
#include "partition/rannc/interleaving.h"
#include "partition/capslog/capslog.h"
#include "partition/tarnawski/graph_workload.h"
#include "partition/baselines/manual.h"
#include "partition/merak/merak_shard.h"
#include "partition/common/plan_builder.h"
#include "partition/rannc/stage_dp.h"
#include "partition/baselines/uniform.h"

namespace partrain::partition {
namespace {

// The group of t ranks as one device: a node holds devices_per_node / t groups; every cost is the
// wrapped model's (which prices one rank of the group on its tensor_parallel_graph).
class GroupCostModel final : public ForwardingCostModel {
 public:
  GroupCostModel(const CostModel& inner, int tensor_parallel)
      : ForwardingCostModel(inner), device_(inner.device()), tensor_parallel_(tensor_parallel) {
    device_.devices_per_node = std::max(1, device_.devices_per_node / tensor_parallel);
  }
  const DeviceSpec& device() const override { return device_; }
  // A group's t ranks compute together: the node holds 1/t as many groups, and as many fewer can
  // compute at once.
  CoreShare core_share() const override {
    CoreShare share = ForwardingCostModel::core_share();
    share.ranks_per_node /= tensor_parallel_;
    share.concurrent_ranks /= tensor_parallel_;
    return share;
  }

 private:
  DeviceSpec device_;
  int tensor_parallel_ = 1;
};

constexpr int kMaxBlockDoublings = 3;

// The least memory a set of tasks needs on one device in any plan the stage DP considers: one
// sample, one microbatch in flight, recomputation as with several stages, the optimizer state
// sharded over every group of the world under ZeRO-1.
double least_block_memory(const std::vector<int>& tasks, const CostModel& cost, const PlannerOptions& options) {
  profile::MemoryPolicy policy = stage_memory_policy(options, 1, 2, 1, options.world_size);
  return profile::stage_memory_bytes(cost.measure(tasks, 1), policy);
}

// Splits a block's tasks in two convex halves of about equal compute: a prefix and the rest of its
// non-constant tasks in id order (a topological order, so both are convex), each with the block's
// constant tasks it needs. Returns false for a block of one non-constant task.
bool split_block(const Graph& graph, const std::vector<int>& block, const std::vector<double>& task_seconds,
                 std::vector<int>& first, std::vector<int>& second) {
  std::vector<int> work;
  for (int task : block)
    if (!graph.task(task).constant) work.push_back(task);
  if (work.size() < 2) return false;
  double total = 0;
  for (int task : work) total += task_seconds[task];
  std::size_t cut = 1;
  double prefix = task_seconds[work[0]];
  while (cut + 1 < work.size() && prefix + task_seconds[work[cut]] <= total / 2) prefix += task_seconds[work[cut++]];
  std::vector<char> half(graph.tasks().size(), 0);  // 1: first, 2: second, 3: both (constants)
  for (std::size_t i = 0; i < work.size(); ++i) half[work[i]] = i < cut ? 1 : 2;
  // A constant task goes with every half that consumes it (directly or through other constants).
  for (auto task = block.rbegin(); task != block.rend(); ++task) {
    if (!graph.task(*task).constant) continue;
    char where = 0;
    for (int output : graph.task(*task).outputs)
      for (int consumer : graph.value(output).consumers) where |= half[consumer];
    half[*task] = where ? where : 1;
  }
  first.clear();
  second.clear();
  for (int task : block) {
    if (half[task] & 1) first.push_back(task);
    if (half[task] & 2) second.push_back(task);
  }
  return true;
}

// Blocks that cannot fit on one device even alone are split until they do (or are one task).
std::vector<std::vector<int>> split_oversized_blocks(const Graph& graph, std::vector<std::vector<int>> blocks,
                                                     const std::vector<double>& task_seconds, const CostModel& cost,
                                                     const PlannerOptions& options) {
  const double usable = options.usable_memory_bytes(cost.device());
  std::vector<std::vector<int>> result;
  std::vector<std::vector<int>> pending(std::make_move_iterator(blocks.rbegin()), std::make_move_iterator(blocks.rend()));
  while (!pending.empty()) {  // a stack: the next block in pipeline order on top
    std::vector<int> block = std::move(pending.back());
    pending.pop_back();
    std::vector<int> first, second;
    if (least_block_memory(block, cost, options) > usable && split_block(graph, block, task_seconds, first, second)) {
      pending.push_back(std::move(second));
      pending.push_back(std::move(first));
      continue;
    }
    result.push_back(std::move(block));
  }
  return result;
}

// What RaNNC's block partition (§III-B) needs of `graph`: each task's compute and memory at the
// per-replica batch of a data-parallel plan, the usable memory, options.blocks blocks.
BlockOptions rannc_block_options(const Graph& graph, const CostModel& cost, const PlannerOptions& options) {
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
  return block_options;
}

// The blocks (task ids of each) the stage DP cuts: RaNNC's block_options.blocks blocks, those too
// large for a device split until they fit.
std::vector<std::vector<int>> rannc_blocks(const Graph& graph, const std::vector<AtomicComponent>& components,
                                           const BlockOptions& block_options, const CostModel& cost,
                                           const PlannerOptions& options) {
  std::vector<std::vector<int>> block_tasks;
  for (const Block& block : partition_blocks(graph, components, block_options)) block_tasks.push_back(block.tasks);
  return split_oversized_blocks(graph, std::move(block_tasks), block_options.task_seconds, cost, options);
}

// RaNNC (Tanaka et al., IPDPS 2021): atomic components (§III-A) -> k blocks (§III-B) -> stage DP
// (§III-C, Algorithms 1 and 2), refining the blocks when they cannot make a plan that fits.
Plan plan_rannc(const Graph& graph, const CostModel& cost, const PlannerOptions& options) {
  const std::vector<AtomicComponent> components = atomic_components(graph);
  BlockOptions block_options = rannc_block_options(graph, cost, options);
  if (options.progress) options.progress(0.05);
  PlannerOptions quiet = options;
  quiet.progress = nullptr;
  const bool bounded = std::isfinite(options.step_seconds_bound);
  std::vector<std::vector<int>> block_tasks;
  for (int round = 0;; ++round) {
    block_tasks = rannc_blocks(graph, components, block_options, cost, options);
    if (options.progress) options.progress(0.2);
    // Under a bound an empty result may only mean "nothing faster": no refinement then.
    const bool last = bounded || round == kMaxBlockDoublings || block_tasks.size() >= components.size();
    if (last) break;
    if (std::optional<Plan> plan = try_plan_stages_rannc(graph, block_tasks, cost, round == 0 ? options : quiet))
      return *std::move(plan);
    // No split of these blocks fits: finer blocks give the DP more places to cut.
    block_options.blocks = static_cast<int>(std::min<std::size_t>(components.size(), 2 * static_cast<std::size_t>(block_options.blocks)));
  }
  if (options.diagnose_infeasible && !bounded) return plan_stages_rannc(graph, block_tasks, cost, options);
  if (std::optional<Plan> plan = try_plan_stages_rannc(graph, block_tasks, cost, quiet)) return *std::move(plan);
  if (bounded)
    PARTRAIN_FAIL("rannc: no plan beats a better layout's (its stage-DP step objective is "
                  << options.step_seconds_bound << " s)");
  PARTRAIN_FAIL("rannc: no plan fits in " << cost.device().memory_bytes / (1ull << 30) << " GiB per device ("
                                          << options.memory_margin << " margin) on " << options.world_size
                                          << " devices with " << block_tasks.size() << " blocks");
}

}  // namespace

Plan make_plan(const Graph& graph, const CostModel& cost, const PlannerOptions& options) {
  if (options.choose_schedule) {
    PlannerOptions one_f_one_b = options;
    one_f_one_b.choose_schedule = false;
    one_f_one_b.schedule = ScheduleKind::OneForwardOneBackward;
    PlannerOptions zero_bubble = one_f_one_b;
    zero_bubble.schedule = ScheduleKind::ZeroBubbleH1;
    std::optional<Plan> best;
    std::optional<Error> failure;
    auto consider = [&](const PlannerOptions& candidate) {
      try {
        Plan plan = make_plan(graph, cost, candidate);
        if (!best || plan.predicted_step_seconds < best->predicted_step_seconds) best = std::move(plan);
      } catch (const Error& error) {  // zb_h1 holds more activations on later stages: it may not fit
        if (!failure) failure = error;
      }
    };
    consider(one_f_one_b);
    consider(zero_bubble);
    if (options.planner == "merak") {  // Merak's own schedule (§6.1): 1F1B with the critical path shifted
      PlannerOptions shifted = one_f_one_b;
      shifted.schedule = ScheduleKind::ShiftedCriticalPath;
      consider(shifted);
    }
    if (best && best->pipeline_stages() > 1) {
      // zb_v at the depth and replicas chosen: the uniform planner's 2S chunks of near-equal layer
      // counts in a V (no planner searches V layouts of unequal chunks yet).
      PlannerOptions v_shape = one_f_one_b;
      v_shape.planner = "uniform";
      v_shape.schedule = ScheduleKind::ZeroBubbleV;
      v_shape.virtual_stages = 2;
      v_shape.stages = best->pipeline_stages();
      v_shape.microbatches = best->microbatches;
      consider(v_shape);
    }
    if (!best) throw *failure;
    return *std::move(best);
  }
  PARTRAIN_CHECK(options.world_size > 0, "planning needs a positive world size, not " << options.world_size);
  PARTRAIN_CHECK(options.global_batch > 0, "planning needs a positive global batch, not " << options.global_batch);
  const std::string& name = options.planner;
  const int tensor_parallel = tensor_parallel_degree(graph);
  PARTRAIN_CHECK(options.tensor_parallel <= 1 || options.tensor_parallel == tensor_parallel,
                 "tensor_parallel " << options.tensor_parallel << " asked for, but the graph was made for "
                                    << tensor_parallel << " (tensor_parallel_graph)");
  PARTRAIN_CHECK(tensor_parallel == 1 || options.sequence_parallel == is_sequence_parallel(graph),
                 "sequence_parallel " << (options.sequence_parallel ? "true" : "false") << " asked for, but the graph was made "
                                      << (options.sequence_parallel ? "without" : "with") << " it (tensor_parallel_graph)");
  PARTRAIN_CHECK(options.world_size % tensor_parallel == 0,
                 "tensor_parallel " << tensor_parallel << " does not divide the " << options.world_size << " devices");
  PARTRAIN_CHECK(options.zero == 0 || options.zero == 1, "planning needs zero 0 or 1, not " << options.zero);
  PARTRAIN_CHECK(options.virtual_stages >= 0,
                 "[parallel] virtual_stages must be at least 1 (or 0: the uniform or rannc planner chooses), not " << options.virtual_stages);
  PARTRAIN_CHECK(options.virtual_stages != 0 || name == "uniform" || name == "rannc",
                 "[parallel] virtual_stages = \"auto\": only the uniform and rannc planners choose the model chunks per rank, "
                 "not the " << name << " planner");
  PARTRAIN_CHECK(options.virtual_stages == 1 || schedule_has_chunks(options.schedule),
                 "[parallel] virtual_stages = " << options.virtual_stages << " needs schedule = \"interleaved\", not \""
                                                << schedule_name(options.schedule) << "\"");
  PARTRAIN_CHECK(options.virtual_stages <= 1 || name == "manual" || name == "uniform",
                 "[parallel] virtual_stages = " << options.virtual_stages << ": the " << name
                                                << " planner lays out one model chunk per pipeline stage"
                                                << (name == "rannc" ? " unless it chooses the chunks per rank itself "
                                                                      "(virtual_stages = \"auto\")"
                                                                    : "")
                                                << "; interleaved plans with a given number of chunks per rank come "
                                                   "from the manual and uniform planners");
  // Each tensor-parallel group of t ranks is one device of the stage-and-replica layout.
  PlannerOptions groups = options;
  groups.world_size = options.world_size / tensor_parallel;
  groups.tensor_parallel = 1;
  // zb_h1 runs 1F1B's stages with the weight gradients deferred: the planners lay out stages for
  // 1F1B (rannc's stage DP needs a memory policy that depends on S − s only; zb_h1's min(S, M) does
  // not), then the plan is priced again under zb_h1, which must still fit.
  const bool zero_bubble = options.schedule == ScheduleKind::ZeroBubbleH1;
  if (zero_bubble) groups.schedule = ScheduleKind::OneForwardOneBackward;
  const GroupCostModel group_cost(cost, tensor_parallel);
  Plan plan;
  if (name == "rannc") {
    plan = plan_rannc(graph, group_cost, groups);
  } else if (name == "ideals" || name == "dpl" || name == "ip") {
    plan = plan_tarnawski(graph, group_cost, groups, name == "dpl" ? TarnawskiSplit::dpl
                                                     : name == "ip" ? TarnawskiSplit::integer_program
                                                                    : TarnawskiSplit::ideals);
  } else if (name == "capslog") {
    plan = plan_capslog(graph, group_cost, groups);
  } else if (name == "merak") {
    plan = plan_merak(graph, group_cost, groups);
  } else if (name == "uniform") {
    plan = plan_uniform(graph, group_cost, groups);
  } else if (name == "manual") {
    plan = plan_manual(graph, group_cost, groups);
  } else {
    PARTRAIN_FAIL("unknown planner '" << name << "' (expected rannc, ideals, dpl, ip, capslog, merak, uniform or manual)");
  }
  record_planned_settings(plan, options);
  if (zero_bubble) {
    groups.schedule = ScheduleKind::ZeroBubbleH1;
    plan.schedule = ScheduleKind::ZeroBubbleH1;
    predict_plan(plan, graph, group_cost, groups);
    const double excess = memory_excess_bytes(plan, group_cost, groups);
    PARTRAIN_CHECK(excess <= 0, "schedule zb_h1: the " << name << " planner's stages need "
                                                       << excess / (1 << 20) << " MiB more than a device holds under "
                                                          "zb_h1 (every stage keeps min(S, M) microbatches' activations); "
                                                          "use 1f1b, more memory or recomputation");
  }
  // A planner that chose replicas per stage may have cut between a loss piece and its consumer.
  if (move_loss_pieces_off_unequal_boundaries(graph, plan)) predict_plan(plan, graph, group_cost, groups);
  plan.tensor_parallel = tensor_parallel;
  plan.ranks_per_node *= tensor_parallel;  // predicted for groups of t ranks
  plan.concurrent_ranks_per_node *= tensor_parallel;
  plan.zero = options.zero;
  plan.sub_pipelined_tmp = options.sub_pipelined_tmp && tensor_parallel > 1;
  plan.sequence_parallel = is_sequence_parallel(graph);
  plan.world_size = plan.pipeline_replicas * plan.devices_per_pipeline_replica();
  plan.validate(graph);
  if (options.progress) options.progress(1.0);
  return plan;
}

namespace {

// The stage DP's objective of a plan (stage_dp.h): (M + S − 1) · largest stage forward + backward
// time + largest stage all-reduce, in seconds; for an interleaved plan of v chunks per rank its
// interleaved form (M·v + S − 1) · largest chunk time + largest rank all-reduce (interleaving.h).
double stage_dp_objective(const Plan& plan) { return interleaved_objective_seconds(plan); }

// Whether a feasible candidate beats the best plan so far: more samples per second, and on a tie
// (within 1e-9 relative) the smaller tensor-parallel degree, then ZeRO off.
bool preferred(const LayoutCandidate& candidate, const Plan& best) {
  const double other = best.predicted_samples_per_second();
  if (candidate.samples_per_second > other * (1 + 1e-9)) return true;
  if (candidate.samples_per_second < other * (1 - 1e-9)) return false;
  if (candidate.tensor_parallel != best.tensor_parallel) return candidate.tensor_parallel < best.tensor_parallel;
  if (candidate.zero != best.zero) return candidate.zero < best.zero;
  return candidate.sequence_parallel && !best.sequence_parallel;  // the same time on less memory
}

// Plans one (t, zero, sequence parallelism) layout of make_3d_plan on its graph; updates the best
// plan and the best stage-DP objective. An error is the candidate's problem while searching, else
// thrown (one layout asked for: its own error, with the planner's diagnosis).
LayoutCandidate plan_layout(const Graph& planned, const CostModel& cost, const PlannerOptions& options, bool searching,
                            std::optional<Plan>& best, double& best_objective) {
  const auto start = std::chrono::steady_clock::now();
  LayoutCandidate candidate;
  candidate.tensor_parallel = options.tensor_parallel;
  candidate.zero = options.zero;
  candidate.sequence_parallel = options.tensor_parallel > 1 && options.sequence_parallel;
  // rannc choosing v reports its plain plan's objective: the bound stays what plain planning's is.
  double plain_objective = std::numeric_limits<double>::quiet_NaN();
  PlannerOptions reporting = options;
  reporting.plain_objective_seconds = &plain_objective;
  try {
    Plan plan = make_plan(planned, cost, reporting);
    candidate.feasible = true;
    candidate.samples_per_second = plan.predicted_samples_per_second();
    candidate.stages = plan.pipeline_stages();
    candidate.pipeline_replicas = plan.pipeline_replicas;
    candidate.virtual_stages = plan.virtual_stages;
    // (A plain plan returned is the one plain planning finds: its own objective, as without v.)
    const bool interleaved = plan.virtual_stages > 1 && !std::isnan(plain_objective);
    best_objective = std::min(best_objective, interleaved ? plain_objective : stage_dp_objective(plan));
    if (!best || preferred(candidate, *best)) best = std::move(plan);
  } catch (const Error& error) {
    if (!searching) throw;
    candidate.problem = error.message();
  }
  candidate.planning_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return candidate;
}

// Whether RaNNC's first round cuts `graph` into the same blocks at `coarse` blocks as at
// options.blocks (the refined count): so when the coarse blocks were already split below a layer to
// fit a device (the 1T GPT at t = 1), where a refined pass would run the whole DP again on the same
// cut points.
bool refinement_cuts_the_same_blocks(const Graph& graph, const CostModel& cost, const PlannerOptions& options,
                                     int coarse) {
  const std::vector<AtomicComponent> components = atomic_components(graph);
  BlockOptions block_options = rannc_block_options(graph, cost, options);
  const std::vector<std::vector<int>> refined = rannc_blocks(graph, components, block_options, cost, options);
  block_options.blocks = coarse;
  return rannc_blocks(graph, components, block_options, cost, options) == refined;
}

// Block refinement (issue 25 item 1): the layouts were compared at options.blocks blocks, which
// cuts a deep model only every few layers (the 1T GPT's 128 layers into 32 blocks: stages of 4, 8,
// ... layers), and the coarse DP objective can prune a layout that finer stages would make the
// fastest. A model with more layers than blocks gets its most promising layouts' (t, ZeRO) planned
// again at one block per layer (at most 2 × blocks: 4 × doubles the planning time of GPT-3 175B),
// bounded by the best objective found;
// a faster plan replaces the best. The most promising: the best plan's (t, ZeRO), then for each
// other tensor-parallel degree, and the best (t, ZeRO) with the other sequence-parallel choice,
// its best coarse layout when that reached 3/4 of the best samples/s
// (the degree sets a layer's size and so how many layers fit a stage, which coarse blocks round:
// the 1T GPT's t = 8, ZeRO-1 plan was behind t = 4's at 32 blocks and 30% ahead at 64).
void refine_blocks(const TensorParallelGraphs& graphs, const CostModelFactory& costs, const PlannerOptions& options,
                   ThreeDimensionalPlan& result, std::optional<Plan>& best, double& best_objective,
                   const Graph*& best_graph) {
  if (options.planner != "rannc" || !options.refine_blocks) return;
  const Graph& model = graphs(1, false);
  const int refined = std::min(static_cast<int>(layer_groups(model).size()), 2 * options.blocks);
  if (refined <= options.blocks) return;
  std::vector<std::pair<int, int>> layouts{{best->tensor_parallel, best->zero}};  // (t, ZeRO), best first
  const bool layouts_sequence_parallel = best->sequence_parallel;
  const double coarse_best = best->predicted_samples_per_second();
  std::vector<LayoutCandidate> coarse = result.candidates;
  std::stable_sort(coarse.begin(), coarse.end(), [](const LayoutCandidate& a, const LayoutCandidate& b) {
    return a.samples_per_second > b.samples_per_second;
  });
  for (const LayoutCandidate& candidate : coarse) {
    const bool degree_seen = std::any_of(layouts.begin(), layouts.end(), [&](const std::pair<int, int>& layout) {
      return layout.first == candidate.tensor_parallel;
    });
    if (candidate.feasible && candidate.samples_per_second >= 0.75 * coarse_best && !degree_seen)
      layouts.emplace_back(candidate.tensor_parallel, candidate.zero);
  }
  for (const auto& [t, zero] : layouts) {
    const std::unique_ptr<CostModel> model_cost = t == 1 ? costs(graphs(1, false)) : nullptr;
    // The best plan's own layout first: its refined objective bounds the others.
    std::vector<bool> sequence_parallel_order = sequence_parallel_choices(options, t);
    if (layouts_sequence_parallel) std::reverse(sequence_parallel_order.begin(), sequence_parallel_order.end());
    for (bool sequence_parallel : sequence_parallel_order) {
      // The best plan's other sequence-parallel choice is refined on the same evidence as another
      // degree: when its coarse layout was feasible and within 3/4 of the best.
      const bool best_layout_choice = t == layouts.front().first && zero == layouts.front().second;
      if (best_layout_choice && sequence_parallel != layouts_sequence_parallel) {
        const int degree = t, zero_stage = zero;  // (clang before 16 cannot capture structured bindings)
        const bool promising = std::any_of(coarse.begin(), coarse.end(), [&](const LayoutCandidate& candidate) {
          return candidate.tensor_parallel == degree && candidate.zero == zero_stage &&
                 candidate.sequence_parallel == sequence_parallel && candidate.feasible &&
                 candidate.samples_per_second >= 0.75 * coarse_best;
        });
        if (!promising) continue;
      }
      const Graph& planned = graphs(t, sequence_parallel);
      const std::unique_ptr<CostModel> cost = t == 1 ? nullptr : costs(planned);
      PlannerOptions refining = options;
      refining.tensor_parallel = t;
      refining.zero = zero;
      refining.sequence_parallel = sequence_parallel;
      refining.blocks = refined;
      refining.diagnose_infeasible = false;
      // The DP's objective ((M + S − 1) · largest stage + largest exposed all-reduce) is not the
      // simulated step: the best plan's own layout is pruned only when even 3/4 of its DP
      // objective cannot beat the best; the others must beat it.
      const bool best_layout = t == layouts.front().first && zero == layouts.front().second &&
                               sequence_parallel == layouts_sequence_parallel;
      refining.step_seconds_bound = best_objective * (best_layout ? 4.0 / 3.0 : 1.0);
      refining.progress = nullptr;
      const CostModel& layout_cost = t == 1 ? *model_cost : *cost;
      if (refinement_cuts_the_same_blocks(planned, layout_cost, refining, options.blocks)) continue;
      LayoutCandidate candidate = plan_layout(planned, layout_cost, refining, /*searching=*/true, best, best_objective);
      candidate.blocks = refined;
      if (candidate.feasible && best->tensor_parallel == t && best->zero == zero &&
          best->sequence_parallel == sequence_parallel)
        best_graph = &planned;  // (the refined plan, or the coarse one of the same layout)
      result.candidates.push_back(std::move(candidate));
    }
  }
}

}  // namespace

std::vector<bool> sequence_parallel_choices(const PlannerOptions& options, int t) {
  if (t == 1) return {false};
  if (options.choose_sequence_parallel) return {false, true};
  return {options.sequence_parallel};
}

TensorParallelGraphs tensor_parallel_graphs_of(const Graph& model) {
  auto built = std::make_shared<std::map<std::pair<int, bool>, Graph>>();
  return [&model, built](int tensor_parallel, bool sequence_parallel) -> const Graph& {
    if (tensor_parallel == 1) return model;
    const std::pair<int, bool> key{tensor_parallel, sequence_parallel};
    auto found = built->find(key);
    if (found == built->end())
      found = built->emplace(key, tensor_parallel_graph(model, tensor_parallel, sequence_parallel)).first;
    return found->second;
  };
}

std::vector<int> tensor_parallel_candidates(const Graph& model, const DeviceSpec& device, const PlannerOptions& options) {
  return tensor_parallel_candidates(tensor_parallel_graphs_of(model), device, options);
}

ThreeDimensionalPlan make_3d_plan(const Graph& model, const CostModelFactory& costs, const PlannerOptions& options) {
  return make_3d_plan(tensor_parallel_graphs_of(model), costs, options);
}

std::vector<int> tensor_parallel_candidates(const TensorParallelGraphs& graphs, const DeviceSpec& device,
                                           const PlannerOptions& options) {
  if (options.tensor_parallel > 0) return {options.tensor_parallel};
  std::vector<int> degrees{1};
  for (int t : {2, 4, 8}) {
    if (t > device.devices_per_node || options.world_size % t != 0) continue;
    try {
      (void)graphs(t, options.sequence_parallel && !options.choose_sequence_parallel);
    } catch (const Error&) {
      continue;  // t does not divide a split size, or the model has no tensor-parallel layers
    }
    degrees.push_back(t);
  }
  return degrees;
}

ThreeDimensionalPlan make_3d_plan(const TensorParallelGraphs& graphs, const CostModelFactory& costs,
                                  const PlannerOptions& asked) {
  // The segments of a stage's recomputation, shared by every layout planned on the same graph.
  SegmentedRecomputationCache recomputation_cache;
  PlannerOptions options = asked;
  if (!options.recomputation_cache) options.recomputation_cache = &recomputation_cache;
  const Graph& model = graphs(1, false);
  PARTRAIN_CHECK(options.tensor_parallel >= 0, "tensor_parallel must be 0 (the planner chooses) or positive, not "
                                                   << options.tensor_parallel);
  PARTRAIN_CHECK(options.zero >= -1 && options.zero <= 1,
                 "zero must be 0, 1 or -1 (the planner chooses), not " << options.zero);
  const bool searching = options.tensor_parallel == 0 || options.zero < 0 || options.choose_sequence_parallel;
  // The model's own cost model (t = 1) gives the devices when the degree is searched; a fixed
  // degree needs only its own graph's (a training run profiles only that graph).
  std::unique_ptr<CostModel> model_cost;
  if (options.tensor_parallel == 0 || options.tensor_parallel == 1) model_cost = costs(model);
  // Larger degrees first: for a large model they are the likely winners, and their stage-DP
  // objective then bounds (prunes) the search of the smaller ones (PlannerOptions::step_seconds_bound).
  std::vector<int> degrees = options.tensor_parallel > 0
                                 ? std::vector<int>{options.tensor_parallel}
                                 : tensor_parallel_candidates(graphs, model_cost->device(), options);
  std::sort(degrees.rbegin(), degrees.rend());
  double memory_bytes = model_cost ? model_cost->device().memory_bytes : 0.0;
  // ZeRO-1 and sequence parallelism first: they save memory, so their plan is usually the fastest,
  // and its objective then prunes the search of the others (ties still go to zero 0, no sp).
  const std::vector<int> zeros = options.zero >= 0 ? std::vector<int>{options.zero} : std::vector<int>{1, 0};
  std::size_t total = 0;
  for (int t : degrees) total += sequence_parallel_choices(options, t).size() * zeros.size();

  ThreeDimensionalPlan result;
  std::optional<Plan> best;
  double best_objective = std::numeric_limits<double>::infinity();  // the stage DP's, of the plans found
  const Graph* best_graph = nullptr;  // graphs(t) of the best plan, copied into the result once
  std::size_t done = 0;
  for (int t : degrees) {
    std::vector<bool> sequence_parallel_order = sequence_parallel_choices(options, t);
    std::reverse(sequence_parallel_order.begin(), sequence_parallel_order.end());
    for (bool sequence_parallel : sequence_parallel_order) {
      const auto graph_start = std::chrono::steady_clock::now();
      const Graph* planned = nullptr;
      try {
        planned = &graphs(t, sequence_parallel);
      } catch (const Error& error) {
        if (!options.choose_sequence_parallel || !sequence_parallel) throw;
        LayoutCandidate candidate;  // e.g. the sequence does not divide by t
        candidate.tensor_parallel = t;
        candidate.sequence_parallel = true;
        candidate.problem = error.message();
        result.candidates.push_back(std::move(candidate));
        done += zeros.size();
        continue;
      }
      std::unique_ptr<CostModel> cost = t == 1 ? std::move(model_cost) : costs(*planned);
      memory_bytes = cost->device().memory_bytes;
      double graph_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - graph_start).count();
      for (int zero : zeros) {
        PlannerOptions candidate_options = options;
        candidate_options.tensor_parallel = t;
        candidate_options.zero = zero;
        candidate_options.sequence_parallel = sequence_parallel;
        candidate_options.diagnose_infeasible = !searching;
        // Ties must survive the bound (ties go to the smaller t and zero 0 below).
        if (searching && std::isfinite(best_objective)) candidate_options.step_seconds_bound = best_objective * (1 + 1e-9);
        candidate_options.progress = nullptr;
        if (options.progress) {
          const double base = static_cast<double>(done) / static_cast<double>(total);
          candidate_options.progress = [&options, base, total](double fraction) {
            options.progress(base + fraction / static_cast<double>(total));
          };
        }
        LayoutCandidate candidate = plan_layout(*planned, *cost, candidate_options, searching, best, best_objective);
        if (candidate.feasible && best->tensor_parallel == t && best->zero == zero &&
            best->sequence_parallel == sequence_parallel)
          best_graph = planned;
        candidate.planning_seconds += graph_seconds;
        graph_seconds = 0;  // counted with the first zero of this layout
        result.candidates.push_back(std::move(candidate));
        ++done;
      }
    }
  }
  if (best) refine_blocks(graphs, costs, options, result, best, best_objective, best_graph);
  if (!best) {
    std::ostringstream message;
    message << options.planner << ": no (tensor_parallel, stages, replicas, zero) layout fits on " << options.world_size
            << " devices of " << memory_bytes / (1ull << 30) << " GiB (memory_margin " << options.memory_margin << "):";
    for (const LayoutCandidate& candidate : result.candidates)
      message << "\n  tensor_parallel " << candidate.tensor_parallel << ", zero " << candidate.zero
              << (candidate.sequence_parallel ? ", sequence parallel" : "") << ": " << candidate.problem;
    PARTRAIN_FAIL(message.str());
  }
  result.plan = std::move(*best);
  result.graph = *best_graph;
  if (options.progress) options.progress(1.0);
  return result;
}

}  // namespace partrain::partition
