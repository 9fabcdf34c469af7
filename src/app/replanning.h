#pragma once
// Correction during training (issue 26 item 3): after the first steps every rank measures its
// stages' forward and backward times; when the step time is further from the plan's prediction than
// [profile] replan_threshold, rank 0 puts the measured costs into the ProfileDB (each task set of a
// stage scaled by the stage's measured / predicted ratio) and plans again. A plan predicted clearly
// faster than the measured step is switched to at the next checkpoint (app/train_command.cpp).
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "graph/graph.h"
#include "io/chrome_trace.h"
#include "plan/plan.h"
#include "profile/profile_db.h"

namespace partrain::app {

/// Per-microbatch compute seconds measured for one Plan::stages entry (a model chunk), in the
/// plan's terms: `backward_seconds` includes a recomputed forward and both zero-bubble halves, as
/// PlanStage::backward_seconds does.
struct MeasuredStageCosts {
  double forward_seconds = 0;
  double backward_seconds = 0;
};

/// The medians of this rank's compute actions over the steps [first_step, end_step) of `trace`
/// (the executor's events; steps 0-based), by global model chunk (plan.stages index). `rank` places
/// the events in `plan`. Chunks with no Forward event in the window are left out.
std::map<int, MeasuredStageCosts> measured_stage_costs(const std::vector<io::TraceEvent>& trace, const Plan& plan,
                                                       int rank, std::int64_t first_step, std::int64_t end_step);

/// Every rank's measured_stage_costs gathered on rank 0 and combined per stage (the median over its
/// replicas and tensor ranks). Collective over `world`; empty on other ranks.
std::map<int, MeasuredStageCosts> gather_stage_costs(const std::map<int, MeasuredStageCosts>& mine,
                                                     comm::Communicator& world);

/// Per-microbatch compute seconds the plan predicts the trace will show for each Plan::stages
/// entry: its PlanStage forward and backward seconds; where its ranks share their node's cores
/// (Plan::concurrent_ranks_per_node), the durations of the simulated actions instead (their work
/// stretched by the ranks computing beside them), the median per kind as measured_stage_costs takes.
std::map<int, MeasuredStageCosts> predicted_stage_costs(const Plan& plan);

/// The factors measured / predicted (predicted_stage_costs) of each stage (forward and backward);
/// 1 where the plan predicts no time or nothing was measured.
std::map<int, profile::TimeCorrection> stage_corrections(const Plan& plan,
                                                         const std::map<int, MeasuredStageCosts>& measured);

/// Scales the measurements of each task set of `database` (the plan's graph's) by the correction of
/// the stage holding most of its tasks, at the microbatch size that stage ran (one replica's samples;
/// the next profiled size where it was not profiled itself) and every smaller size: what the run
/// measured replaces what was profiled. Smaller sizes share the error (a machine slower than at
/// profiling slows them alike; per-call overheads the profile missed weigh more on them); larger
/// sizes keep their own measurements, so the planner can leave a microbatch size the profile priced
/// wrong for a larger one. Task sets no stage holds keep their times.
void correct_profile(profile::ProfileDB& database, const Plan& plan,
                     const std::map<int, profile::TimeCorrection>& corrections);

/// One line for the log: "replan: step time measured 0.412 s, predicted 0.283 s (+45.6%, threshold
/// 15%); stage costs measured/predicted: 0 forward 1.02 backward 1.05, 1 ...".
std::string describe_corrections(double measured_seconds, double predicted_seconds, double threshold,
                                 const std::map<int, profile::TimeCorrection>& corrections);

/// Whether two plans lay the model out alike (stages, replicas, degrees, schedule, microbatches,
/// recomputation), whatever their predictions.
bool same_layout(const Plan& a, const Plan& b);

/// Whether `candidate` is worth switching to from a plan measured at `measured_seconds` per step:
/// it predicts at least kReplanMinimumGain faster.
inline bool faster_plan(const Plan& candidate, double measured_seconds);

/// The share by which a new plan must be predicted faster than the measured step to be switched to:
/// below it the switch (a checkpoint and a rebuilt stage) is not worth the prediction's own error.
inline constexpr double kReplanMinimumGain = 0.05;

inline bool faster_plan(const Plan& candidate, double measured_seconds) {
  return candidate.predicted_step_seconds > 0 &&
         candidate.predicted_step_seconds < (1.0 - kReplanMinimumGain) * measured_seconds;
}

}  // namespace partrain::app
