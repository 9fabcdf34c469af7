#pragma once
// CUDA kernels of the gemm ops (kernels/cuda/gemm.cu; schemas: src/graph/ops/gemm.cpp; reference:
// kernels/cpu/gemm.cpp):
//   MatMul  y = alpha op(a) op(b), batched over a's leading dimensions, b shared (rank 2) or one per
//           batch entry: one cuBLASLt strided-batched product (a shared b without trans_a is one
//           [batch * M, K] x [K, N] product, as on the CPU). Backward: dA and dB products; the dB
//           of a shared b with trans_a sums the batch entries in order into an fp32 accumulator.
//   Gemm    y = x op(w) + bias: one cuBLASLt product with the fused bias epilogue. Backward: dX and
//           dW products, dbias by a deterministic two-pass column-sum kernel (fp32 accumulation).
//
// gemm() and convert_floats() below are also used by the attention kernels (attention.cu).
#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/cuda_backend.cuh"

namespace partrain::cuda {

/// One row-major, optionally strided-batched matrix product
///   c_i = alpha * op(a_i) op(b_i) + beta * c_i (+ bias, broadcast over the rows of c_i)
/// for i in [0, batch), with op(a_i) [m, k] (a_i stored [m, k], or [k, m] when trans_a), op(b_i)
/// [k, n] (b_i stored [k, n], or [n, k] when trans_b) and c_i [m, n], all contiguous (leading
/// dimension = stored row length). Entry i starts `stride_*` elements after entry i - 1 (0: the
/// same matrix for every entry, e.g. a shared weight; stride_c must separate the outputs).
struct GemmProblem {
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t batch = 1;
  float alpha = 1.f, beta = 0.f;
  /// dtype of a and b (f32 or bf16).
  DType ab_dtype = DType::F32;
  /// dtype of c and bias: f32 for f32 operands; bf16 or f32 for bf16 operands.
  DType c_dtype = DType::F32;
  const void* a = nullptr;
  std::int64_t stride_a = 0;
  const void* b = nullptr;
  std::int64_t stride_b = 0;
  void* c = nullptr;
  std::int64_t stride_c = 0;
  /// Optional [n] vector added to every row of every c_i (fused cuBLASLt epilogue); needs beta = 0.
  const void* bias = nullptr;
};

/// Queues `problem` on backend.stream(): cuBLASLt (cublasLtMatmul, CUBLAS_COMPUTE_32F with fp32
/// scale, so fp32 products stay IEEE fp32, no TF32; bf16 operands accumulate in fp32 and c is
/// rounded once), the workspace being backend.cublas_workspace(). The algorithm of each problem
/// shape, dtype and pointer alignment is chosen once by the cuBLASLt heuristic and cached; shapes
/// the heuristic rejects run through cublasGemmStridedBatchedEx (same compute type). k = 0 gives
/// c = beta c (+ bias); m, n or batch = 0 does nothing. Throws partrain::Error on unsupported dtype
/// combinations, negative sizes, bias with beta != 0, or a failing library call.
void gemm(const CudaBackend& backend, const GemmProblem& problem);

/// destination[i] = source[i] for i < count, converting between f32 and bf16 (round to nearest
/// even) or copying when the dtypes are equal; device pointers, queued on backend.stream().
void convert_floats(const CudaBackend& backend, void* destination, DType destination_dtype, const void* source,
                    DType source_dtype, std::int64_t count);

}  // namespace partrain::cuda
