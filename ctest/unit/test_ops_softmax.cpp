// Finite-difference gradient checks, reference values and shape inference of the softmax ops.
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
using testing::index_tensor;
using testing::normal_tensor;
using testing::run_forward;

constexpr float kInfinity = std::numeric_limits<float>::infinity();

// Plain-loop softmax of each row of x + mask (mask given at every element, -inf for masked ones).
std::vector<double> reference_softmax(const std::vector<float>& logits, int length) {
  std::vector<double> y(logits.size(), 0.0);
  for (std::size_t r = 0; r < logits.size() / length; ++r) {
    double max = -INFINITY;
    for (int j = 0; j < length; ++j) max = std::max(max, double(logits[r * length + j]));
    if (max == -INFINITY) continue;
    double sum = 0;
    for (int j = 0; j < length; ++j) sum += std::exp(logits[r * length + j] - max);
    for (int j = 0; j < length; ++j) y[r * length + j] = std::exp(logits[r * length + j] - max) / sum;
  }
  return y;
}

// ---------------- Softmax ----------------
TEST(SoftmaxOps, SoftmaxGradients) {
  expect_gradients(OpType::Softmax, {}, {normal_tensor({2, 3, 7}, 1, 2.f)});
  // Broadcast additive mask [B, 1, 1, T] with some -inf entries (never a whole row).
  Tensor mask = normal_tensor({2, 1, 1, 5}, 2);
  mask.data<float>()[1] = -kInfinity;
  mask.data<float>()[8] = -kInfinity;
  expect_gradients(OpType::Softmax, {}, {normal_tensor({2, 2, 3, 5}, 3), mask});
  // Causal with S != T (S = 3 queries, T = 5 keys), alone and with a mask.
  expect_gradients(OpType::Softmax, {{"causal", std::int64_t{1}}}, {normal_tensor({2, 3, 5}, 4)});
  expect_gradients(OpType::Softmax, {{"causal", std::int64_t{1}}},
                   {normal_tensor({2, 2, 3, 5}, 5), normal_tensor({2, 1, 1, 5}, 6)});
}

TEST(SoftmaxOps, SoftmaxRowsSumToOneAndMatchReference) {
  const Tensor x = normal_tensor({3, 4, 6}, 7, 3.f);
  const std::vector<float> y = run_forward(OpType::Softmax, {}, {x})[0].to_float_vector();
  const std::vector<double> expected = reference_softmax(x.to_float_vector(), 6);
  for (int r = 0; r < 12; ++r) {
    double sum = 0;
    for (int j = 0; j < 6; ++j) sum += y[r * 6 + j];
    EXPECT_NEAR(sum, 1.0, 1e-6);
  }
  for (std::size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], expected[i], 1e-6);
  // torch.softmax(torch.tensor([1., 2., 3.]), 0); large logits stay finite.
  const auto simple =
      run_forward(OpType::Softmax, {}, {Tensor::from_vector<float>({2, 3}, {1, 2, 3, 1001, 1002, 1003})})[0]
          .to_float_vector();
  const std::vector<float> torch_values = {0.09003057f, 0.24472847f, 0.66524096f};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(simple[i], torch_values[i % 3], 1e-6);
}

TEST(SoftmaxOps, SoftmaxBroadcastMaskMatchesReference) {
  const Tensor x = normal_tensor({2, 2, 3, 4}, 8);
  Tensor mask = normal_tensor({2, 1, 1, 4}, 9);
  mask.data<float>()[2] = -kInfinity;  // key 2 of batch 0 is hidden
  const std::vector<float> y = run_forward(OpType::Softmax, {}, {x, mask})[0].to_float_vector();
  std::vector<float> masked = x.to_float_vector();
  for (int b = 0; b < 2; ++b)
    for (int k = 0; k < 6; ++k)  // (head, query) pairs
      for (int j = 0; j < 4; ++j) masked[(b * 6 + k) * 4 + j] += mask.data<float>()[b * 4 + j];
  const std::vector<double> expected = reference_softmax(masked, 4);
  for (std::size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], expected[i], 1e-6);
  for (int k = 0; k < 6; ++k) EXPECT_EQ(y[k * 4 + 2], 0.f);
}

