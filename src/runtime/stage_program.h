#pragma once
// What one pipeline stage runs (docs/architecture.md §Runtime): its forward subgraph, the autodiff
// backward of that subgraph, its parameters and buffers, the data inputs it reads, and the activations
// that cross the stage boundaries. An activation produced in stage p and read in stage q > p + 1 is
// relayed by the stages between them, so stages only talk to their neighbours (the schedules'
// assumption); its gradient travels back the same way.
#include <span>
#include <vector>

#include "graph/autodiff.h"
#include "graph/saved_tensors.h"
#include "graph/subgraph.h"
#include "plan/plan.h"

namespace partrain::runtime {

struct StageProgram {
  int stage = 0;
  Subgraph subgraph;                 // the stage's tasks (constant tasks cloned in) with its boundary values
  BackwardProgram backward;          // reverse-mode program of the subgraph
  std::vector<int> parameters;       // Param values the stage reads, ascending id
  std::vector<int> buffers;          // Buffer values (BatchNorm running statistics), ascending id
  std::vector<int> data_inputs;      // Input and Label values the stage reads (fed from the dataset)
  std::vector<int> received;         // activations received from stage − 1, ascending id (sent by it in this order)
  std::vector<int> sent;             // activations sent to stage + 1, ascending id
  std::vector<int> gradients_received;  // values of `sent` whose gradient comes back from stage + 1
  std::vector<int> gradients_sent;      // values of `received` whose gradient goes to stage − 1
  int loss = -1;                     // the graph output (loss) when this is the stage computing it
  /// The saved tensors (graph/saved_tensors.h): microbatch values whose data the backward reads,
  /// ascending id. Everything else a forward pass computes is freed as soon as it is no longer needed.
  std::vector<int> saved;
  /// Stage-aware recomputation (PlanStage::recompute_until_task; Merak §6.2): the recomputed prefix
  /// of the stage's tasks, and the values the other tasks produce, which stay from the forward to
  /// the backward (those of them the backward reads: the others are freed like any). Both empty
  /// when the stage recomputes whole or not at all.
  Subgraph recomputed;
  std::vector<int> kept_values;      // ascending id
  /// Per-layer or selective recomputation (PlanStage::recompute Layers, Selective): the parts of the
  /// backward whose forward values the forward drops and the backward recomputes, in backward order.
  /// `saved` then holds the checkpoints and the saved tensors of the tasks outside the segments.
  std::vector<RecomputedSegment> segments;
  /// Zero-bubble schedules (PlanStage's schedule zb_h1): the backward split into its input- and
  /// weight-gradient halves (graph/autodiff.h split_backward; a recomputed segment's steps keep
  /// their parameter gradients in the input half, since its recomputed values go right after it),
  /// `segments` renumbered for the input half, and the saved tensors the weight half reads (what a
  /// microbatch keeps from its BackwardInput to its BackwardWeight), ascending id. Empty otherwise.
  SplitBackward split;
  std::vector<RecomputedSegment> input_segments;
  std::vector<int> weight_saved;
};

/// The programs of every stage of a plan, in stage order. Throws partrain::Error when a stage is not
/// convex, or when a graph output other than the last stage's loss would have to cross stages.
std::vector<StageProgram> build_stage_programs(const Graph& graph, const Plan& plan);

/// Whether a rank holding `programs` (its model chunks) can split its rows of a microbatch into
/// Merak's two sub-microbatches (sub-pipelined TMP, §6.3): every value it receives, sends or reads
/// from the data has a batch dimension (a value that crosses whole, such as a loss piece, cannot be
/// split). The executor then sub-pipelines when the plan asks for it, t > 1 and it has 2+ rows.
bool can_sub_pipeline(const Graph& graph, std::span<const StageProgram> programs);

}  // namespace partrain::runtime
