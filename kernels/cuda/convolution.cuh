#pragma once
// CUDA kernels of the convolution ops (schemas: src/graph/ops/convolution.cpp; reference:
// kernels/cpu/convolution.cpp). NCHW throughout.
//   Conv2d        cuDNN (legacy cudnnConvolution* API, still shipped in cuDNN 9 as deprecated):
//                 forward, backward data and backward filter, algorithms from the _v7 heuristics
//                 cached per (pass, device, dtype, geometry), workspace from CudaBackend::scratch.
//                 fp32 runs with CUDNN_FMA_MATH (no TF32, so results track the fp32 CPU reference);
//                 bf16 tensors use CUDNN_DATA_BFLOAT16 with fp32 compute, and fall back to fp32
//                 cuDNN on converted copies when cuDNN has no bf16 algorithm for a shape. The bias is
//                 added by an own kernel; its gradient is an own two-stage (deterministic) reduction.
//   MaxPool2d     own kernels with the CPU's window semantics (padding excluded, first maximum in
//                 row-major order, NaN wins); backward recomputes each window's argmax and gathers,
//                 per input element, the gradients of the windows that chose it, in the CPU's order
//                 (deterministic, no atomics).
//   GlobalAvgPool own kernels: one warp per (n, c) plane, fp32 sums.
// Everything but the per-shape algorithm search (host-side, cached) is asynchronous on the
// backend's stream.
#include "kernels/cuda/cuda_backend.cuh"
