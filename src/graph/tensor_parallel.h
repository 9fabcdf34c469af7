#pragma once
// Tensor model parallelism as a transformation of the operator graph (Megatron-LM: Shoeybi et al.
// 2019 §3; docs/parallelism.md §Tensor parallelism). The result is the graph that each of the t
// ranks of a tensor-parallel group runs — the same structure on every rank, each holding its part of
// the sharded parameters — so autodiff, profiling, the cost model, the partitioners and the executor
// all see one graph:
//  * a ColumnParallel Gemm (QKV, MLP-up) keeps 1/t of its output features; its replicated input goes
//    through a TensorParallelCopy (f: identity forward, all-reduce of the gradient backward);
//  * the head-split attention in between runs on the rank's heads/t heads (Reshape, Permute, MatMul,
//    Softmax, Dropout, fused Attention, element-wise ops follow the split);
//  * a RowParallel Gemm (attention output, MLP-down) multiplies its 1/t of the input features, a
//    TensorParallelAllReduce (g) sums the partial products, then the replicated bias is added;
//  * a VocabularyParallel Gather becomes a VocabParallelEmbedding (rows of the rank's vocabulary
//    part) + TensorParallelAllReduce; a VocabularyParallel MatMul (the tied LM head / MLM decoder)
//    produces the rank's vocabulary part of the logits, and the cross-entropy that reads them becomes
//    a VocabParallelCrossEntropy, so the logits are never gathered;
//  * the vocabulary is padded as Megatron-LM pads it (--make-vocab-size-divisible-by): the table
//    (and BERT's MLM decoder bias) gets zero rows up to a multiple of vocab_divisible_by × t (the
//    hint's, [model] vocab_divisible_by), so that every t splits it; the padding rows are the end of
//    the last ranks' parts (Sharding::padding), the cross-entropy masks their logits out of the
//    softmax (attribute vocab_size), so the loss and every gradient are the unpadded model's and the
//    padding rows get zero gradients and stay zero. The one-device graph (degree 1) is not padded:
//    it is the model itself, whose parameters are the Hugging Face ones;
//  * every other task (LayerNorm, residual adds, the rest) is replicated: it computes the same
//    values on every rank, and so its parameters get the same gradients on every rank.
// Parameters keep their names; a sharded one records its Sharding (graph.h) and has its local shape.
//
// Sequence parallelism (Korthikanti et al. 2022 §4.2.2, Megatron-LM's --sequence-parallel;
// docs/parallelism.md §Sequence parallelism) also splits the replicated regions along the sequence
// (dimension 1 of the [B, S, H] activations): between the tensor-parallel layers each rank holds
// [B, S/t, H].
//  * f becomes a SequenceParallelAllGather (all-gather along the sequence; backward: reduce-scatter
//    of the gradient), g after a row-parallel Gemm and the vocabulary-parallel embedding a
//    SequenceParallelReduceScatter (backward: all-gather); a row-parallel bias is added to the part;
//  * LayerNorm, dropout (the mask of the whole tensor's positions), residual adds, element-wise ops
//    and the unhinted Gemms of the heads run per position on the part; the whole parameters they read
//    are marked Sharding::sequence_parallel (their gradients are partial on each rank and summed over
//    the group before the optimizer step);
//  * a replicated tensor that spans the sequence meeting a split one (the position embeddings) goes
//    through a SequenceParallelScatter (the rank's part; backward: all-gather);
//  * any other op that reads a split sequence (BERT's pooler Slice) reads it gathered whole by a
//    SequenceParallelGather (backward: the rank's part of the replicated gradient); the vocabulary-
//    parallel LM head / MLM decoder reads an all-gathered input like any column-parallel layer.
// Data inputs (token ids, labels, masks) stay whole.
#include <unordered_map>
#include <vector>

#include "graph/graph.h"

namespace partrain {

/// The graph of one rank of a tensor-parallel group of `degree` ranks, from a model graph whose
/// builder marked its tasks with TensorParallelHint; with `sequence_parallel` the replicated regions
/// are split along the sequence as well (above). degree 1 returns a copy of `graph` (with or without
/// sequence parallelism: there is nothing to split). Task names stay; inserted tasks are named
/// "<value>.tensor_parallel_copy", "<task>.all_reduce" and "<task>.add_bias", under sequence
/// parallelism "<value>.sequence_parallel_all_gather", "<task>.reduce_scatter",
/// "<value>.sequence_parallel_scatter" and "<value>.sequence_parallel_gather". Throws
/// partrain::Error naming the task and the size when degree does not divide a split dimension
/// (heads, hidden or intermediate size — the vocabulary is padded instead; the sequence length under
/// sequence parallelism),
/// when a split tensor reaches a task that needs it whole, when a parameter would be read both on
/// the rank's part of the sequence and on the whole of it, or when the graph has no tensor-parallel
/// layer at all (ResNet).
Graph tensor_parallel_graph(const Graph& graph, int degree, bool sequence_parallel = false);

/// Whether `graph` was made with sequence parallelism (it holds sequence-parallel communication).
bool is_sequence_parallel(const Graph& graph);

/// The Params of `graph` marked Sharding::sequence_parallel (whose gradients are summed over the
/// tensor-parallel group), in creation order.
std::vector<int> sequence_parallel_parameters(const Graph& graph);

/// The tensor-parallel degree a graph was made for: the parts of its sharded parameters (1 when none).
int tensor_parallel_degree(const Graph& graph);

/// The whole shape of a (possibly sharded) parameter: its local shape with the sharded axis × parts,
/// less the vocabulary padding (the unpadded tensor that checkpoints hold).
Shape whole_shape(const Value& value);

/// Rank `rank`'s part of the whole (unpadded) host tensor `whole` under `sharding` (a new host
/// tensor of the local shape, any dtype; the padding rows zero). Throws partrain::Error when the
/// axis with its padding does not divide into blocks × parts or the rank is outside [0, parts).
Tensor shard_of(const Tensor& whole, const Sharding& sharding, int rank);

/// Writes rank `rank`'s `part` into its place in the whole host tensor `whole` (the inverse of
/// shard_of: the padding rows are left out). Throws partrain::Error on a shape that does not match.
void place_shard(const Tensor& whole, const Tensor& part, const Sharding& sharding, int rank);

/// The Param and Buffer values of `part` (tensor_parallel_graph of `whole`) for tensor rank `rank`:
/// `whole_values` (host tensors by value id of `whole`) matched by name and cut to the rank's part.
/// Throws partrain::Error when one is missing.
std::unordered_map<int, Tensor> shard_values(const Graph& whole, const std::unordered_map<int, Tensor>& whole_values,
                                             const Graph& part, int rank);

}  // namespace partrain
