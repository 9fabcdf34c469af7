#pragma once
// Where a stage's activations are checkpointed and recomputed inside its backward
// (docs/parallelism.md §Activation recomputation): the recomputed segments of per-layer
// checkpointing (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"; Megatron-LM's
// --recompute-granularity full --recompute-method uniform) and of selective recomputation
// (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", §5:
// the attention core only). A segment is a run of consecutive tasks of a stage (ascending ids, a
// topological order): its forward values are dropped after the stage's forward, except the values
// it reads from outside (its checkpoints), and recomputed from those right before the backward of
// its own tasks, one segment at a time.
#include <span>
#include <vector>

#include "graph/graph.h"

namespace partrain {

/// Per-layer checkpointing: the stage's tasks (ascending ids) cut into blocks of `layers_per_block`
/// layers (graph/layer_names.h layer_of: "h.3", "encoder.layer.3", "embeddings", "head", ...). A
/// block starts where a task of a layer not seen before in the stage follows the block's
/// `layers_per_block`-th layer; tasks of a layer seen earlier (a cloned constant task) stay in the
/// block they fall in. Returns the blocks in order; together they are `tasks`. Throws
/// partrain::Error when layers_per_block < 1.
std::vector<std::vector<int>> layer_checkpoint_blocks(const Graph& graph, std::span<const int> tasks,
                                                      int layers_per_block);

/// Selective recomputation: the attention cores of the stage — for each Softmax task, the task range
/// from the MatMul computing the scores (QKᵀ, scaled by its alpha) to the MatMul multiplying the
/// (optionally dropped-out) probabilities with V — each as the run of the stage's tasks between its
/// first and last task, in order. A core not wholly in the stage, and the fused Attention op (which
/// saves only q, k, v and recomputes its probabilities already), give none.
std::vector<std::vector<int>> attention_core_segments(const Graph& graph, std::span<const int> tasks);

/// The checkpoints of a segment: the microbatch values (graph/saved_tensors.h is_microbatch_value)
/// its tasks read that no task of the segment produces, ascending id. The recomputation starts from
/// them, so they are kept from the forward to the segment's backward.
std::vector<int> segment_checkpoints(const Graph& graph, std::span<const int> segment);

/// The tasks of `tasks` that are in none of `segments`, ascending.
std::vector<int> tasks_outside_segments(std::span<const int> tasks, const std::vector<std::vector<int>>& segments);

}  // namespace partrain
