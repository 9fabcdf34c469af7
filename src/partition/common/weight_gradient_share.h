#pragma once
// The share of a stage's backward that computes parameter gradients: what a zero-bubble schedule's
// BackwardWeight runs (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024 §2: W), priced by
// FLOPs as the analytic cost model prices passes.
#include <vector>

#include "graph/graph.h"

namespace partrain {

/// Σ over `tasks` reading a Param of its forward FLOPs (a GEMM's weight gradient costs what its
/// forward costs) / Σ over all non-constant `tasks` of twice their forward FLOPs (the backward's
/// cost, the model's 2×): in [0, 0.5]; 0 when the tasks have no FLOPs. About 0.45 for a transformer
/// layer (all its GEMMs but attention's two hold weights), 0.5 for a stack of linear layers. Tasks in
/// `in_input_half` (ascending: a recomputed segment's, whose weight gradients the input half computes)
/// count in the denominator only.
double weight_gradient_share(const Graph& graph, const std::vector<int>& tasks, const std::vector<int>& in_input_half = {});

}  // namespace partrain
