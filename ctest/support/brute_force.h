#pragma once
// Enumeration helpers of the brute-force checks of the stage DP.
#include <functional>
#include <algorithm>
#include <vector>

#include "plan/plan.h"

namespace partrain::testing {

/// Calls `visit` with every composition of `total` into `parts` positive parts appended to `current`.
inline void compositions(int total, int parts, std::vector<int>& current, const std::function<void()>& visit) {
  if (parts == 1) {
    current.push_back(total);
    visit();
    current.pop_back();
    return;
  }
  for (int first = 1; first <= total - (parts - 1); ++first) {
    current.push_back(first);
    compositions(total - first, parts - 1, current, visit);
    current.pop_back();
  }
}

/// RaNNC's objective, which the stage DP minimises (Algorithms 1-2): (M + S − 1) × the slowest stage
/// + the largest stage all-reduce. A plan's predicted step time simulates its schedule instead, which
/// can be lower (all-reduces overlap other stages' backwards) or higher (a stage slow in forward
/// before one slow in backward: GPipe with f = (10, 1), b = (1, 10), M = 2 takes 42, not 33).
inline double closed_form_step_seconds(const Plan& plan) {
  double slowest = 0, allreduce = 0;
  for (const PlanStage& stage : plan.stages) {
    slowest = std::max(slowest, stage.forward_seconds + stage.backward_seconds);
    allreduce = std::max(allreduce, stage.allreduce_seconds);
  }
  return (plan.microbatches + static_cast<double>(plan.stages.size()) - 1) * slowest + allreduce;
}

}  // namespace partrain::testing
