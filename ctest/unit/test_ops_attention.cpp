// Finite-difference gradient checks, reference values and shape inference of the fused attention op.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "graph/op_schema.h"
#include "kernels/cpu/cpu_backend.h"
#include "support/expectations.h"

namespace partrain {
namespace {
using testing::check_gradients;
using testing::expect_gradients;
using testing::normal_tensor;
using testing::run_forward;

void expect_near(const std::vector<float>& actual, const std::vector<float>& expected, double tolerance = 1e-5) {
  testing::expect_near(actual, expected, tolerance);
}

Attributes causal_attributes(int causal) { return {{"causal", std::int64_t{causal}}}; }

// The reference: scores by MatMul (trans_b, alpha = scale), softmax by hand in double with the
// broadcast mask and the causal rule, then MatMul with v.
std::vector<float> reference_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* mask,
                                       bool causal, double scale) {
  const std::int64_t batch = q.dim(0), heads = q.dim(1), s = q.dim(2), t = k.dim(2);
  const Tensor scores = run_forward(OpType::MatMul, {{"trans_b", std::int64_t{1}}, {"alpha", scale}}, {q, k})[0];
  float* p = scores.data<float>();
  const std::vector<float> m = mask ? mask->to_float_vector() : std::vector<float>{};
  Shape mask_shape = mask ? mask->shape() : Shape{};
  while (mask && mask_shape.size() < 4) mask_shape.insert(mask_shape.begin(), 1);
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t h = 0; h < heads; ++h)
      for (std::int64_t i = 0; i < s; ++i) {
        float* row = p + ((b * heads + h) * s + i) * t;
        std::vector<double> x(t);
        double max = -INFINITY;
        for (std::int64_t j = 0; j < t; ++j) {
          x[j] = row[j];
          if (mask) {
            const std::int64_t mb = mask_shape[0] == 1 ? 0 : b, mh = mask_shape[1] == 1 ? 0 : h;
            const std::int64_t mi = mask_shape[2] == 1 ? 0 : i, mj = mask_shape[3] == 1 ? 0 : j;
            x[j] += m[((mb * mask_shape[1] + mh) * mask_shape[2] + mi) * mask_shape[3] + mj];
          }
          if (causal && j > i + (t - s)) x[j] = -INFINITY;
          max = std::max(max, x[j]);
        }
        double sum = 0;
        for (std::int64_t j = 0; j < t; ++j) sum += (x[j] = std::exp(x[j] - max));
        for (std::int64_t j = 0; j < t; ++j) row[j] = static_cast<float>(x[j] / sum);
      }
  return run_forward(OpType::MatMul, {}, {scores, v})[0].to_float_vector();
}

struct Qkv {
  Tensor q, k, v;
};

Qkv make_qkv(std::int64_t batch, std::int64_t heads, std::int64_t s, std::int64_t t, std::int64_t d, std::int64_t dv,
             std::uint64_t seed) {
  return {normal_tensor({batch, heads, s, d}, seed), normal_tensor({batch, heads, t, d}, seed + 1),
          normal_tensor({batch, heads, t, dv}, seed + 2)};
}

// A BERT-style padding mask [B, 1, 1, T]: 0 for kept keys, -10000 for the last b keys of sample b.
Tensor padding_mask(std::int64_t batch, std::int64_t t) {
  Tensor mask = Tensor::zeros({batch, 1, 1, t});
  float* m = mask.data<float>();
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t j = t - b; j < t; ++j) m[b * t + j] = -10000.f;
  return mask;
}

TEST(AttentionOps, GradientsWithoutMask) {
  for (int causal = 0; causal < 2; ++causal) {
    SCOPED_TRACE("causal=" + std::to_string(causal));
    const Qkv same = make_qkv(2, 2, 4, 4, 3, 3, 10 + causal);  // S == T
    expect_gradients(OpType::Attention, causal_attributes(causal), {same.q, same.k, same.v});
    const Qkv cross = make_qkv(2, 2, 3, 5, 4, 2, 20 + causal);  // S != T, dv != d
    expect_gradients(OpType::Attention, causal_attributes(causal), {cross.q, cross.k, cross.v});
  }
  const Qkv scaled = make_qkv(1, 2, 3, 4, 4, 3, 30);
  expect_gradients(OpType::Attention, {{"scale", 0.3}}, {scaled.q, scaled.k, scaled.v});
}

TEST(AttentionOps, GradientsWithMask) {
  for (int causal = 0; causal < 2; ++causal) {
    SCOPED_TRACE("causal=" + std::to_string(causal));
    const Qkv x = make_qkv(2, 2, 3, 5, 4, 3, 40 + causal);
    expect_gradients(OpType::Attention, causal_attributes(causal), {x.q, x.k, x.v, padding_mask(2, 5)});
    // A full [B, h, S, T] mask of arbitrary values.
    expect_gradients(OpType::Attention, causal_attributes(causal), {x.q, x.k, x.v, normal_tensor({2, 2, 3, 5}, 50)});
    // A [S, T] mask broadcast over batch and heads.
    expect_gradients(OpType::Attention, causal_attributes(causal), {x.q, x.k, x.v, normal_tensor({3, 5}, 51)});
  }
}

