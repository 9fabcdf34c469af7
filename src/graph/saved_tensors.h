#pragma once
// Saved tensors: the forward values a backward program reads (Korthikanti et al. 2022, "Reducing
// Activation Recomputation in Large Transformer Models", §4). Each op declares which of its inputs
// and outputs its backward kernel reads (OpSchema::saved_inputs / saved_outputs); a stage keeps
// those from its forward pass until its backward and frees the rest right after the forward.
#include <unordered_set>
#include <vector>

#include "graph/autodiff.h"
#include "graph/interpreter.h"

namespace partrain {

/// True for the values whose tensors belong to one microbatch (Activation, Input, Label): the ones
/// a stage may free. Params, Buffers and Consts are model state.
bool is_microbatch_value(const Graph& graph, int value);

/// The microbatch values (is_microbatch_value) whose data some step of `program` reads, by the op
/// schemas' declarations: ascending ids. Includes boundary inputs the backward reads (e.g. the
/// input of a stage's first LayerNorm) and data inputs (token ids of a Gather, labels).
std::vector<int> saved_for_backward(const Graph& graph, const BackwardProgram& program);

/// The same for a task set of `graph` when every non-constant task runs its backward rule (what the
/// analytic memory model assumes of a stage: the runtime runs the backward of every task a gradient
/// reaches, which in our models is every non-constant task). Ascending ids.
std::vector<int> saved_for_backward(const Graph& graph, const std::vector<int>& tasks);

/// Frees the data of every microbatch value in `values` not in `keep`: each such tensor is replaced
/// by its shape_only() stand-in (the backward still reads shapes of values it does not save).
/// Returns the bytes of the tensors replaced; the memory returns to the allocator when no other
/// handle holds it (a stage output waiting to be sent stays allocated until it has gone).
std::size_t release_unsaved(const Graph& graph, TensorMap& values, const std::unordered_set<int>& keep);

}  // namespace partrain
