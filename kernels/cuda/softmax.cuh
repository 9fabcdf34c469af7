#pragma once
// CUDA kernels of the softmax ops (kernels/cuda/softmax.cu; semantics: src/graph/ops/softmax.cpp;
// reference: kernels/cpu/softmax.cpp). Rows of the last dimension are processed by one warp (rows
// up to 1024 elements) or one block (longer rows); maxima and sums are fp32, inputs f32 or bf16.
//
//   Softmax              y = softmax(x + mask) per row; the additive mask (f32 or bf16, any dtype
//                        independent of x) is broadcast to x; causal hides key j > i + (T - S) of
//                        query i; rows with every element hidden give zeros. Backward:
//                        dx = y·(dy − Σ dy·y); the mask gets a zero gradient when one is asked for.
//   SoftmaxCrossEntropy  loss (f32 scalar) = mean over labels ≠ ignore_index of −log softmax[label];
//                        per-row losses are summed by one block in a fixed order (deterministic).
//                        A label outside [0, C) is flagged on the device and reported as
//                        partrain::Error after a host synchronisation (forward and backward).
//                        Backward: dlogits = (softmax − onehot)·dloss / count, zero rows for
//                        ignored positions.
//
// The family installs itself through register_cuda_softmax_kernels (kernels/cuda/cuda_backend.cuh).
