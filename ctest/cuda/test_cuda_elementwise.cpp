// CUDA vs CPU: the elementwise ops (kernels/cuda/elementwise.cu against kernels/cpu/elementwise.cpp),
// forward and backward, in fp32 and bf16. Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda_op_check.h"
#include "kernels/cuda/cuda_backend.cuh"
#include "support/gradient_check.h"

namespace partrain {
namespace {
using testing::CudaOpCheck;
using testing::expect_cuda_matches_cpu;
using testing::normal_tensor;
using testing::run_forward;

// Broadcasting patterns: same shape, trailing vector (bias), both operands broadcast, leading
// operand broadcast, inner dimensions reduced, a scalar-like operand, odd sizes.
const std::vector<std::pair<Shape, Shape>> kBroadcastShapes = {
    {{2, 3, 4}, {2, 3, 4}}, {{2, 3, 4}, {4}},       {{2, 1, 4}, {3, 1}},    {{4}, {2, 3, 4}},
    {{2, 3, 4}, {2, 1, 1}}, {{1}, {5, 7}},          {{4, 1, 6}, {1, 5, 1}}, {{3, 1, 5, 1}, {2, 1, 7}},
    {{513, 96}, {96}},      {{7, 33, 65}, {33, 1}}, {{37, 129}, {37, 129}}, {{2, 3, 1, 5}, {3, 4, 1}},
};

TEST(CudaElementwise, BinaryOpsWithBroadcasting) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  std::uint64_t seed = 1;
  for (OpType type : {OpType::Add, OpType::Sub, OpType::Mul}) {
    for (const auto& [a_shape, b_shape] : kBroadcastShapes) {
      SCOPED_TRACE(std::string(op_name(type)) + " " + shape_string(a_shape) + " with " + shape_string(b_shape));
      expect_cuda_matches_cpu(type, {}, {normal_tensor(a_shape, seed), normal_tensor(b_shape, seed + 1)});
      seed += 2;
    }
  }
}

TEST(CudaElementwise, BiasGradientOverManyRows) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  // Many rows reduced into a bias: several row chunks per column block.
  expect_cuda_matches_cpu(OpType::Add, {}, {normal_tensor({16, 256, 96}, 50), normal_tensor({96}, 51)});
  expect_cuda_matches_cpu(OpType::Mul, {}, {normal_tensor({4096, 5}, 52), normal_tensor({5}, 53)});
}

TEST(CudaElementwise, UnaryOps) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  for (const Shape& shape : {Shape{3, 5}, Shape{2, 7, 33}, Shape{1000, 37}}) {
    SCOPED_TRACE(shape_string(shape));
    expect_cuda_matches_cpu(OpType::Scale, {{"value", 0.125}}, {normal_tensor(shape, 10)});
    expect_cuda_matches_cpu(OpType::Scale, {{"value", -3.0}}, {normal_tensor(shape, 11)});
    expect_cuda_matches_cpu(OpType::Relu, {}, {normal_tensor(shape, 12)});
    expect_cuda_matches_cpu(OpType::Tanh, {}, {normal_tensor(shape, 13, 2.f)});
    expect_cuda_matches_cpu(OpType::Gelu, {}, {normal_tensor(shape, 14, 2.f)});
    expect_cuda_matches_cpu(OpType::Gelu, {{"approximate", std::string("tanh")}}, {normal_tensor(shape, 15, 2.f)});
  }
}

TEST(CudaElementwise, DropoutMatchesTheCpuExactly) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  // Same counters, same masks: outputs and gradients bit-identical (tolerance 0), in training with
  // several p and shapes (per-sample sizes not a multiple of 4), and in evaluation (identity).
  CudaOpCheck exact;
  exact.f32_tolerance = 0;
  exact.bf16_tolerance = 0;
  for (double p : {0.1, 0.25, 0.5}) {
    for (const Shape& shape : {Shape{4, 8}, Shape{3, 5, 7}, Shape{9, 1001}}) {
      SCOPED_TRACE("p = " + std::to_string(p) + ", " + shape_string(shape));
      expect_cuda_matches_cpu(OpType::Dropout, {{"p", p}}, {normal_tensor(shape, 20)}, exact);
    }
  }
  CudaOpCheck other_context = exact;
  other_context.random = RandomContext{0x123456789abcdefull, 17, 4, 32, 0xdeadbeefu};
  expect_cuda_matches_cpu(OpType::Dropout, {{"p", 0.3}}, {normal_tensor({6, 77}, 21)}, other_context);
  expect_cuda_matches_cpu(OpType::Dropout, {{"p", 0.0}}, {normal_tensor({6, 77}, 22)}, exact);
  CudaOpCheck evaluation = exact;
  evaluation.training = false;
  expect_cuda_matches_cpu(OpType::Dropout, {{"p", 0.3}}, {normal_tensor({6, 77}, 23)}, evaluation);
}

TEST(CudaElementwise, DropoutMaskPositionsAreTheCpuOnes) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  // A tensor of ones: every element is 0 (dropped) or 1 / (1 - p); the dropped positions must be
  // exactly the CPU's, also for a later slice of the batch drawn alone (first_sample).
  cuda::CudaBackend& backend = cuda::cuda_backend(0);
  const Attributes attributes{{"p", 0.25}};
  const Tensor ones = Tensor::full({64, 1003}, 1.0);
  const RandomContext random{42, 5, 2, 0, 99};
  auto run_cuda = [&](const Tensor& host_input, const RandomContext& context_random) {
    const Tensor input = to_backend(host_input, backend);
    const Tensor output = backend.empty(host_input.shape(), host_input.dtype());
    const KernelContext context{attributes, backend, true, context_random};
    backend.forward(OpType::Dropout, context, std::vector<Tensor>{input}, std::vector<Tensor>{output});
    return to_host(output, backend).to_float_vector();
  };
  const std::vector<float> cpu = run_forward(OpType::Dropout, attributes, {ones}, true, random)[0].to_float_vector();
  const std::vector<float> gpu = run_cuda(ones, random);
  ASSERT_EQ(cpu.size(), gpu.size());
  int dropped = 0;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_EQ(std::memcmp(&cpu[i], &gpu[i], sizeof(float)), 0)
        << "element " << i << ": cpu " << cpu[i] << ", cuda " << gpu[i];
    dropped += gpu[i] == 0.f;
  }
  EXPECT_NEAR(dropped / double(gpu.size()), 0.25, 0.01);
  RandomContext later = random;
  later.first_sample = 32;
  const std::vector<float> half = run_cuda(ones.slice_rows(32, 64).clone(), later);
  EXPECT_TRUE(std::equal(half.begin(), half.end(), cpu.begin() + 32 * 1003));
}

}  // namespace
}  // namespace partrain
