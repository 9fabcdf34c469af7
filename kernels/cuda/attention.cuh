#pragma once
// CUDA kernels of the attention ops (kernels/cuda/attention.cu; schema: src/graph/ops/attention.cpp;
// reference: kernels/cpu/attention.cpp). Installed by register_cuda_attention_kernels()
// (kernels/cuda/cuda_backend.cuh); nothing else is exported.
//
//   Attention  y = softmax(scale q k^T + mask, causal) v over (batch, head) pairs, in chunks of
//              pairs whose fp32 score matrices fit a scratch budget: S = scale q k^T by one
//              strided-batched gemm() (fp32 output), a masked-softmax kernel in place (additive f32
//              or bf16 mask broadcast to [B, h, S, T], causal rule j <= i + (T - S), a fully masked
//              row gives zeros), then y = P v by a second batched gemm().
//              Backward recomputes P (like the CPU, nothing is saved): dV = P^T dO, dP = dO V^T,
//              dS = P * (dP - rowsum(dP * P)) (kernel), dQ = scale dS K, dK = scale dS^T Q; the mask
//              gets a zero gradient when one is asked for.
//   Precision: P and dS stay fp32 (no intermediate bf16 rounding, as the CPU reference): under bf16
//   the products that take them convert their bf16 operand to an fp32 copy and write fp32 results
//   that are rounded to bf16 once; q k^T and dO V^T take the bf16 tensors directly (fp32 output).
#include "kernels/cuda/cuda_backend.cuh"