TEST(AttentionOps, ForwardMatchesMatMulAndSoftmaxComposition) {
  for (int causal = 0; causal < 2; ++causal)
    for (int masked = 0; masked < 2; ++masked)
      for (std::int64_t s : {4, 2}) {
        SCOPED_TRACE("causal=" + std::to_string(causal) + " masked=" + std::to_string(masked) + " S=" + std::to_string(s));
        const Qkv x = make_qkv(3, 2, s, 4, 5, 3, 60 + 4 * causal + 2 * masked + s);
        const Tensor mask = padding_mask(3, 4);
        std::vector<Tensor> inputs{x.q, x.k, x.v};
        if (masked) inputs.push_back(mask);
        const Tensor y = run_forward(OpType::Attention, causal_attributes(causal), inputs)[0];
        EXPECT_EQ(y.shape(), (Shape{3, 2, s, 3}));
        expect_near(y.to_float_vector(),
                    reference_attention(x.q, x.k, x.v, masked ? &mask : nullptr, causal, 1 / std::sqrt(5.0)));
      }
  // Explicit scale and a [B, h, S, T] mask.
  const Qkv x = make_qkv(2, 3, 3, 6, 4, 4, 90);
  const Tensor mask = normal_tensor({2, 3, 3, 6}, 91);
  expect_near(run_forward(OpType::Attention, {{"scale", 0.7}}, {x.q, x.k, x.v, mask})[0].to_float_vector(),
              reference_attention(x.q, x.k, x.v, &mask, false, 0.7));
}

TEST(AttentionOps, CausalFirstRowSeesOnlyFirstKey) {
  const Qkv x = make_qkv(2, 2, 5, 5, 4, 3, 100);
  const Attributes attributes = causal_attributes(1);
  const auto y = run_forward(OpType::Attention, attributes, {x.q, x.k, x.v})[0].to_float_vector();
  const auto v = x.v.to_float_vector();
  for (int pair = 0; pair < 4; ++pair)
    for (int c = 0; c < 3; ++c) EXPECT_NEAR(y[pair * 5 * 3 + c], v[pair * 5 * 3 + c], 1e-6);
  // Changing keys and values after position 2 leaves rows 0..2 unchanged.
  Tensor k = x.k.clone(), v2 = x.v.clone();
  for (int pair = 0; pair < 4; ++pair)
    for (int j = 3; j < 5; ++j) {
      for (int c = 0; c < 4; ++c) k.data<float>()[(pair * 5 + j) * 4 + c] += 3.f;
      for (int c = 0; c < 3; ++c) v2.data<float>()[(pair * 5 + j) * 3 + c] -= 5.f;
    }
  const auto changed = run_forward(OpType::Attention, attributes, {x.q, k, v2})[0].to_float_vector();
  for (int pair = 0; pair < 4; ++pair)
    for (int i = 0; i < 5; ++i)
      for (int c = 0; c < 3; ++c) {
        const float before = y[(pair * 5 + i) * 3 + c], after = changed[(pair * 5 + i) * 3 + c];
        if (i <= 2) EXPECT_EQ(before, after) << "row " << i;
        else EXPECT_NE(before, after) << "row " << i;
      }
}

TEST(AttentionOps, CausalWithMoreKeysThanQueries) {
  // S = 2, T = 4: query 0 sees keys 0..2, query 1 sees all four.
  const Qkv x = make_qkv(1, 1, 2, 4, 3, 2, 110);
  const auto y = run_forward(OpType::Attention, causal_attributes(1), {x.q, x.k, x.v})[0].to_float_vector();
  Tensor mask = Tensor::zeros({2, 4});
  mask.data<float>()[3] = -std::numeric_limits<float>::infinity();
  expect_near(y, run_forward(OpType::Attention, {}, {x.q, x.k, x.v, mask})[0].to_float_vector());
}

TEST(AttentionOps, FullyMaskedRowIsZero) {
  const Qkv x = make_qkv(2, 1, 2, 3, 2, 2, 120);
  Tensor mask = Tensor::zeros({2, 1, 1, 3});
  for (int j = 0; j < 3; ++j) mask.data<float>()[3 + j] = -std::numeric_limits<float>::infinity();  // sample 1
  const auto y = run_forward(OpType::Attention, {}, {x.q, x.k, x.v, mask})[0].to_float_vector();
  for (int i = 4; i < 8; ++i) EXPECT_EQ(y[i], 0.f);
  for (float value : y) EXPECT_TRUE(std::isfinite(value));
  // Its gradients are zero too (and finite).
  const std::vector<Tensor> inputs{x.q, x.k, x.v, mask};
  std::vector<Tensor> outputs = run_forward(OpType::Attention, {}, inputs);
  std::vector<Tensor> grads{Tensor::empty(x.q.shape()), Tensor::empty(x.k.shape()), Tensor::empty(x.v.shape()),
                            Tensor::empty(mask.shape())};
  CpuBackend& backend = cpu_backend();
  const Attributes attributes;
  backend.backward(OpType::Attention, KernelContext{attributes, backend}, inputs, outputs,
                   std::vector<Tensor>{normal_tensor(outputs[0].shape(), 121)}, grads);
  for (const Tensor& grad : grads)
    for (float value : grad.to_float_vector()) EXPECT_TRUE(std::isfinite(value));
  for (int i = 4; i < 8; ++i) EXPECT_EQ(grads[0].to_float_vector()[i], 0.f);    // dq of sample 1
  for (int i = 6; i < 12; ++i) EXPECT_EQ(grads[1].to_float_vector()[i], 0.f);   // dk of sample 1
  for (float value : grads[3].to_float_vector()) EXPECT_EQ(value, 0.f);          // the mask is a constant
}

