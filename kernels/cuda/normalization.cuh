#pragma once
// CUDA kernels of the normalization ops (kernels/cuda/normalization.cu; semantics:
// src/graph/ops/normalization.cpp; reference: kernels/cpu/normalization.cpp). Inputs f32 or bf16
// (BatchNorm2d running statistics always f32); statistics in fp32.
//
//   LayerNorm    forward: one block per row, two-pass mean and biased variance. Backward: one block
//                per row recomputes mean and rstd (no saved statistics, as the CPU) and writes dx;
//                dweight = Σ_rows dy·x̂ and dbias = Σ_rows dy are column sums over fixed row chunks
//                (per-chunk partials, then an in-order combine): deterministic.
//   BatchNorm2d  training with more than one element per channel: cuDNN
//                (cudnnBatchNormalizationForwardTraining / cudnnBatchNormalizationBackward, spatial
//                mode, exponentialAverageFactor = momentum; cuDNN updates running_var with the
//                unbiased batch variance, like PyTorch and the CPU kernel). bf16 weight and bias are
//                converted to f32 first (cuDNN takes f32 scale/bias for bf16 data). When cuDNN
//                declines a configuration (a NOT_SUPPORTED status) the own kernels below run instead.
//                Own kernels (evaluation mode, one element per channel, cuDNN fallback): one block
//                per channel for the statistics (or the running ones) and the running-stat update,
//                then one thread per element for y = x·scale[c] + shift[c]; the backward is one block
//                per channel. Running statistics are updated in place.
//
// The family installs itself through register_cuda_normalization_kernels (kernels/cuda/cuda_backend.cuh).
