// The finite-difference checker itself must be able to fail: deliberately wrong backward rules
// (a factor off, a sign flipped, an input gradient left unwritten, a swapped operand) are caught.
#include <gtest/gtest.h>

#include "support/gradient_check.h"

namespace partrain {
namespace {

void relu_backward_doubled(const KernelContext&, std::span<const Tensor> inputs, std::span<const Tensor>,
                           std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  for (std::int64_t i = 0; i < inputs[0].numel(); ++i)
    input_grads[0].data<float>()[i] = inputs[0].data<float>()[i] > 0 ? 2 * output_grads[0].data<float>()[i] : 0;
}

void tanh_backward_wrong_sign(const KernelContext&, std::span<const Tensor>, std::span<const Tensor> outputs,
                              std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  for (std::int64_t i = 0; i < outputs[0].numel(); ++i) {
    const float y = outputs[0].data<float>()[i];
    input_grads[0].data<float>()[i] = -(1 - y * y) * output_grads[0].data<float>()[i];
  }
}

void mul_backward_forgets_second_input(const KernelContext&, std::span<const Tensor> inputs, std::span<const Tensor>,
                                       std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  for (std::int64_t i = 0; i < inputs[0].numel(); ++i)
    input_grads[0].data<float>()[i] = output_grads[0].data<float>()[i] * inputs[1].data<float>()[i];
}

void mul_backward_swapped_operands(const KernelContext&, std::span<const Tensor> inputs, std::span<const Tensor>,
                                   std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  for (std::int64_t i = 0; i < inputs[0].numel(); ++i) {
    input_grads[0].data<float>()[i] = output_grads[0].data<float>()[i] * inputs[0].data<float>()[i];
    input_grads[1].data<float>()[i] = output_grads[0].data<float>()[i] * inputs[1].data<float>()[i];
  }
}

TEST(GradientCheck, PassesOnTheRealBackward) {
  const Tensor a = testing::normal_tensor({3, 4}, 1), b = testing::normal_tensor({3, 4}, 2);
  EXPECT_TRUE(testing::check_gradients(OpType::Relu, {}, {a}).passed);
  EXPECT_TRUE(testing::check_gradients(OpType::Tanh, {}, {a}).passed);
  EXPECT_TRUE(testing::check_gradients(OpType::Mul, {}, {a, b}).passed);
}

TEST(GradientCheck, FailsOnDeliberatelyWrongBackward) {
  const Tensor a = testing::normal_tensor({3, 4}, 1), b = testing::normal_tensor({3, 4}, 2);
  const auto doubled = testing::check_gradients(OpType::Relu, {}, {a}, {}, relu_backward_doubled);
  EXPECT_FALSE(doubled.passed) << doubled.report;
  EXPECT_GT(doubled.worst_error, 0.3);
  EXPECT_FALSE(testing::check_gradients(OpType::Tanh, {}, {a}, {}, tanh_backward_wrong_sign).passed);
  const auto forgotten = testing::check_gradients(OpType::Mul, {}, {a, b}, {}, mul_backward_forgets_second_input);
  EXPECT_FALSE(forgotten.passed) << forgotten.report;  // input 1's gradient stays NaN
  EXPECT_FALSE(testing::check_gradients(OpType::Mul, {}, {a, b}, {}, mul_backward_swapped_operands).passed);
}

}  // namespace
}  // namespace partrain