// Enough (batch, head) pairs and work for the OpenMP loop.
TEST(AttentionOps, ParallelPathMatchesReferenceAndGradients) {
  const Qkv x = make_qkv(2, 4, 32, 32, 8, 8, 130);  // 2 x 8 pairs x 32 x 32 x 16 FLOPs
  const Tensor mask = padding_mask(2, 32);
  expect_near(run_forward(OpType::Attention, causal_attributes(1), {x.q, x.k, x.v, mask})[0].to_float_vector(),
              reference_attention(x.q, x.k, x.v, &mask, true, 1 / std::sqrt(8.0)));
  testing::GradientCheckOptions options;
  options.max_elements_per_input = 32;  // the small cases above check every element
  expect_gradients(OpType::Attention, causal_attributes(1), {x.q, x.k, x.v, mask}, options);
}

TEST(AttentionOps, ShapeInference) {
  using Types = std::vector<TensorType>;
  const TensorType q{{kBatch, 12, 128, 64}}, k{{kBatch, 12, 128, 64}}, v{{kBatch, 12, 128, 64}};
  EXPECT_EQ(infer_output_types(OpType::Attention, {}, Types{q, k, v})[0], q);
  EXPECT_EQ(infer_output_types(OpType::Attention, {}, Types{q, k, v, {{kBatch, 1, 1, 128}}})[0], q);
  EXPECT_EQ(infer_output_types(OpType::Attention, causal_attributes(1), Types{q, k, v, {{128, 128}}})[0], q);
  EXPECT_EQ(infer_output_types(OpType::Attention, {}, Types{{{2, 4, 3, 8}}, {{2, 4, 5, 8}}, {{2, 4, 5, 6}}})[0].shape,
            (Shape{2, 4, 3, 6}));
  // Mismatches: head size, key/value length, heads, batch, rank, mask, causal with S > T, dtype.
  EXPECT_THROW(infer_output_types(OpType::Attention, {}, Types{q, {{kBatch, 12, 128, 32}}, v}), Error);
  EXPECT_THROW(infer_output_types(OpType::Attention, {}, Types{q, k, {{kBatch, 12, 64, 64}}}), Error);
  EXPECT_THROW(infer_output_types(OpType::Attention, {}, Types{q, {{kBatch, 8, 128, 64}}, v}), Error);
  EXPECT_THROW(infer_output_types(OpType::Attention, {}, Types{q, {{4, 12, 128, 64}}, v}), Error);
  EXPECT_THROW(infer_output_types(OpType::Attention, {}, Types{{{12, 128, 64}}, k, v}), Error);
  EXPECT_THROW(infer_output_types(OpType::Attention, {}, Types{q, k, v, {{kBatch, 1, 1, 64}}}), Error);
  EXPECT_THROW(infer_output_types(OpType::Attention, {}, Types{q, k, v, {{1, kBatch, 1, 1, 128}}}), Error);
  EXPECT_THROW(infer_output_types(OpType::Attention, {}, Types{q, k, v, {{kBatch, 1, 1, 128}, DType::I64}}), Error);
  EXPECT_THROW(infer_output_types(OpType::Attention, causal_attributes(1),
                                  Types{{{2, 4, 5, 8}}, {{2, 4, 3, 8}}, {{2, 4, 3, 8}}}), Error);
  EXPECT_THROW(infer_output_types(OpType::Attention, {}, Types{q, {k.shape, DType::BF16}, v}), Error);
  EXPECT_THROW(infer_output_types(OpType::Attention, {}, Types{q, k}), Error);
  // Schema: the mask takes no gradient; FLOPs count both products (2 per multiply-add).
  const OpSchema& schema = op_schema(OpType::Attention);
  EXPECT_TRUE(schema.input_is_differentiable(0) && schema.input_is_differentiable(1) && schema.input_is_differentiable(2));
  EXPECT_FALSE(schema.input_is_differentiable(3));
  const Types inputs{{{2, 4, 8, 16}}, {{2, 4, 8, 16}}, {{2, 4, 8, 16}}};
  const Types outputs = infer_output_types(OpType::Attention, {}, inputs);
  EXPECT_GE(schema.flops({}, inputs, outputs), 2.0 * 2 * (2 * 4 * 8 * 8 * 16));
}

}  // namespace
}  // namespace partrain
