// Finite-difference gradient checks, reference values and shape inference of the normalization ops.
#include <gtest/gtest.h>

#include <cmath>

#include "graph/op_schema.h"
#include "kernels/cpu/cpu_backend.h"
#include "support/expectations.h"

namespace partrain {
namespace {
using testing::check_gradients;
using testing::expect_gradients;
using testing::normal_tensor;
using testing::run_forward;
using testing::uniform_tensor;

// ---------------- LayerNorm ----------------
TEST(NormalizationOps, LayerNormGradients) {
  expect_gradients(OpType::LayerNorm, {},
                   {normal_tensor({2, 3, 8}, 1), normal_tensor({8}, 2), normal_tensor({8}, 3)});
  expect_gradients(OpType::LayerNorm, {{"eps", 1e-3}},
                   {normal_tensor({5, 16}, 4, 3.f), uniform_tensor({16}, 5, 0.5f, 1.5f), normal_tensor({16}, 6)});
}

TEST(NormalizationOps, LayerNormNormalisesEachRow) {
  const Tensor x = normal_tensor({4, 3, 32}, 7, 5.f);
  const std::vector<float> y =
      run_forward(OpType::LayerNorm, {}, {x, Tensor::full({32}, 1.0), Tensor::zeros({32})})[0].to_float_vector();
  for (int r = 0; r < 12; ++r) {
    double mean = 0, variance = 0;
    for (int h = 0; h < 32; ++h) mean += y[r * 32 + h];
    mean /= 32;
    for (int h = 0; h < 32; ++h) variance += (y[r * 32 + h] - mean) * (y[r * 32 + h] - mean);
    variance /= 32;
    EXPECT_NEAR(mean, 0.0, 1e-5);
    EXPECT_NEAR(variance, 1.0, 1e-4);
  }
}

TEST(NormalizationOps, LayerNormMatchesReference) {
  const Tensor x = normal_tensor({3, 10}, 8, 2.f);
  const Tensor weight = normal_tensor({10}, 9);
  const Tensor bias = normal_tensor({10}, 10);
  const double eps = 1e-5;
  const std::vector<float> y = run_forward(OpType::LayerNorm, {{"eps", eps}}, {x, weight, bias})[0].to_float_vector();
  const float* px = x.data<float>();
  for (int r = 0; r < 3; ++r) {
    double mean = 0, variance = 0;
    for (int h = 0; h < 10; ++h) mean += px[r * 10 + h];
    mean /= 10;
    for (int h = 0; h < 10; ++h) variance += (px[r * 10 + h] - mean) * (px[r * 10 + h] - mean);
    variance /= 10;
    for (int h = 0; h < 10; ++h) {
      const double expected =
          (px[r * 10 + h] - mean) / std::sqrt(variance + eps) * weight.data<float>()[h] + bias.data<float>()[h];
      EXPECT_NEAR(y[r * 10 + h], expected, 1e-5);
    }
  }
  // torch.nn.functional.layer_norm(torch.tensor([1., 2., 3., 4.]), (4,))
  const auto simple = run_forward(OpType::LayerNorm, {},
                                  {Tensor::from_vector<float>({4}, {1, 2, 3, 4}), Tensor::full({4}, 1.0),
                                   Tensor::zeros({4})})[0].to_float_vector();
  const std::vector<float> torch_values = {-1.3416355f, -0.4472118f, 0.4472118f, 1.3416355f};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(simple[i], torch_values[i], 1e-6);
}

TEST(NormalizationOps, LayerNormPartialGradientsMatchFullOnes) {
  const std::vector<Tensor> inputs = {normal_tensor({6, 5}, 11), normal_tensor({5}, 12), normal_tensor({5}, 13)};
  const Attributes attributes;
  const std::vector<Tensor> outputs = run_forward(OpType::LayerNorm, attributes, inputs);
  const std::vector<Tensor> output_grads = {normal_tensor({6, 5}, 14)};
  CpuBackend& backend = cpu_backend();
  const KernelContext context{attributes, backend};
  const std::vector<Tensor> full = {Tensor::empty({6, 5}), Tensor::empty({5}), Tensor::empty({5})};
  backend.backward(OpType::LayerNorm, context, inputs, outputs, output_grads, full);
  const std::vector<Tensor> only_weight = {Tensor(), Tensor::empty({5}), Tensor()};
  backend.backward(OpType::LayerNorm, context, inputs, outputs, output_grads, only_weight);
  EXPECT_EQ(only_weight[1].to_float_vector(), full[1].to_float_vector());
  const std::vector<Tensor> only_input = {Tensor::empty({6, 5}), Tensor(), Tensor()};
  backend.backward(OpType::LayerNorm, context, inputs, outputs, output_grads, only_input);
  EXPECT_EQ(only_input[0].to_float_vector(), full[0].to_float_vector());
}

TEST(NormalizationOps, LayerNormShapeInference) {
  const std::vector<TensorType> symbolic = {{{kBatch, 16, 8}}, {{8}}, {{8}}};
  EXPECT_EQ(infer_output_types(OpType::LayerNorm, {}, symbolic), (std::vector<TensorType>{{{kBatch, 16, 8}}}));
  const std::vector<TensorType> concrete = {{{4, 16, 8}}, {{8}}, {{8}}};
  EXPECT_EQ(infer_output_types(OpType::LayerNorm, {}, concrete), (std::vector<TensorType>{{{4, 16, 8}}}));
  EXPECT_DOUBLE_EQ(op_schema(OpType::LayerNorm).flops({}, concrete, std::vector<TensorType>{{{4, 16, 8}}}),
                   8.0 * 4 * 16 * 8);
  EXPECT_THROW(infer_output_types(OpType::LayerNorm, {}, std::vector<TensorType>{{{kBatch, 8}}, {{7}}, {{8}}}), Error);
  EXPECT_THROW(infer_output_types(OpType::LayerNorm, {}, std::vector<TensorType>{{{kBatch, 8}}, {{8}}, {{1, 8}}}), Error);
  EXPECT_THROW(infer_output_types(OpType::LayerNorm, {}, std::vector<TensorType>{TensorType{Shape{}}, {{1}}, {{1}}}), Error);
  EXPECT_THROW(infer_output_types(OpType::LayerNorm, {}, std::vector<TensorType>{{{2, 8}, DType::I64}, {{8}}, {{8}}}),
               Error);
  EXPECT_THROW(infer_output_types(OpType::LayerNorm, {}, std::vector<TensorType>{{{2, 8}}, {{8}}}), Error);
  EXPECT_THROW(infer_output_types(OpType::LayerNorm, {{"eps", -1.0}}, concrete), Error);
}

// ---------------- BatchNorm2d ----------------
std::vector<Tensor> batch_norm_inputs(const Shape& x_shape, std::uint64_t seed) {
  const std::int64_t channels = x_shape[1];
  return {normal_tensor(x_shape, seed, 2.f), normal_tensor({channels}, seed + 1), normal_tensor({channels}, seed + 2),
          normal_tensor({channels}, seed + 3), uniform_tensor({channels}, seed + 4, 0.5f, 2.f)};
}

TEST(NormalizationOps, BatchNormGradientsInTraining) {
  expect_gradients(OpType::BatchNorm2d, {}, batch_norm_inputs({3, 2, 2, 3}, 20));
  expect_gradients(OpType::BatchNorm2d, {{"eps", 1e-3}, {"momentum", 0.3}}, batch_norm_inputs({2, 3, 4, 4}, 30));
}

TEST(NormalizationOps, BatchNormGradientsInEvaluation) {
  testing::GradientCheckOptions options;
  options.training = false;
  expect_gradients(OpType::BatchNorm2d, {}, batch_norm_inputs({3, 2, 2, 3}, 40), options);
}

TEST(NormalizationOps, BatchNormTrainingUsesBatchStatisticsAndUpdatesRunningStats) {
  const std::vector<Tensor> inputs = batch_norm_inputs({3, 2, 2, 2}, 50);
  const std::vector<float> old_mean = inputs[3].to_float_vector();
  const std::vector<float> old_var = inputs[4].to_float_vector();
  const double eps = 1e-5, momentum = 0.25;
  const std::vector<float> y =
      run_forward(OpType::BatchNorm2d, {{"momentum", momentum}}, inputs, true)[0].to_float_vector();
  const float* x = inputs[0].data<float>();
  for (int c = 0; c < 2; ++c) {
    // Elements of channel c: x[n][c][i], i over the 2x2 plane.
    double mean = 0;
    for (int n = 0; n < 3; ++n)
      for (int i = 0; i < 4; ++i) mean += x[(n * 2 + c) * 4 + i];
    mean /= 12;
    double squares = 0;
    for (int n = 0; n < 3; ++n)
      for (int i = 0; i < 4; ++i) squares += (x[(n * 2 + c) * 4 + i] - mean) * (x[(n * 2 + c) * 4 + i] - mean);
    const double biased = squares / 12, unbiased = squares / 11;
    for (int n = 0; n < 3; ++n)
      for (int i = 0; i < 4; ++i) {
        const int k = (n * 2 + c) * 4 + i;
        const double expected =
            (x[k] - mean) / std::sqrt(biased + eps) * inputs[1].data<float>()[c] + inputs[2].data<float>()[c];
        EXPECT_NEAR(y[k], expected, 1e-5);
      }
    EXPECT_NEAR(inputs[3].data<float>()[c], (1 - momentum) * old_mean[c] + momentum * mean, 1e-6);
    EXPECT_NEAR(inputs[4].data<float>()[c], (1 - momentum) * old_var[c] + momentum * unbiased, 1e-6);
  }
  // Hand example: one channel holding 1, 2, 3, 4 (mean 2.5, unbiased variance 5/3), running stats 0 and 1.
  const Tensor running_mean = Tensor::zeros({1});
  const Tensor running_var = Tensor::full({1}, 1.0);
  run_forward(OpType::BatchNorm2d, {},
              {Tensor::from_vector<float>({4, 1, 1, 1}, {1, 2, 3, 4}), Tensor::full({1}, 1.0), Tensor::zeros({1}),
               running_mean, running_var},
              true);
  EXPECT_NEAR(running_mean.data<float>()[0], 0.25, 1e-7);
  EXPECT_NEAR(running_var.data<float>()[0], 0.9 + 0.1 * 5.0 / 3.0, 1e-6);
}

TEST(NormalizationOps, BatchNormEvaluationUsesRunningStats) {
  const std::vector<Tensor> inputs = batch_norm_inputs({2, 3, 2, 2}, 60);
  const std::vector<float> old_mean = inputs[3].to_float_vector();
  const std::vector<float> old_var = inputs[4].to_float_vector();
  const std::vector<float> y = run_forward(OpType::BatchNorm2d, {}, inputs, false)[0].to_float_vector();
  EXPECT_EQ(inputs[3].to_float_vector(), old_mean);  // evaluation leaves the running stats alone
  EXPECT_EQ(inputs[4].to_float_vector(), old_var);
  const float* x = inputs[0].data<float>();
  for (int n = 0; n < 2; ++n)
    for (int c = 0; c < 3; ++c)
      for (int i = 0; i < 4; ++i) {
        const int k = (n * 3 + c) * 4 + i;
        const double expected = (x[k] - old_mean[c]) / std::sqrt(old_var[c] + 1e-5) * inputs[1].data<float>()[c] +
                                inputs[2].data<float>()[c];
        EXPECT_NEAR(y[k], expected, 1e-5);
      }
}

TEST(NormalizationOps, ShapesAboveTheParallelThreshold) {
  // More than cpu::kParallelThreshold elements: the OpenMP paths (and LayerNorm's chunked column sums).
  testing::GradientCheckOptions options;
  options.max_elements_per_input = 24;
  expect_gradients(OpType::LayerNorm, {}, {normal_tensor({64, 300}, 70), normal_tensor({300}, 71), normal_tensor({300}, 72)},
                   options);
  expect_gradients(OpType::BatchNorm2d, {}, batch_norm_inputs({8, 4, 24, 24}, 80), options);
}

TEST(NormalizationOps, BatchNormShapeInference) {
  const OpSchema& schema = op_schema(OpType::BatchNorm2d);
  EXPECT_TRUE(schema.input_is_differentiable(0) && schema.input_is_differentiable(1) && schema.input_is_differentiable(2));
  EXPECT_FALSE(schema.input_is_differentiable(3) || schema.input_is_differentiable(4));
  const std::vector<TensorType> symbolic = {{{kBatch, 4, 8, 8}}, {{4}}, {{4}}, {{4}}, {{4}}};
  EXPECT_EQ(infer_output_types(OpType::BatchNorm2d, {}, symbolic), (std::vector<TensorType>{{{kBatch, 4, 8, 8}}}));
  const std::vector<TensorType> concrete = {{{2, 4, 8, 8}}, {{4}}, {{4}}, {{4}}, {{4}}};
  EXPECT_EQ(infer_output_types(OpType::BatchNorm2d, {}, concrete), (std::vector<TensorType>{{{2, 4, 8, 8}}}));
  EXPECT_THROW(infer_output_types(OpType::BatchNorm2d, {},
                                  std::vector<TensorType>{{{kBatch, 4, 8}}, {{4}}, {{4}}, {{4}}, {{4}}}),
               Error);
  EXPECT_THROW(infer_output_types(OpType::BatchNorm2d, {},
                                  std::vector<TensorType>{{{kBatch, 4, 8, 8}}, {{4}}, {{4}}, {{4}}, {{3}}}),
               Error);
  EXPECT_THROW(infer_output_types(OpType::BatchNorm2d, {},
                                  std::vector<TensorType>{{{kBatch, 4, 8, 8}}, {{4}}, {{4}}, {{4}}}),
               Error);
  EXPECT_THROW(infer_output_types(OpType::BatchNorm2d, {{"momentum", 1.5}}, concrete), Error);
}

}  // namespace
}  // namespace partrain
