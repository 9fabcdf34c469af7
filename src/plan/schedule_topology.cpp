#include "plan/schedule_topology.h"

#include <algorithm>
#include <tuple>

#include "core/error.h"
#include "plan/schedule.h"

namespace partrain {

void check_plan_shape(const Plan& plan) {
  PARTRAIN_CHECK(!plan.stages.empty(), "schedule: the plan has no stages");
  plan.validate_interleaving();
  for (std::size_t s = 0; s < plan.stages.size(); ++s)
    PARTRAIN_CHECK(plan.stages[s].replicas > 0,
                   "schedule: stage " << s << " has " << plan.stages[s].replicas << " replicas");
  PARTRAIN_CHECK(plan.pipeline_replicas > 0, "schedule: " << plan.pipeline_replicas << " pipeline replicas");
  PARTRAIN_CHECK(plan.microbatches > 0, "schedule: " << plan.microbatches << " microbatches");
  PARTRAIN_CHECK(plan.world_size == plan.pipeline_replicas * plan.devices_per_pipeline_replica(),
                 "schedule: world size " << plan.world_size << " is not " << plan.pipeline_replicas
                                         << " pipeline replicas x " << plan.devices_per_pipeline_replica() << " devices");
  for (std::size_t s = 0; s < plan.stages.size(); ++s)
    PARTRAIN_CHECK(plan.microbatch_size() >= plan.stages[s].replicas,
                   "schedule: a microbatch of " << plan.microbatch_size() << " samples cannot feed the "
                                                << plan.stages[s].replicas << " replicas of stage " << s);
}


std::vector<Link> links_to(const Plan& plan, const Placement& from, int other_stage, std::int64_t begin, std::int64_t end) {
  std::vector<Link> links;
  if (other_stage < 0 || other_stage >= static_cast<int>(plan.stages.size())) return links;
  for (int q = 0; q < plan.stages[other_stage].replicas; ++q) {
    auto [b, e] = plan.replica_samples(other_stage, q);
    const std::int64_t lo = std::max(b, begin), hi = std::min(e, end);
    if (lo < hi) links.push_back({plan.rank_of({from.pipeline_replica, plan.stage_of_chunk(other_stage), q, from.tensor_rank}), lo, hi});
  }
  return links;
}

std::vector<int> stage_group(const Plan& plan, int stage, int tensor_rank) {
  std::vector<int> group;
  for (int c = 0; c < plan.pipeline_replicas; ++c)
    for (int r = 0; r < plan.stages[stage].replicas; ++r) group.push_back(plan.rank_of({c, stage, r, tensor_rank}));
  return group;
}

int global_chunk(const Plan& plan, int rank, int local_chunk) {
  const int stage = plan.placement_of(rank).stage;
  if (plan.virtual_stages == 1) return stage;
  return plan.chunks_of_stage(stage).at(static_cast<std::size_t>(local_chunk));
}

int receiver_chunk(const Plan& plan, int rank, const Action& action) {
  const int own = global_chunk(plan, rank, action.chunk);
  if (action.is_receive()) return own;
  return action.kind == ActionKind::SendGradient ? own - 1 : own + 1;
}

std::vector<int> tensor_group(const Plan& plan, const Placement& placement) {
  std::vector<int> group;
  for (int t = 0; t < plan.tensor_parallel; ++t)
    group.push_back(plan.rank_of({placement.pipeline_replica, placement.stage, placement.replica, t}));
  return group;
}

ChunkListWriter::ChunkListWriter(const Plan& plan, int rank) : plan_(plan), place_(plan.placement_of(rank)) {
  std::tie(begin_, end_) = plan.replica_samples(place_.stage, place_.replica);
  const int chunks = static_cast<int>(plan.chunks_of_stage(place_.stage).size());
  for (int k = 0; k < chunks; ++k) {
    const int chunk = global_chunk(plan, rank, k);
    previous_.push_back(links_to(plan, place_, chunk - 1, begin_, end_));
    next_.push_back(links_to(plan, place_, chunk + 1, begin_, end_));
    recompute_.push_back(recomputes_before_backward(plan.stages[chunk].recompute));
  }
}

void ChunkListWriter::push(Action action, int chunk) {
  action.chunk = chunk;
  list_.push_back(std::move(action));
}

void ChunkListWriter::forward(int chunk, int microbatch) {
  for (const Link& link : previous_[chunk])
    push(Action::transfer(ActionKind::ReceiveActivation, microbatch, link.rank, link.begin, link.end), chunk);
  push(Action::forward(microbatch, begin_, end_, recompute_[chunk]), chunk);
  for (const Link& link : next_[chunk])
    push(Action::transfer(ActionKind::SendActivation, microbatch, link.rank, link.begin, link.end), chunk);
}

void ChunkListWriter::backward(int chunk, int microbatch, bool split) {
  for (const Link& link : next_[chunk])
    push(Action::transfer(ActionKind::ReceiveGradient, microbatch, link.rank, link.begin, link.end), chunk);
  if (recompute_[chunk]) push(Action::recompute(microbatch, begin_, end_), chunk);
  push(split ? Action::backward_input(microbatch, begin_, end_) : Action::backward(microbatch, begin_, end_), chunk);
  for (const Link& link : previous_[chunk])
    push(Action::transfer(ActionKind::SendGradient, microbatch, link.rank, link.begin, link.end), chunk);
}

void ChunkListWriter::backward_weight(int chunk, int microbatch) {
  push(Action::backward_weight(microbatch, begin_, end_), chunk);
}

std::vector<Action> ChunkListWriter::finish() {
  // One reduction of all the rank's chunks' gradients: every chunk of the stage has the same
  // data-parallel group (equal replica counts).
  std::vector<int> group = stage_group(plan_, place_.stage, place_.tensor_rank);
  if (group.size() > 1) list_.push_back(Action::all_reduce(std::move(group)));
  list_.push_back(Action::step());
  return std::move(list_);
}

}  // namespace partrain
