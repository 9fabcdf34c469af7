#pragma once
// The deadlock and completeness check of a schedule: every rank's action list run together.
#include "plan/plan.h"
#include "plan/schedule.h"

namespace partrain {

/// Runs all ranks' lists together (sends buffered, receives blocking, AllReduce collective) and
/// throws partrain::Error naming the first problem:
///  * deadlock — the stuck ranks, where they sit in the plan and the actions they wait at;
///  * a receive whose matching send carries a different sample range, or a send never received;
///  * a rank whose list does not hold exactly one Forward and one Backward (or one BackwardInput
///    and, after it, one BackwardWeight) of every microbatch (the backward after the Forward), a Recompute without a recomputed Forward (or missing, or misplaced),
///    a receive after the compute needing it or a send before the compute producing it, transfers
///    between ranks that are not neighbouring stages of the same pipeline replica, sample ranges that
///    do not cover the rank's own samples, an AllReduce group that is not the stage's group;
///  * a list whose last action is not Step, or with more than one Step.
/// The number of lists must be plan.world_size.
void check_schedule(const Plan& plan, const Schedule& schedule);

}  // namespace partrain
