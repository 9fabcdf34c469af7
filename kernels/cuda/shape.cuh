#pragma once
// CUDA kernels of the shape ops (schemas: src/graph/ops/shape.cpp; reference: kernels/cpu/shape.cpp).
//   Gather     rows of a [V, H] f32/bf16 table by i32/i64 indices; an index outside [0, V) throws
//              partrain::Error with the CPU's message (checked on the device, then one host sync).
//              Backward: the weight gradient is zeroed and dy scatter-added with fp32 atomics (into
//              an f32 scratch buffer when the gradient is bf16, then rounded once), so the order of
//              additions for repeated indices is not deterministic (fp32 rounding only).
//   Reshape    one device-to-device copy (outputs are preallocated).
//   Permute    a general strided gather over the CPU's reduced shape (size-1 axes dropped,
//              consecutive axes merged), or a 32x32 shared-memory tile transpose when the innermost
//              output axis is not the input's innermost; backward applies the inverse permutation.
//   Slice, Concat, Split   strided row copies in the widest unit (1..16 bytes) the layout allows;
//              Slice backward zeroes the input gradient first.
// All of them except Gather move bytes and therefore work for every dtype (integers included).
#include <span>

#include "core/tensor.h"
#include "kernels/cuda/cuda_backend.cuh"

namespace partrain::cuda {

/// destination = source permuted on the backend's stream: destination.shape[k] =
/// source.shape[perm[k]] (same dtype and element count, any dtype, rank after merging consecutive
/// axes at most 8). Throws partrain::Error on mismatched tensors or a bad permutation.
void permute_device(const CudaBackend& backend, const Tensor& source, const Tensor& destination,
                    std::span<const int> perm);

}  // namespace partrain::cuda
