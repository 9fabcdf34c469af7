// CUDA vs CPU: the normalization ops (kernels/cuda/normalization.cu against
// kernels/cpu/normalization.cpp), forward and backward, in fp32 and bf16. Skipped without a GPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda/cuda_op_check.h"
#include "support/gradient_check.h"

namespace partrain {
namespace {
using testing::CudaOpCheck;
using testing::expect_cuda_matches_cpu;
using testing::normal_tensor;
using testing::uniform_tensor;

// ---------------- LayerNorm ----------------
std::vector<Tensor> layer_norm_inputs(const Shape& x_shape, std::uint64_t seed, float scale = 1.f) {
  const std::int64_t hidden = x_shape.back();
  return {normal_tensor(x_shape, seed, scale), uniform_tensor({hidden}, seed + 1, 0.5f, 1.5f),
          normal_tensor({hidden}, seed + 2)};
}

TEST(CudaNormalization, LayerNorm) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  // Odd and tiny rows, BERT/GPT-like widths, a long row of 4096, many rows (several row chunks in
  // the parameter-gradient reduction), a large offset (two-pass variance).
  for (const Shape& shape : {Shape{2, 3, 8}, Shape{5, 1}, Shape{7, 13}, Shape{4, 768}, Shape{3, 4096},
                             Shape{2, 1000, 64}, Shape{300, 1023}}) {
    SCOPED_TRACE(shape_string(shape));
    expect_cuda_matches_cpu(OpType::LayerNorm, {}, layer_norm_inputs(shape, 1, 3.f));
  }
  expect_cuda_matches_cpu(OpType::LayerNorm, {{"eps", 1e-3}}, layer_norm_inputs({6, 50}, 4));
  // Rows far from zero (|mean| = 100 × std). Both backends round the row mean to f32 before
  // subtracting it, possibly one ulp (7.6e-6) apart: a looser fp32 tolerance.
  std::vector<Tensor> offset = layer_norm_inputs({8, 96}, 7);
  float* x = offset[0].data<float>();
  for (std::int64_t i = 0; i < offset[0].numel(); ++i) x[i] += 100.f;
  CudaOpCheck offset_check;
  offset_check.f32_tolerance = 1e-4;
  expect_cuda_matches_cpu(OpType::LayerNorm, {}, offset, offset_check);
}

// ---------------- BatchNorm2d ----------------
std::vector<Tensor> batch_norm_inputs(const Shape& x_shape, std::uint64_t seed) {
  const std::int64_t channels = x_shape[1];
  return {normal_tensor(x_shape, seed, 2.f), normal_tensor({channels}, seed + 1), normal_tensor({channels}, seed + 2),
          normal_tensor({channels}, seed + 3), uniform_tensor({channels}, seed + 4, 0.5f, 2.f)};
}

// The running statistics stay f32 in the bf16 run and are compared after the forward (in place).
CudaOpCheck batch_norm_check(bool training) {
  CudaOpCheck check;
  check.training = training;
  check.f32_inputs_in_bf16 = {3, 4};
  check.compare_inputs_after_forward = true;
  return check;
}

// Shapes: small, odd planes, one spatial element (statistics over the batch only), larger
// ResNet-like, and one element per channel ([1, C, 1, 1]: the own kernels, biased variance 0).
const std::vector<Shape> kBatchNormShapes = {{3, 2, 2, 3},     {2, 5, 7, 9},   {8, 4, 1, 1},
                                             {16, 32, 14, 14}, {4, 3, 33, 17}, {1, 6, 1, 1}};

TEST(CudaNormalization, BatchNormTraining) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  std::uint64_t seed = 10;
  for (const Shape& shape : kBatchNormShapes) {
    SCOPED_TRACE(shape_string(shape));
    expect_cuda_matches_cpu(OpType::BatchNorm2d, {}, batch_norm_inputs(shape, seed), batch_norm_check(true));
    seed += 5;
  }
  expect_cuda_matches_cpu(OpType::BatchNorm2d, {{"eps", 1e-3}, {"momentum", 0.3}}, batch_norm_inputs({2, 3, 4, 4}, 60),
                          batch_norm_check(true));
  expect_cuda_matches_cpu(OpType::BatchNorm2d, {{"momentum", 1.0}}, batch_norm_inputs({3, 4, 5, 5}, 65),
                          batch_norm_check(true));
}

TEST(CudaNormalization, BatchNormEvaluation) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  std::uint64_t seed = 70;
  for (const Shape& shape : kBatchNormShapes) {
    SCOPED_TRACE(shape_string(shape));
    expect_cuda_matches_cpu(OpType::BatchNorm2d, {}, batch_norm_inputs(shape, seed), batch_norm_check(false));
    seed += 5;
  }
}

}  // namespace
}  // namespace partrain