TEST(SoftmaxOps, CausalMaskingZeroesTheUpperTriangle) {
  const Attributes causal{{"causal", std::int64_t{1}}};
  // Square: row i sees keys 0..i.
  const Tensor x = normal_tensor({2, 4, 4}, 10);
  const std::vector<float> y = run_forward(OpType::Softmax, causal, {x})[0].to_float_vector();
  std::vector<float> masked = x.to_float_vector();
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j)
        if (j > i) masked[(b * 4 + i) * 4 + j] = -kInfinity;
  const std::vector<double> expected = reference_softmax(masked, 4);
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) {
        const int k = (b * 4 + i) * 4 + j;
        if (j > i) {
          EXPECT_EQ(y[k], 0.f);
        }
        EXPECT_NEAR(y[k], expected[k], 1e-6);
      }
  // S = 2 queries over T = 5 keys (cached prefix): row i sees keys 0..i + 3.
  const std::vector<float> wide =
      run_forward(OpType::Softmax, causal, {normal_tensor({2, 5}, 11)})[0].to_float_vector();
  for (int j = 0; j < 5; ++j) {
    EXPECT_EQ(wide[j] == 0.f, j > 3);
    EXPECT_GT(wide[5 + j], 0.f);
  }
  // S = 4 queries over T = 2 keys: rows 0 and 1 see nothing and give zeros, not NaN.
  const std::vector<float> tall =
      run_forward(OpType::Softmax, causal, {normal_tensor({4, 2}, 12)})[0].to_float_vector();
  const std::vector<float> expected_tall = {0, 0, 0, 0, 1, 0};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(tall[i], expected_tall[i]);
  EXPECT_NEAR(tall[6] + tall[7], 1.f, 1e-6);
}

TEST(SoftmaxOps, FullyMaskedRowsGiveZerosAndZeroGradients) {
  const Tensor x = normal_tensor({2, 3}, 13);
  const Tensor mask = Tensor::from_vector<float>({2, 3}, {-kInfinity, -kInfinity, -kInfinity, 0, 0, -kInfinity});
  const std::vector<Tensor> outputs = run_forward(OpType::Softmax, {}, {x, mask});
  const std::vector<float> y = outputs[0].to_float_vector();
  for (int j = 0; j < 3; ++j) EXPECT_EQ(y[j], 0.f);
  EXPECT_NEAR(y[3] + y[4], 1.f, 1e-6);
  EXPECT_EQ(y[5], 0.f);
  const Tensor dx = Tensor::empty({2, 3});
  const Attributes attributes;
  CpuBackend& backend = cpu_backend();
  backend.backward(OpType::Softmax, KernelContext{attributes, backend}, std::vector<Tensor>{x, mask}, outputs,
                   std::vector<Tensor>{normal_tensor({2, 3}, 14)}, std::vector<Tensor>{dx, Tensor()});
  for (float value : dx.to_float_vector()) EXPECT_FALSE(std::isnan(value));
  for (int j = 0; j < 3; ++j) EXPECT_EQ(dx.data<float>()[j], 0.f);
}

TEST(SoftmaxOps, ShapesAboveTheParallelThreshold) {
  // More than cpu::kParallelThreshold elements: the OpenMP paths.
  testing::GradientCheckOptions options;
  options.max_elements_per_input = 24;
  expect_gradients(OpType::Softmax, {{"causal", std::int64_t{1}}}, {normal_tensor({4, 64, 80}, 40), normal_tensor({4, 1, 80}, 41)},
                   options);
  const Tensor x = normal_tensor({300, 64}, 42);
  const std::vector<float> y = run_forward(OpType::Softmax, {}, {x})[0].to_float_vector();
  const std::vector<double> expected = reference_softmax(x.to_float_vector(), 64);
  for (std::size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], expected[i], 1e-6);
  expect_gradients(OpType::SoftmaxCrossEntropy, {}, {normal_tensor({64, 300}, 43), index_tensor({64}, 300, 44)}, options);
}

