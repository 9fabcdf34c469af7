#pragma once
// CUDA kernels of the elementwise ops (kernels/cuda/elementwise.cu; semantics:
// src/graph/ops/elementwise.cpp; reference: kernels/cpu/elementwise.cpp). All kernels read f32 or
// bf16 storage, compute in fp32 and round once on store.
//
//   Add, Sub, Mul  numpy broadcasting. Forward: one thread per output element, operand offsets from
//                  the broadcast strides of the coalesced output shape (at most 8 dimensions after
//                  dropping size-1 dimensions and merging contiguous ones). Backward: the gradient
//                  of an operand of the output's size is elementwise (dy, dy·other); the gradient
//                  of a broadcast operand is a deterministic sum over the broadcast dimensions:
//                  column sums in fixed row chunks plus an in-order combine when only leading
//                  dimensions are broadcast (bias gradients), else one warp per gradient element.
//   Scale, Relu, Tanh, Gelu (erf or tanh approximation)   one thread per element.
//   Dropout        the mask element of (sample, element) is core/rng.h random_uniform(...) >= p, the
//                  same call as the CPU kernel, so masks are bit-identical; the backward recomputes
//                  it from the counter. Evaluation mode and p = 0 copy.
//
// The family installs itself through register_cuda_elementwise_kernels (kernels/cuda/cuda_backend.cuh).
