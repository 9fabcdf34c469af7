#pragma once
// What the schedule generator and checker both derive from a plan: its shape checks, the replicas of
// a neighbouring stage a replica exchanges samples with, and a stage's data-parallel group.
#include <cstdint>
#include <vector>

#include "plan/plan.h"

namespace partrain {

/// Throws partrain::Error when the plan has no stages, a non-positive replica, copy or microbatch
/// count, world_size ≠ pipeline replicas × devices, or a microbatch smaller than a stage's replica count.
void check_plan_shape(const Plan& plan);

/// A rank of a neighbouring stage and the samples [begin, end) exchanged with it.
struct Link {
  int rank;
  std::int64_t begin, end;
};

/// The replicas of `other_stage` (a stages entry: a pipeline stage, or a model chunk under the
/// interleaved schedule; in the copy of `from`, at its tensor rank: tensor rank r of one
/// stage talks to tensor rank r of the next) whose samples intersect [begin, end), with the
/// intersections, in replica order (none when other_stage is outside the plan).
std::vector<Link> links_to(const Plan& plan, const Placement& from, int other_stage, std::int64_t begin, std::int64_t end);

/// The model chunk (Plan::stages index) that local chunk `local_chunk` of `rank` is:
/// local_chunk · S + the rank's pipeline stage (Megatron's model chunk id). 1F1B and the others: the stage.
int global_chunk(const Plan& plan, int rank, int local_chunk);

struct Action;
/// The model chunk that receives the message of send or receive `action` of `rank`: the rank's own
/// chunk for a receive, the next chunk for SendActivation, the previous one for SendGradient. Sends
/// and receives match on it (with sender, receiver, direction and microbatch).
int receiver_chunk(const Plan& plan, int rank, const Action& action);

/// The pipeline stage's data-parallel group of tensor rank `tensor_rank`: its replicas in every pipeline
/// copy, ascending.
std::vector<int> stage_group(const Plan& plan, int stage, int tensor_rank = 0);

/// Writes one rank's action list chunk by chunk for the schedules with several model chunks per
/// rank (interleaved, zb_v): each pass with its receives right before and its sends right after.
class ChunkListWriter {
 public:
  ChunkListWriter(const Plan& plan, int rank);
  /// ReceiveActivation from chunk − 1's ranks, Forward, SendActivation to chunk + 1's (local chunk `chunk`).
  void forward(int chunk, int microbatch);
  /// ReceiveGradient from chunk + 1's ranks, Recompute when the chunk recomputes before its
  /// backward, Backward (or with `split` BackwardInput), SendGradient to chunk − 1's ranks.
  void backward(int chunk, int microbatch, bool split);
  /// BackwardWeight of the chunk's microbatch.
  void backward_weight(int chunk, int microbatch);
  /// The list, ended by the stage's AllReduce (when its data-parallel group has several ranks) and Step.
  std::vector<Action> finish();

 private:
  void push(Action action, int chunk);
  const Plan& plan_;
  Placement place_;
  std::int64_t begin_ = 0, end_ = 0;  // the rank's samples of every microbatch
  std::vector<std::vector<Link>> previous_, next_;
  std::vector<bool> recompute_;
  std::vector<Action> list_;
};

/// The tensor-parallel group of the replica at `placement`: its tensor_parallel consecutive ranks.
std::vector<int> tensor_group(const Plan& plan, const Placement& placement);

}  // namespace partrain
