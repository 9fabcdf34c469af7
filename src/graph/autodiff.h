#pragma once
#include <span>
#include <unordered_set>
// Reverse-mode automatic differentiation of a convex subgraph. Each op has one backward rule (its
// backward kernel, a vector-Jacobian product); the backward program of a subgraph lists, in reverse
// topological order, which tasks run their rule and which input gradients each must produce.
// Gradients of values read by several tasks are accumulated (summed) before they are used.
#include <functional>
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
  /// Gradients of task outputs the pass leaves in its gradient map after their steps have run,
  /// instead of freeing them: the input-gradient half of a split backward keeps those the
  /// weight-gradient half reads (split_backward). Empty for a whole backward.
  std::vector<int> kept_output_grads;
};

/// A backward program split in two for the zero-bubble schedules (Qi et al., "Zero Bubble Pipeline
/// Parallelism", ICLR 2024, §2): `input` (their B) computes every gradient that flows to an
/// activation, the critical path of the pipeline; `weight` (their W) computes the parameter
/// gradients and may run any time later, once, before the optimizer step. Run `input`, then
/// `weight` on the gradient map `input` left behind (its kept_output_grads) and the same forward
/// values: the parameter gradients are bit-identical to the whole program's (the same kernels on
/// the same operands, accumulated in the same order).
struct SplitBackward {
  BackwardProgram input;
  BackwardProgram weight;
};

/// Splits `program` (build_backward) into its input- and weight-gradient halves. `deferrable(i)`
/// says whether step i's parameter gradients may wait for the weight half (default: all may); a
/// parameter is deferred only when every step producing its gradient is deferrable, so that each
/// parameter's gradient is handed over by one half only (a non-deferred one is computed in the
/// input half, as in the whole program). Steps left without work are dropped from a half.
SplitBackward split_backward(const Graph& graph, const BackwardProgram& program,
                             const std::function<bool(std::size_t)>& deferrable = {});

/// For each step of program.steps, its index in `half`.steps, or -1 where `half` does not run it
/// (the two programs list steps in the same order).
std::vector<int> step_positions(const BackwardProgram& program, const BackwardProgram& half);

/// Builds the backward program of `subgraph`. A value needs a gradient when it is a Param or a
/// boundary activation, or a task output computed from one through differentiable inputs; a step
/// runs only if some output gradient reaches it. Labels, indices, masks, buffers and constants get
/// no gradient (OpSchema::differentiable_inputs). `gradient_inputs`: Input values that stand for
/// boundary activations (those of a standalone_graph cut from a stage): they get a gradient, listed
/// in input_grads, as the boundary activations of the graph they were cut from do.
BackwardProgram build_backward(const Graph& graph, const Subgraph& subgraph,
                               std::span<const int> gradient_inputs = {});

/// The floating values of `graph` that depend on a parameter through differentiable inputs: those a
/// backward of the whole graph gives a gradient to when a loss reads them.
std::unordered_set<int> values_requiring_gradient(const Graph& graph);

/// The backward program of `standalone` (standalone_graph(graph, subgraph)) that does the work of
/// build_backward(graph, subgraph): the Inputs standing for boundary activations that depend on a
/// parameter of `graph` get their gradient, as a stage sends it back. The profiler times this, so
/// that a task set's backward includes its input gradients (a layer's, the loss's of the logits).
BackwardProgram standalone_backward(const Graph& graph, const Subgraph& subgraph, const Graph& standalone);

}  // namespace partrain
