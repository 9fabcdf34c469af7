// CUDA vs CPU checks of the gemm ops (MatMul, Gemm): forward and backward, f32 (normalised error
// 1e-5) and bf16 (1e-2), through the op-check harness (cuda/cuda_op_check.h). Skipped without a GPU.
//
// f32 stays at 1e-5 even for the 256 x 512 x 384 products: cuBLASLt runs with CUBLAS_COMPUTE_32F
// (no TF32) and the rounding error of an fp32 dot product of length K grows like sqrt(K) * 6e-8,
// about 1.4e-6 for K = 512, well inside the tolerance.
#include <gtest/gtest.h>

#include <string>

#include "cuda/cuda_op_check.h"
#include "support/gradient_check.h"

namespace partrain {
namespace {
using testing::expect_cuda_matches_cpu;
using testing::normal_tensor;

Attributes matmul_attributes(int trans_a, int trans_b, double alpha = 1.0) {
  return {{"trans_a", std::int64_t{trans_a}}, {"trans_b", std::int64_t{trans_b}}, {"alpha", alpha}};
}

// `batch` dimensions then [rows, cols] ([cols, rows] when transposed).
Shape operand_shape(const Shape& batch, std::int64_t rows, std::int64_t cols, bool transposed) {
  Shape shape = batch;
  shape.push_back(transposed ? cols : rows);
  shape.push_back(transposed ? rows : cols);
  return shape;
}

// ---------------- MatMul ----------------
// Odd sizes (M = 7, K = 13, N = 5: leading dimensions that are not multiples of the vector width)
// with every transpose combination, a rank-2 A, a shared B (rank 2) and a B with A's batch
// dimensions [2, 3].
TEST(CudaGemm, MatMulOddSizesAllTransposes) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  std::uint64_t seed = 1;
  for (const Shape& batch : {Shape{}, Shape{2, 3}})
    for (bool shared : {true, false})
      for (int ta = 0; ta < 2; ++ta)
        for (int tb = 0; tb < 2; ++tb) {
          if (batch.empty() && !shared) continue;  // rank-2 A and B: one case
          SCOPED_TRACE(std::string(batch.empty() ? "rank-2 A" : "batch [2, 3]") +
                       (shared ? " shared B" : " batched B") + " trans_a=" + std::to_string(ta) +
                       " trans_b=" + std::to_string(tb));
          const Tensor a = normal_tensor(operand_shape(batch, 7, 13, ta), seed++);
          const Tensor b = normal_tensor(operand_shape(shared ? Shape{} : batch, 13, 5, tb), seed++);
          expect_cuda_matches_cpu(OpType::MatMul, matmul_attributes(ta, tb, ta ? -1.5 : 0.5), {a, b});
        }
}

// Attention-shaped products: scores q k^T over [B, h] and context P v.
TEST(CudaGemm, MatMulAttentionShapes) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  const Tensor q = normal_tensor({2, 4, 64, 32}, 20);
  const Tensor k = normal_tensor({2, 4, 48, 32}, 21);
  expect_cuda_matches_cpu(OpType::MatMul, matmul_attributes(0, 1, 0.125), {q, k});
  const Tensor p = normal_tensor({2, 4, 64, 48}, 22);
  const Tensor v = normal_tensor({2, 4, 48, 16}, 23);
  expect_cuda_matches_cpu(OpType::MatMul, {}, {p, v});
}

// A shared B with trans_a: dB sums the batch entries (in order, fp32 accumulator under bf16).
TEST(CudaGemm, MatMulSharedBWithTransposedABatchSum) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  for (int tb = 0; tb < 2; ++tb) {
    SCOPED_TRACE("trans_b=" + std::to_string(tb));
    const Tensor a = normal_tensor(operand_shape({5}, 9, 17, true), 30 + tb);
    const Tensor b = normal_tensor(operand_shape({}, 17, 11, tb), 40 + tb);
    expect_cuda_matches_cpu(OpType::MatMul, matmul_attributes(1, tb, 2.0), {a, b});
  }
}

// A large product (M = 256, K = 512, N = 384), stacked ([2, 128] rows x shared B) and plain.
TEST(CudaGemm, MatMulLarge) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  expect_cuda_matches_cpu(OpType::MatMul, {}, {normal_tensor({256, 512}, 50), normal_tensor({512, 384}, 51)});
  expect_cuda_matches_cpu(OpType::MatMul, matmul_attributes(0, 1),
                          {normal_tensor({2, 128, 512}, 52), normal_tensor({384, 512}, 53)});
  expect_cuda_matches_cpu(OpType::MatMul, matmul_attributes(1, 0),
                          {normal_tensor({2, 512, 128}, 54), normal_tensor({2, 512, 384}, 55)});
}

// ---------------- Gemm ----------------
// Both weight layouts, with and without bias, x of rank 1, 2 and 3, odd sizes.
TEST(CudaGemm, GemmLayoutsAndBias) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  std::uint64_t seed = 60;
  for (const Shape& rows : {Shape{}, Shape{7}, Shape{2, 3}})
    for (int tb = 0; tb < 2; ++tb)
      for (bool bias : {false, true}) {
        SCOPED_TRACE("x rank " + std::to_string(rows.size() + 1) + " trans_b=" + std::to_string(tb) +
                     (bias ? " with bias" : " without bias"));
        Shape x_shape = rows;
        x_shape.push_back(13);
        std::vector<Tensor> inputs{normal_tensor(x_shape, seed++),
                                   normal_tensor(tb ? Shape{5, 13} : Shape{13, 5}, seed++)};
        if (bias) inputs.push_back(normal_tensor({5}, seed++));
        expect_cuda_matches_cpu(OpType::Gemm, {{"trans_b", std::int64_t{tb}}}, inputs);
      }
}

// A BERT-sized linear layer (rows 256, K = 384, N = 512, nn.Linear layout) and a GPT-2 Conv1D
// layout, both with bias; the bias gradient sums 256 rows.
TEST(CudaGemm, GemmLarge) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  expect_cuda_matches_cpu(OpType::Gemm, {},
                          {normal_tensor({2, 128, 384}, 70), normal_tensor({512, 384}, 71), normal_tensor({512}, 72)});
  expect_cuda_matches_cpu(OpType::Gemm, {{"trans_b", std::int64_t{0}}},
                          {normal_tensor({256, 384}, 73), normal_tensor({384, 512}, 74), normal_tensor({512}, 75)});
}

// Many rows (the bias gradient's chunked column sums: more than one chunk of 256 rows) and a
// width that is not a multiple of the 32 columns of a block.
TEST(CudaGemm, GemmBiasGradientManyRows) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  expect_cuda_matches_cpu(OpType::Gemm, {},
                          {normal_tensor({3000, 8}, 80), normal_tensor({45, 8}, 81), normal_tensor({45}, 82)});
}

}  // namespace
}  // namespace partrain
