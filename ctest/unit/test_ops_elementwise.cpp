// Finite-difference gradient checks and reference values of the elementwise ops.
#include <gtest/gtest.h>

#include <cmath>

#include "graph/op_schema.h"
#include "support/expectations.h"

namespace partrain {
namespace {
using testing::check_gradients;
using testing::expect_gradients;
using testing::normal_tensor;
using testing::run_forward;

TEST(ElementwiseOps, BinaryOpsWithBroadcasting) {
  for (OpType type : {OpType::Add, OpType::Sub, OpType::Mul}) {
    expect_gradients(type, {}, {normal_tensor({2, 3, 4}, 1), normal_tensor({2, 3, 4}, 2)});
    expect_gradients(type, {}, {normal_tensor({2, 3, 4}, 3), normal_tensor({4}, 4)});
    expect_gradients(type, {}, {normal_tensor({2, 1, 4}, 5), normal_tensor({3, 1}, 6)});
    // The attention mask's shape: [B, 1, 1, S] broadcast over heads and query positions.
    expect_gradients(type, {}, {normal_tensor({2, 2, 3, 5}, 13), normal_tensor({2, 1, 1, 5}, 14)});
  }
}

TEST(ElementwiseOps, BroadcastForwardMatchesHandComputation) {
  const Tensor a = Tensor::from_vector<float>({2, 2}, {1, 2, 3, 4});
  const Tensor b = Tensor::from_vector<float>({2}, {10, 20});
  EXPECT_EQ(run_forward(OpType::Add, {}, {a, b})[0].to_float_vector(), (std::vector<float>{11, 22, 13, 24}));
  EXPECT_EQ(run_forward(OpType::Mul, {}, {a, b})[0].to_float_vector(), (std::vector<float>{10, 40, 30, 80}));
  EXPECT_THROW(infer_output_types(OpType::Add, {}, std::vector<TensorType>{{{2, 3}}, {{4}}}), Error);
}

TEST(ElementwiseOps, UnaryOps) {
  expect_gradients(OpType::Scale, {{"value", 0.125}}, {normal_tensor({3, 5}, 7)});
  expect_gradients(OpType::Relu, {}, {normal_tensor({4, 6}, 8)});
  expect_gradients(OpType::Tanh, {}, {normal_tensor({4, 6}, 9)});
  expect_gradients(OpType::Gelu, {}, {normal_tensor({4, 6}, 10)});
  expect_gradients(OpType::Gelu, {{"approximate", std::string("tanh")}}, {normal_tensor({4, 6}, 11)});
}

TEST(ElementwiseOps, GeluMatchesClosedForm) {
  const Tensor x = Tensor::from_vector<float>({3}, {-1.f, 0.5f, 2.f});
  const auto exact = run_forward(OpType::Gelu, {}, {x})[0].to_float_vector();
  const auto approximate = run_forward(OpType::Gelu, {{"approximate", std::string("tanh")}}, {x})[0].to_float_vector();
  // torch.nn.functional.gelu(torch.tensor([-1., .5, 2.])) and approximate="tanh"
  const std::vector<float> torch_exact = {-0.15865526f, 0.34573123f, 1.95449972f};
  const std::vector<float> torch_tanh = {-0.15880801f, 0.34571401f, 1.95459771f};
  for (int i = 0; i < 3; ++i) {
    EXPECT_NEAR(exact[i], torch_exact[i], 1e-6);
    EXPECT_NEAR(approximate[i], torch_tanh[i], 1e-6);
  }
}

TEST(ElementwiseOps, DropoutMaskIsCounterBasedAndUnbiased) {
  const Attributes attributes{{"p", 0.25}};
  expect_gradients(OpType::Dropout, attributes, {normal_tensor({4, 8}, 12)});
  const Tensor ones = Tensor::full({64, 256}, 1.0);
  const RandomContext context{42, 5, 2, 0, 99};
  const auto whole = run_forward(OpType::Dropout, attributes, {ones}, true, context)[0].to_float_vector();
  // Fraction dropped near p, survivors scaled by 1/(1-p).
  int dropped = 0;
  for (float value : whole) {
    if (value == 0) ++dropped; else EXPECT_FLOAT_EQ(value, 1.f / 0.75f);
  }
  EXPECT_NEAR(dropped / double(whole.size()), 0.25, 0.01);
  // The second half of the batch computed alone (first_sample = 32) draws the same masks.
  RandomContext later = context;
  later.first_sample = 32;
  const auto half = run_forward(OpType::Dropout, attributes, {ones.slice_rows(32, 64).clone()}, true, later)[0].to_float_vector();
  EXPECT_TRUE(std::equal(half.begin(), half.end(), whole.begin() + 32 * 256));
  // Another step draws another mask; evaluation mode is the identity.
  RandomContext next_step = context;
  next_step.step = 6;
  EXPECT_NE(run_forward(OpType::Dropout, attributes, {ones}, true, next_step)[0].to_float_vector(), whole);
  EXPECT_EQ(run_forward(OpType::Dropout, attributes, {ones}, false, context)[0].to_float_vector(), ones.to_float_vector());
}

// The CPU kernel draws one Philox evaluation per four elements; every element must still get
// core/rng.h random_uniform(context, sample, element) (the GPU kernel's draw), also across sample
// boundaries that do not fall on a multiple of four and across the kernel's parallel blocks.
TEST(ElementwiseOps, DropoutMaskIsRandomUniformOfEachElement) {
  const Attributes attributes{{"p", 0.3}};
  const RandomContext context{7, 3, 1, 4, 1234};
  for (const Shape& shape : {Shape{7, 3, 5}, Shape{5, 4099}}) {
    const Tensor ones = Tensor::full(shape, 1.0);
    const auto mask = run_forward(OpType::Dropout, attributes, {ones}, true, context)[0].to_float_vector();
    const std::int64_t per_sample = numel(shape) / shape[0];
    for (std::int64_t i = 0; i < numel(shape); ++i) {
      const float u = random_uniform(context, static_cast<std::uint32_t>(i / per_sample),
                                     static_cast<std::uint64_t>(i % per_sample));
      ASSERT_EQ(mask[static_cast<std::size_t>(i)], u >= 0.3f ? 1.f / 0.7f : 0.f) << "element " << i;
    }
  }
}

}  // namespace
}  // namespace partrain
