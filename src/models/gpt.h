#pragma once
// GPT-2 language model (Hugging Face GPT2LMHeadModel names), pre-LN blocks, causal attention.
//   inputs: input_ids [B, S] i64
//   labels: labels [B, S] i64 (next-token targets, already shifted; -100: ignored)
//   output: loss [] = mean next-token cross-entropy
#include "graph/graph.h"
#include "io/config.h"

namespace partrain {

/// Builds GPT-2's forward graph: wte + wpe (position ids a Const), blocks with ln_1, c_attn (Conv1D
/// layout [H, 3H], Gemm trans_b = 0), causal attention, c_proj, ln_2, mlp.c_fc, GELU (tanh),
/// mlp.c_proj; ln_f; logits by a MatMul with wte (tied, no parameter of its own).
Graph build_gpt(const ModelConfig& config);

}  // namespace partrain
