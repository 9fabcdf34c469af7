#pragma once
// Gradient buckets of the data-parallel all-reduce (PyTorch DDP, Li et al., VLDB 2020, §3.2.3):
// a stage's parameter gradients are grouped into buckets in the order the backward pass completes
// them (the reverse of the order the forward pass uses the parameters), so that each bucket's
// all-reduce can start while the backward pass still computes the gradients of the next buckets.
// This file decides the buckets; runtime/bucketed_all_reduce.h runs them.
#include <cstdint>
#include <span>
#include <vector>

#include "graph/autodiff.h"

namespace partrain::runtime {

/// When a backward program completes the gradient of one parameter.
struct GradientCompletion {
  int parameter = -1;  // value id
  int last_step = -1;  // index in program.steps of the last step producing its gradient; -1: none
                       // (the program never produces it: its gradient stays zero)
};

/// `parameters` (value ids) in the order a run of `program` completes their gradients, the order of
/// run_backward's ExecutionOptions::on_parameter_gradient calls: by last producing step, then by
/// first position among that step's task inputs; those without a producing step come first, in
/// their order in `parameters`. Throws partrain::Error for a duplicate parameter.
std::vector<GradientCompletion> gradient_completion_order(const Graph& graph, const BackwardProgram& program,
                                                          std::span<const int> parameters);

/// Greedy bucketing of gradients of `bytes[i]` bytes, in the given order: consecutive gradients share
/// a bucket while its total stays within `limit_bytes`; a gradient alone larger than the limit gets a
/// bucket of its own (the only way a bucket exceeds the limit). Returns each bucket's indices into
/// `bytes`, in order; every index appears once. Throws partrain::Error when `limit_bytes` is not
/// positive or a size is negative.
std::vector<std::vector<std::size_t>> assign_buckets(std::span<const std::int64_t> bytes, double limit_bytes);

}  // namespace partrain::runtime
