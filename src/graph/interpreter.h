#pragma once
// Runs a subgraph's forward pass and its backward program on a backend, value by value. This is
// the innermost layer of a stage's execution; schedules, communication and optimizers sit above it.
#include <array>
#include <functional>
#include <span>
#include <unordered_map>
#include <unordered_set>

#include "core/backend.h"
#include "graph/autodiff.h"
#include "graph/subgraph.h"

namespace partrain {

/// Tensors by value id.
using TensorMap = std::unordered_map<int, Tensor>;

struct ExecutionOptions {
  bool training = true;
  /// Seed, step, microbatch and first sample; each task draws from its own stream (its name).
  RandomContext random{};
  /// The rank's tensor-parallel group, for the communication ops of a tensor-parallel graph
  /// (graph/tensor_parallel.h); nullptr when the graph has none.
  TensorParallelGroup* tensor_parallel = nullptr;
  /// Backward only: called with a parameter's value id as soon as this pass's gradient of it is
  /// complete and added into the caller's `grads` (after the last step that produces it), so that a
  /// data-parallel all-reduce of it can start while the rest of the pass runs (PyTorch DDP's hook).
  std::function<void(int parameter)> on_parameter_gradient;
  /// Forward only (run_forward): when set, a microbatch value (Activation, Input, Label) not in
  /// *keep is freed — replaced by its shape-only stand-in — as soon as the last task of the subgraph
  /// that reads it has run (or right away when none does), so a training forward holds no more
  /// than its saved tensors, what it must send and its live temporaries (graph/saved_tensors.h).
  const std::unordered_set<int>* keep = nullptr;
};

/// Runs the subgraph's tasks in order. `values` must hold every subgraph input except Const values
/// (taken from the graph); the outputs of every task are added to it. Output shapes are inferred
/// from the actual input shapes, so any batch size works. Throws partrain::Error naming the task.
void run_forward(const Graph& graph, const Subgraph& subgraph, TensorMap& values, Backend& backend,
                 const ExecutionOptions& options = {});

/// Runs a backward program. `values` holds the forward inputs and activations; `grads` must hold
/// the gradient of every program.output_grads value. On return `grads` holds the gradients of
/// program.input_grads and program.parameter_grads; parameter gradients are *added* to tensors
/// already present in `grads` (gradient accumulation over microbatches). Intermediate gradients
/// are freed as soon as they have been used.
void run_backward(const Graph& graph, const BackwardProgram& program, const TensorMap& values, TensorMap& grads,
                  Backend& backend, const ExecutionOptions& options = {});

/// A run of consecutive steps of a backward program whose forward values were dropped after the
/// forward (per-layer or selective activation recomputation, graph/activation_checkpointing.h):
/// right before step `first_step` its forward runs again from the values it reads (its checkpoints,
/// which the caller kept), keeping `keep`; after step `end_step − 1` the values it produced are
/// released (shape-only stand-ins) before the next segment is recomputed.
struct RecomputedSegment {
  Subgraph forward;                  // the segment's tasks, in order
  std::unordered_set<int> keep;      // what its recomputed forward keeps: the saved tensors its steps
                                     // read and everything the rest of the backward still needs
  std::size_t first_step = 0;        // steps [first_step, end_step) of the backward program
  std::size_t end_step = 0;
};

/// run_backward with activation recomputation: `segments` (ascending first_step, not overlapping)
/// are recomputed into `values` one at a time with `options` (training, the same random context as
/// the original forward, so dropout masks repeat) and released after their steps. Gradients are
/// bit-identical to run_backward on the values of a full forward.
void run_backward_recomputing(const Graph& graph, const BackwardProgram& program,
                              std::span<const RecomputedSegment> segments, TensorMap& values, TensorMap& grads,
                              Backend& backend, const ExecutionOptions& options);

/// Merak's sub-pipelined TMP (Lai et al., Merak §6.3): the forward passes of two sub-microbatches (the
/// two halves of a microbatch: `values[h]` and `options[h]`, whose random contexts name each half's
/// first sample) run alternately, switching whenever one starts a deferrable all-reduce of the
/// tensor-parallel group (Megatron's g) so that it travels while the other computes. Both options
/// must name the same tensor-parallel group. Results equal two run_forward calls.
void run_forward_overlapped(const Graph& graph, const Subgraph& subgraph, std::array<TensorMap*, 2> values,
                            Backend& backend, const std::array<ExecutionOptions, 2>& options);

/// The backward passes of two sub-microbatches alternately (run_backward each; the all-reduces of
/// Megatron's f overlap the other's computation). Parameter gradients of both are added to the
/// tensors each `grads` map holds (give both maps the same accumulators). With recomputed
/// `segments` (run_backward_recomputing; may be empty) each segment's forward is recomputed for
/// both sub-microbatches (run_forward_overlapped) before its steps.
void run_backward_overlapped(const Graph& graph, const BackwardProgram& program,
                             std::span<const RecomputedSegment> segments, std::array<TensorMap*, 2> values,
                             std::array<TensorMap*, 2> grads, Backend& backend,
                             const std::array<ExecutionOptions, 2>& options);

}  // namespace partrain