TEST(SoftmaxOps, SoftmaxShapeInference) {
  const OpSchema& schema = op_schema(OpType::Softmax);
  EXPECT_TRUE(schema.input_is_differentiable(0));
  EXPECT_FALSE(schema.input_is_differentiable(1));
  const TensorType scores{{kBatch, 12, 128, 128}};
  EXPECT_EQ(infer_output_types(OpType::Softmax, {}, std::vector<TensorType>{scores}), (std::vector<TensorType>{scores}));
  EXPECT_EQ(infer_output_types(OpType::Softmax, {}, std::vector<TensorType>{scores, {{kBatch, 1, 1, 128}}}),
            (std::vector<TensorType>{scores}));
  EXPECT_EQ(infer_output_types(OpType::Softmax, {}, std::vector<TensorType>{scores, {{128, 128}}}),
            (std::vector<TensorType>{scores}));
  const TensorType concrete{{2, 12, 16, 16}};
  EXPECT_EQ(infer_output_types(OpType::Softmax, {{"causal", std::int64_t{1}}},
                               std::vector<TensorType>{concrete, {{2, 1, 1, 16}}}),
            (std::vector<TensorType>{concrete}));
  EXPECT_DOUBLE_EQ(schema.flops({}, std::vector<TensorType>{concrete}, std::vector<TensorType>{concrete}),
                   5.0 * 2 * 12 * 16 * 16);
  // Mask not broadcastable, of higher rank, or not floating point; causal on a vector; bad causal.
  EXPECT_THROW(infer_output_types(OpType::Softmax, {}, std::vector<TensorType>{scores, {{kBatch, 1, 1, 64}}}), Error);
  EXPECT_THROW(infer_output_types(OpType::Softmax, {}, std::vector<TensorType>{{{4, 8}}, {{1, 4, 8}}}), Error);
  EXPECT_THROW(infer_output_types(OpType::Softmax, {}, std::vector<TensorType>{{{4, 8}}, {{4, 8}, DType::I64}}), Error);
  EXPECT_THROW(infer_output_types(OpType::Softmax, {{"causal", std::int64_t{1}}}, std::vector<TensorType>{{{8}}}), Error);
  EXPECT_THROW(infer_output_types(OpType::Softmax, {{"causal", std::int64_t{2}}}, std::vector<TensorType>{{{4, 8}}}),
               Error);
  EXPECT_THROW(infer_output_types(OpType::Softmax, {}, std::vector<TensorType>{TensorType{Shape{}}}), Error);
}

// ---------------- SoftmaxCrossEntropy ----------------
TEST(SoftmaxOps, CrossEntropyGradients) {
  Tensor labels = index_tensor({2, 3}, 5, 20, DType::I64);
  labels.data<std::int64_t>()[1] = -100;
  labels.data<std::int64_t>()[4] = -100;
  expect_gradients(OpType::SoftmaxCrossEntropy, {}, {normal_tensor({2, 3, 5}, 21, 2.f), labels});
  Tensor labels32 = index_tensor({7}, 4, 22, DType::I32);
  labels32.data<std::int32_t>()[3] = 9;  // ignore_index 9
  expect_gradients(OpType::SoftmaxCrossEntropy, {{"ignore_index", std::int64_t{9}}},
                   {normal_tensor({7, 4}, 23), labels32});
}

TEST(SoftmaxOps, CrossEntropyMatchesReference) {
  // Uniform logits: ln(C) whatever the labels.
  const auto uniform = run_forward(OpType::SoftmaxCrossEntropy, {},
                                   {Tensor::full({3, 2, 10}, 0.7), index_tensor({3, 2}, 10, 30)})[0];
  EXPECT_EQ(uniform.rank(), 0u);
  EXPECT_EQ(uniform.numel(), 1);
  EXPECT_NEAR(uniform.to_float_vector()[0], std::log(10.0), 1e-6);
  // torch.nn.functional.cross_entropy(torch.tensor([[1., 2., 3.]]), torch.tensor([0]))
  const auto simple = run_forward(OpType::SoftmaxCrossEntropy, {},
                                  {Tensor::from_vector<float>({1, 3}, {1, 2, 3}),
                                   Tensor::from_vector<std::int64_t>({1}, {0})})[0];
  EXPECT_NEAR(simple.to_float_vector()[0], 2.4076059644, 1e-6);
  // Random logits with ignored positions against a plain loop.
  const Tensor logits = normal_tensor({4, 6}, 31, 3.f);
  const Tensor labels = Tensor::from_vector<std::int32_t>({4}, {5, -100, 0, 3});
  const float loss = run_forward(OpType::SoftmaxCrossEntropy, {}, {logits, labels})[0].to_float_vector()[0];
  double total = 0;
  for (int r : {0, 2, 3}) {
    const float* z = logits.data<float>() + r * 6;
    double sum = 0;
    for (int j = 0; j < 6; ++j) sum += std::exp(double(z[j]));
    total += std::log(sum) - z[labels.data<std::int32_t>()[r]];
  }
  EXPECT_NEAR(loss, total / 3, 1e-5);
}

