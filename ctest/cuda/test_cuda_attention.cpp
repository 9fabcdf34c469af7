// CUDA vs CPU checks of the fused Attention op: forward and backward (dq, dk, dv; the mask takes no
// gradient), f32 (normalised error 1e-5) and bf16 (1e-2), through the op-check harness
// (cuda/cuda_op_check.h). Skipped without a GPU.
//
// f32 stays at 1e-5: both backends keep the probabilities and dS in fp32 and the longest
// reductions here (T = 128 keys, S = 128 queries) give fp32 rounding errors around 1e-6.
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "cuda/cuda_op_check.h"
#include "support/gradient_check.h"

namespace partrain {
namespace {
using testing::CudaOpCheck;
using testing::expect_cuda_matches_cpu;
using testing::normal_tensor;

Attributes causal_attributes(int causal) { return {{"causal", std::int64_t{causal}}}; }

std::vector<Tensor> make_qkv(std::int64_t batch, std::int64_t heads, std::int64_t s, std::int64_t t, std::int64_t d,
                             std::int64_t dv, std::uint64_t seed) {
  return {normal_tensor({batch, heads, s, d}, seed), normal_tensor({batch, heads, t, d}, seed + 1),
          normal_tensor({batch, heads, t, dv}, seed + 2)};
}

std::vector<Tensor> with_mask(std::vector<Tensor> inputs, const Tensor& mask) {
  inputs.push_back(mask);
  return inputs;
}

// A BERT-style padding mask [B, 1, 1, T]: 0 for kept keys, -10000 for the last b keys of sample b.
Tensor padding_mask(std::int64_t batch, std::int64_t t) {
  Tensor mask = Tensor::zeros({batch, 1, 1, t});
  float* m = mask.data<float>();
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t j = t - b; j < t; ++j) m[b * t + j] = -10000.f;
  return mask;
}

// Without a mask: S == T and S < T, d != dv, odd sizes (S = 7, T = 13, d = 5, dv = 3), causal or not.
TEST(CudaAttention, NoMaskCausalAndNot) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  for (int causal = 0; causal < 2; ++causal) {
    SCOPED_TRACE("causal=" + std::to_string(causal));
    expect_cuda_matches_cpu(OpType::Attention, causal_attributes(causal), make_qkv(2, 2, 6, 6, 4, 4, 10 + causal));
    expect_cuda_matches_cpu(OpType::Attention, causal_attributes(causal), make_qkv(2, 3, 7, 13, 5, 3, 20 + causal));
  }
  // An explicit scale.
  expect_cuda_matches_cpu(OpType::Attention, {{"scale", 0.3}}, make_qkv(1, 2, 5, 9, 8, 6, 30));
}

// Masks of every broadcast form: [B, 1, 1, T] padding, full [B, h, S, T], [S, T], [T], [B, 1, S, T]
// and a single value [1, 1, 1, 1]; with and without causal.
TEST(CudaAttention, BroadcastMasks) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  const std::int64_t batch = 2, heads = 3, s = 5, t = 7;
  const std::vector<Tensor> masks = {padding_mask(batch, t), normal_tensor({batch, heads, s, t}, 41),
                                     normal_tensor({s, t}, 42),          normal_tensor({t}, 43),
                                     normal_tensor({batch, 1, s, t}, 44), normal_tensor({1, 1, 1, 1}, 45)};
  for (int causal = 0; causal < 2; ++causal)
    for (std::size_t i = 0; i < masks.size(); ++i) {
      SCOPED_TRACE("causal=" + std::to_string(causal) + " mask " + shape_string(masks[i].shape()));
      expect_cuda_matches_cpu(OpType::Attention, causal_attributes(causal),
                              with_mask(make_qkv(batch, heads, s, t, 4, 6, 50 + 10 * causal + i), masks[i]));
    }
}

// An f32 mask with bf16 q, k, v (the mask's dtype is independent of the main dtype).
TEST(CudaAttention, F32MaskWithBf16Inputs) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  CudaOpCheck check;
  check.f32_inputs_in_bf16 = {3};
  expect_cuda_matches_cpu(OpType::Attention, causal_attributes(1),
                          with_mask(make_qkv(2, 2, 6, 9, 8, 8, 70), normal_tensor({2, 1, 6, 9}, 73)), check);
}

// A sample whose keys are all masked with -inf: zero output rows and zero, finite gradients; and
// causal rows whose only visible keys are masked (S = 3, T = 5: query 0 sees keys 0..2).
TEST(CudaAttention, FullyMaskedRows) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  Tensor padding = Tensor::zeros({2, 1, 1, 4});
  for (int j = 0; j < 4; ++j) padding.data<float>()[4 + j] = -kInf;  // sample 1: nothing visible
  expect_cuda_matches_cpu(OpType::Attention, {}, with_mask(make_qkv(2, 2, 3, 4, 5, 3, 80), padding));
  Tensor keys = Tensor::zeros({3, 5});
  for (int j = 0; j < 3; ++j) keys.data<float>()[j] = -kInf;  // query 0: keys 0..2 masked, 3..4 causal
  keys.data<float>()[5 + 1] = -kInf;
  expect_cuda_matches_cpu(OpType::Attention, causal_attributes(1), with_mask(make_qkv(2, 2, 3, 5, 4, 4, 90), keys));
}

// BERT/GPT-like sizes: [2, 4, 128, 64] with a padding mask, causal and not; and cross attention
// with fewer queries than keys.
TEST(CudaAttention, Large) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  for (int causal = 0; causal < 2; ++causal) {
    SCOPED_TRACE("causal=" + std::to_string(causal));
    expect_cuda_matches_cpu(OpType::Attention, causal_attributes(causal),
                            with_mask(make_qkv(2, 4, 128, 128, 64, 64, 100 + causal), padding_mask(2, 128)));
  }
  expect_cuda_matches_cpu(OpType::Attention, causal_attributes(1), make_qkv(1, 3, 40, 96, 32, 48, 110));
}

}  // namespace
}  // namespace partrain
