#pragma once
// Building blocks shared by the model builders: each appends a few operator-granularity tasks to a
// Graph and returns the id of its output value. Parameters are named "<name>.weight" /
// "<name>.bias"; tasks are named "<name>" or "<name>.<step>", so task names never collide with
// parameter names.
#include <cstdint>
#include <string>

#include "graph/graph.h"

namespace partrain::layers {

/// Linear layer y = x W^T + b on the last dimension (x [..., in] -> [..., out]). The weight is
/// [out, in] (nn.Linear, Gemm trans_b = 1), or [in, out] when `conv1d_layout` (GPT-2 Conv1D,
/// Gemm trans_b = 0). One Gemm task named `name`, carrying `parallel` (how it splits under tensor
/// parallelism, graph/tensor_parallel.h; None: replicated).
int linear(Graph& graph, const std::string& name, int x, std::int64_t in, std::int64_t out, bool conv1d_layout = false,
           TensorParallelHint parallel = {});

/// Megatron-LM's split of a transformer layer's Gemms (Shoeybi et al. 2019 §3): column-parallel for
/// QKV (`blocks` fused matrices) and MLP-up, row-parallel for the attention output and MLP-down.
inline TensorParallelHint column_parallel(int blocks = 1) { return {TensorParallelHint::Kind::ColumnParallel, blocks}; }
inline TensorParallelHint row_parallel() { return {TensorParallelHint::Kind::RowParallel, 1}; }
/// The embedding table's vocabulary rows split across the group (the lookup and the tied output
/// layer), padded to a multiple of vocab_divisible_by × t rows ([model] vocab_divisible_by).
inline TensorParallelHint vocabulary_parallel(std::int64_t vocab_divisible_by) {
  return {TensorParallelHint::Kind::VocabularyParallel, 1, vocab_divisible_by};
}

/// LayerNorm over the last dimension with weight [hidden] and bias [hidden]. One task named `name`.
int layer_norm(Graph& graph, const std::string& name, int x, std::int64_t hidden, double eps);

/// Dropout with probability p (a task named `name`), or x itself when p == 0.
int dropout(Graph& graph, const std::string& name, int x, double p);

/// Const i64 [length] holding 0, 1, ..., length - 1.
int position_ids(Graph& graph, const std::string& name, std::int64_t length);

/// Scaled dot-product attention of q, k, v [B, S, H] split into `heads` heads of H / heads:
/// reshape + permute each to [B, heads, S, d], then either the composed form (MatMul q k^T with
/// alpha 1/sqrt(d), Softmax with the additive `mask` (value id, -1 for none) and the causal rule,
/// Dropout of the probabilities, MatMul with v) or one fused Attention task (no dropout); then permute +
/// reshape back to [B, S, H]. Task names start with `name`.
int attention(Graph& graph, const std::string& name, int q, int k, int v, std::int64_t hidden, std::int64_t heads,
              int mask, bool causal, double attention_dropout, bool fused);

/// Mean softmax cross-entropy of logits [..., C] against labels [...] (ignore_index -100).
int cross_entropy(Graph& graph, const std::string& name, int logits, int labels);

}  // namespace partrain::layers
