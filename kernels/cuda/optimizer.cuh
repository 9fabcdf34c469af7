#pragma once
// Optimizer and tensor-utility kernels of the CUDA backend: AdamW and SGD updates (the constants
// come from runtime/optimizer.cpp, the same as the CPU backend's loops), dtype conversion,
// accumulation, scaling and sums of squares. Called by CudaBackend's methods of the same names.
#include <cuda_runtime.h>

#include "core/backend.h"

namespace partrain::cuda {

/// parameter, gradient, exp_avg, exp_avg_sq: f32 device tensors of one shape.
void launch_adamw_update(cudaStream_t stream, const Tensor& parameter, const Tensor& gradient, const Tensor& exp_avg,
                         const Tensor& exp_avg_sq, const AdamWUpdate& update);
/// momentum_buffer may be undefined (momentum 0).
void launch_sgd_update(cudaStream_t stream, const Tensor& parameter, const Tensor& gradient,
                       const Tensor& momentum_buffer, const SgdUpdate& update);
/// destination = source (f32 <-> bf16, round to nearest even), same element count.
void launch_convert(cudaStream_t stream, const Tensor& destination, const Tensor& source);
/// accumulator += value in fp32 (each f32 or bf16).
void launch_accumulate(cudaStream_t stream, const Tensor& accumulator, const Tensor& value);
/// tensor *= factor.
void launch_scale(cudaStream_t stream, const Tensor& tensor, float factor);
/// Σᵢ weights[i] · Σ x² over tensors[i] (undefined ones skipped) in double, accumulated on the
/// device; waits for the stream once (the value goes to the host).
double sum_of_squares(cudaStream_t stream, std::span<const Tensor> tensors, std::span<const double> weights,
                      Tensor scratch_of_one_double);

}  // namespace partrain::cuda
