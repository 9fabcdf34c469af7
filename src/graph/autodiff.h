#pragma once
// Reverse-mode automatic differentiation of a convex subgraph. Each op has one backward rule (its
// backward kernel, a vector-Jacobian product); the backward program of a subgraph lists, in reverse
// topological order, which tasks run their rule and which input gradients each must produce.
// Gradients of values read by several tasks are accumulated (summed) before they are used.
#include <vector>

#include "graph/subgraph.h"

namespace partrain {

struct BackwardStep {
  int task = -1;
  /// One flag per task input: produce the gradient of that input.
  std::vector<bool> input_grad_needed;
};

struct BackwardProgram {
  std::vector<BackwardStep> steps;   // reverse topological order
  /// Subgraph outputs whose gradient flows back into the subgraph. The caller supplies each
  /// gradient (from the next stage, or the loss seed); the others are never read.
  std::vector<int> output_grads;
  /// Boundary activations (inputs of kind Activation) that receive a gradient: sent back to the
  /// stage that produced them.
  std::vector<int> input_grads;
  /// Parameters that receive a gradient.
  std::vector<int> parameter_grads;
};

/// Builds the backward program of `subgraph`. A value needs a gradient when it is a Param or a
/// boundary activation, or a task output computed from one through differentiable inputs; a step
/// runs only if some output gradient reaches it. Labels, indices, masks, buffers and constants get
/// no gradient (OpSchema::differentiable_inputs).
BackwardProgram build_backward(const Graph& graph, const Subgraph& subgraph);

}  // namespace partrain
