#pragma once
// The optimizer's elementwise loops on the CPU (CpuBackend::adamw_update, sgd_update,
// sum_of_squares): compiled per vector width (PARTRAIN_VECTOR_CLONES) and without errno for sqrt,
// so that AdamW's square root and division run 8 or 16 lanes wide; every lane computes exactly what
// the scalar loop did, in the same order, so the results are bit-identical to it.
#include <cstdint>

#include "core/backend.h"

namespace partrain::cpu {

/// torch.optim.AdamW's update of n f32 elements in place (AdamWUpdate says what each constant is):
/// p ← p·keep; m ← m + (1 − β1)(g·grad_scale − m); v ← β2·v + (1 − β2)·g²;
/// p ← p − step_size · m / (√v / bias_correction2_sqrt + eps). Parallel over the OpenMP threads.
void adamw_update_f32(float* parameter, const float* gradient, float* exp_avg, float* exp_avg_sq, std::int64_t n,
                      const AdamWUpdate& update);

/// torch.optim.SGD's update of n f32 elements in place (SgdUpdate); `momentum_buffer` may be null
/// (no momentum). Parallel over the OpenMP threads.
void sgd_update_f32(float* parameter, const float* gradient, float* momentum_buffer, std::int64_t n,
                    const SgdUpdate& update);

/// Σ x² of n f32 values, accumulated in double: eight running sums per chunk of kChunkElements, the
/// chunks' sums added in chunk order, so the result does not depend on the thread count.
double sum_of_squares_f32(const float* values, std::int64_t n);

}  // namespace partrain::cpu
