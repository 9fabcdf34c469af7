#pragma once
// ZB-V (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory"; the V-shape zero-bubble
// schedule of torch.distributed.pipelining's ScheduleZBVZeroBubble): each rank holds two model
// chunks, s and 2S − 1 − s, so a microbatch goes down the pipeline and back up; every backward is
// split into BackwardInput (B) and BackwardWeight (W) as in zb_h1.
#include "plan/schedule.h"

namespace partrain {

/// Every rank's list under zb_v. The order of each pipeline stage's passes comes from a greedy list
/// scheduler run on the plan's stage costs (unit costs F = B = W = 1 per chunk when the plan has
/// none): the pass placed next is, of all stages' passes whose inputs have arrived, the one that can
/// start first; ties go to F of chunk 2S − 1 − s, then F of chunk s, B of chunk s, B of chunk
/// 2S − 1 − s, and W last (Qi et al. 2024 §3's heuristic: W fills what would be bubbles; the order of
/// ties was chosen as the one closest to the lower bound 6M + S − 1 over S ≤ 8, M ≤ 2S + 8 with unit
/// costs: it reaches it for M = S and M ≥ 2S, and is within S − 2 of it in between). A stage starts a forward only while fewer than 2S
/// chunk-microbatches wait for their W (1F1B's first stage's activation memory: S whole
/// microbatches). Replicas and pipeline replicas of a stage run the same order; transfers are placed
/// as in the other schedules, the message from chunk S − 1 to chunk S going from a rank to itself.
/// Needs plan.virtual_stages = 2 (Plan::validate_interleaving). Throws partrain::Error when the
/// greedy cannot place every pass.
Schedule generate_zero_bubble_v(const Plan& plan);

}  // namespace partrain
