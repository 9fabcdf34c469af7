#pragma once
// Megatron-LM's interleaved 1F1B schedule (Narayanan et al., SC'21 §2.2) in RaNNC's search (issue 25):
// with `schedule = "interleaved"` and `virtual_stages = "auto"`, Algorithm 2 (stage_dp.h) also
// considers pipelines whose S ranks each hold v ≥ 2 model chunks, chunk c on rank c mod S.
//
// Each rank of an interleaved pipeline holds v non-adjacent chunks, so the stage DP's contiguous
// stages do not describe it. The search runs beside the DP instead, over the same pipeline sizes D
// and microbatch counts M, with what the runtime and Megatron's implementation require: S ≥ 2
// ranks of equal replicas r = D / S (the chunks of a rank share its devices), M a multiple of S,
// at least one block per chunk. For each (D, M, S, v) the k blocks are cut into S·v contiguous
// chunks of balanced time (balance_chunks: the least largest chunk time; one table per per-replica
// batch serves every S·v) and the configuration is scored by the interleaved form of the DP's
// objective,
//     (M·v + S − 1) · largest chunk time + largest rank all-reduce (the sum over its chunks),
// which is the DP's (M + S − 1) · largest stage time + all-reduce at v = 1: a rank runs M·v chunk
// steps and the pipeline fills and drains over S − 1 chunk steps, the bubble (S − 1)/(v·M) of §2.2
// at v times the point-to-point messages (every chunk sends and receives its own boundary).
// Configurations are visited best-first by a lower bound on that objective (the blocks' own compute,
// as the DP's split_lower_bound), skipped when it reaches the bound (the DP's best objective, or a
// better layout's: PlannerOptions::step_seconds_bound) or when a rank's chunks cannot fit its memory
// even with their activations recomputed from the chunk boundaries; the four best by objective
// become plans priced by plan_builder's predict_plan (the schedule simulator, each rank's memory the
// sum of its chunks' under the interleaved schedule) and the fastest that fits is returned. The
// caller (plan_stages_rannc) keeps it when the simulator predicts it faster than the plain plan.
#include <cstdint>
#include <optional>
#include <vector>

#include "graph/graph.h"
#include "partition/common/cost_model.h"
#include "partition/common/planner_options.h"
#include "plan/plan.h"

namespace partrain::partition {

/// A contiguous split of blocks into model chunks.
struct ChunkSplit {
  bool feasible = false;           // false: fewer blocks than chunks
  double max_chunk_seconds = 0;    // the largest chunk time (s)
  std::vector<int> first_block;    // per chunk: index of its first block (first_block[0] = 0)
};

/// The split of blocks 0..k−1 into `chunks` contiguous chunks of at least one block each that
/// minimises the largest chunk time, a chunk's time being that of a stage of the stage DP: forward +
/// sending its outputs + backward + receiving its input gradients (+ the forward again when
/// `recompute`) at `batch` samples, transfers across nodes when `across_nodes`. Exact: a min-max DP
/// over (chunks, blocks placed) that serves every chunk count at once (chunk times need not grow with
/// the chunk: a cut after a small activation can be worth a longer chunk). Checked against a brute
/// force in test_stage_dp. feasible = false when chunks > k. Throws partrain::Error for chunks < 1,
/// a batch outside [1, 2^32), empty blocks, and when the cost model cannot measure a range.
ChunkSplit balance_chunks(const std::vector<std::vector<int>>& blocks, const CostModel& cost, int chunks,
                          std::int64_t batch, bool across_nodes, bool recompute);

/// The fastest interleaved plan (planner "rannc", v ≥ 2 chunks per rank, schedule interleaved) of
/// the search above whose interleaved objective is below `objective_bound` (seconds; infinity: no
/// bound), or std::nullopt when none fits or beats it. `options` asks for the search:
/// schedule interleaved with virtual_stages = 0; options.stages and options.microbatches, when set,
/// fix S and M. Pipeline sizes and microbatch counts are Algorithm 2's (stage_dp.h). The plan is
/// validated; its predictions are predict_plan's for options with virtual_stages = v.
std::optional<Plan> plan_interleaved_rannc(const Graph& graph, const std::vector<std::vector<int>>& blocks,
                                           const CostModel& cost, const PlannerOptions& options,
                                           double objective_bound);

/// The interleaved objective of a plan: (M·v + S − 1) · largest stage (chunk) forward + backward
/// time + the largest exposed all-reduce of a pipeline rank (the sum over its chunks of
/// allreduce_seconds − allreduce_hidden_seconds), in seconds; for v = 1 the stage DP's
/// (M + S − 1) · largest stage time + largest exposed stage all-reduce.
double interleaved_objective_seconds(const Plan& plan);

}  // namespace partrain::partition
