#pragma once
// Helpers shared by the CPU kernels.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/shape.h"
#include "core/tensor.h"
#include "kernels/common/op_geometry.h"

namespace partrain::cpu {

/// Loops with at least this many elements run in an OpenMP parallel region.
inline constexpr std::int64_t kParallelThreshold = 16384;
/// A single GEMM outside a parallel region is split over the threads from this many FLOPs
/// (2·m·n·k), in bands of rows or columns of C that are multiples of kGemmBand.
inline constexpr double kParallelGemmFlops = 1 << 22;
inline constexpr std::int64_t kGemmBand = 16;

/// Elements per chunk of for_each_chunk.
inline constexpr std::int64_t kChunkElements = 4096;

/// Calls chunk(first, count) over [0, n) in chunks of kChunkElements, in parallel from
/// kParallelThreshold elements. OpenMP's outlined loop bodies are not compiled per vector width
/// (PARTRAIN_VECTOR_CLONES), so a parallel elementwise loop calls a cloned function per chunk.
template <typename Chunk>
void for_each_chunk(std::int64_t n, Chunk chunk) {
  const std::int64_t chunks = (n + kChunkElements - 1) / kChunkElements;
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
  for (std::int64_t c = 0; c < chunks; ++c)
    chunk(c * kChunkElements, std::min(kChunkElements, n - c * kChunkElements));
}

/// Offset into a broadcast input for output element `index` (row-major over `output_shape`), with `strides` from
/// kernels::broadcast_strides.
inline std::int64_t broadcast_offset(std::int64_t index, const Shape& output_shape,
                                     const std::vector<std::int64_t>& strides) {
  std::int64_t offset = 0;
  for (std::size_t d = output_shape.size(); d-- > 0;) {
    const std::int64_t coordinate = index % output_shape[d];
    index /= output_shape[d];
    offset += coordinate * strides[d];
  }
  return offset;
}

/// gradient (shape of the broadcast input) = sum of `output_grad` over the broadcast dimensions,
/// each output element weighted by `weight(i)` when given. Overwrites `gradient`.
void reduce_to_broadcast_input(const Tensor& gradient, const Tensor& output_grad, const float* weight = nullptr);

/// A GEMM dimension as a BLAS int; throws partrain::Error when it does not fit.
int blas_int(std::int64_t value);

/// Row-major C[m, n] = alpha * op(A) op(B) + beta * C through OpenBLAS's cblas_sgemm, with op(A)
/// [m, k] and op(B) [k, n]. Outside an OpenMP parallel region a product of at least
/// kParallelGemmFlops is split over the threads in static bands of C (repeatable on a thread count);
/// inside one it runs on the calling thread. A is stored densely as [m, k] (or [k, m] when trans_a),
/// B as [k, n] (or [n, k] when trans_b). Safe inside OpenMP loops over samples or heads. Zero-size dimensions
/// are handled (k = 0: C = beta * C). Throws partrain::Error when a dimension does not fit a BLAS int.
void sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
           const float* b, float beta, float* c);

/// sgemm with explicit leading dimensions (row strides, in elements) of A, B and C. Never throws,
/// so it may run inside parallel loops: the caller checks that the sizes fit a BLAS int.
void sgemm_strided(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                   const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                   std::int64_t ldc);

/// Index value of an integer tensor (i32 or i64) at `i`.
inline std::int64_t index_at(const Tensor& indices, std::int64_t i) {
  return indices.dtype() == DType::I64 ? indices.data<std::int64_t>()[i] : indices.data<std::int32_t>()[i];
}

}  // namespace partrain::cpu