TEST(SoftmaxOps, CrossEntropyAllIgnoredGivesZero) {
  const Tensor logits = normal_tensor({3, 4}, 32);
  const Tensor labels = Tensor::full({3}, -100.0, DType::I64);
  const std::vector<Tensor> outputs = run_forward(OpType::SoftmaxCrossEntropy, {}, {logits, labels});
  EXPECT_EQ(outputs[0].to_float_vector()[0], 0.f);
  const Tensor dlogits = Tensor::full({3, 4}, std::nan(""));
  const Attributes attributes;
  CpuBackend& backend = cpu_backend();
  backend.backward(OpType::SoftmaxCrossEntropy, KernelContext{attributes, backend},
                   std::vector<Tensor>{logits, labels}, outputs, std::vector<Tensor>{Tensor::full({}, 1.0)},
                   std::vector<Tensor>{dlogits, Tensor()});
  for (float value : dlogits.to_float_vector()) EXPECT_EQ(value, 0.f);
}

TEST(SoftmaxOps, CrossEntropyRejectsOutOfRangeLabels) {
  const Tensor logits = normal_tensor({2, 3, 4}, 33);
  Tensor labels = index_tensor({2, 3}, 4, 34);
  labels.data<std::int64_t>()[4] = 4;  // position [1, 1]
  try {
    run_forward(OpType::SoftmaxCrossEntropy, {}, {logits, labels});
    ADD_FAILURE() << "an out-of-range label was accepted";
  } catch (const Error& error) {
    EXPECT_NE(error.message().find("label 4"), std::string::npos) << error.message();
    EXPECT_NE(error.message().find("[1, 1]"), std::string::npos) << error.message();
  }
  labels.data<std::int64_t>()[4] = -1;
  EXPECT_THROW(run_forward(OpType::SoftmaxCrossEntropy, {}, {logits, labels}), Error);
  labels.data<std::int64_t>()[4] = -100;  // ignore_index is fine
  EXPECT_NO_THROW(run_forward(OpType::SoftmaxCrossEntropy, {}, {logits, labels}));
}

TEST(SoftmaxOps, CrossEntropyShapeInference) {
  const OpSchema& schema = op_schema(OpType::SoftmaxCrossEntropy);
  EXPECT_TRUE(schema.input_is_differentiable(0));
  EXPECT_FALSE(schema.input_is_differentiable(1));
  const std::vector<TensorType> expected = {TensorType{Shape{}, DType::F32}};
  EXPECT_EQ(infer_output_types(OpType::SoftmaxCrossEntropy, {},
                               std::vector<TensorType>{{{kBatch, 128, 30522}}, {{kBatch, 128}, DType::I64}}),
            expected);
  EXPECT_EQ(infer_output_types(OpType::SoftmaxCrossEntropy, {},
                               std::vector<TensorType>{{{4, 10}}, {{4}, DType::I32}}),
            expected);
  EXPECT_THROW(infer_output_types(OpType::SoftmaxCrossEntropy, {},
                                  std::vector<TensorType>{{{kBatch, 128, 100}}, {{kBatch, 64}, DType::I64}}),
               Error);
  EXPECT_THROW(infer_output_types(OpType::SoftmaxCrossEntropy, {},
                                  std::vector<TensorType>{{{4, 10}}, {{4}, DType::F32}}),
               Error);
  EXPECT_THROW(infer_output_types(OpType::SoftmaxCrossEntropy, {},
                                  std::vector<TensorType>{{{4, 10}, DType::I64}, {{4}, DType::I64}}),
               Error);
  EXPECT_THROW(infer_output_types(OpType::SoftmaxCrossEntropy, {}, std::vector<TensorType>{{{4, 10}}}), Error);
}

}  // namespace
}  // namespace partrain
