// CUDA vs CPU checks of the convolution ops (Conv2d through cuDNN, MaxPool2d and GlobalAvgPool own
// kernels), label "cuda", forward and backward in fp32 and bf16. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cuda/cuda_op_check.h"
#include "support/gradient_check.h"

namespace partrain {
namespace {
using testing::CudaOpCheck;
using testing::expect_cuda_matches_cpu;
using testing::normal_tensor;
using Ints = std::vector<std::int64_t>;

// fp32 tolerance of Conv2d: cuDNN picks its own algorithms (implicit GEMM, Winograd, FFT, split
// reductions over N*OH*OW for the weight gradient), whose transforms and summation orders differ
// from OpenBLAS im2col GEMMs; with up to C*kh*kw = 147..576 products per output and reductions
// over hundreds of positions the fp32 rounding differences reach ~1e-5 relative, so 1e-4 leaves a
// margin while still catching any indexing error (those give errors of order 1). TF32 is off.
constexpr double kConvF32Tolerance = 1e-4;

struct ConvCase {
  std::string name;
  Shape x, w;
  bool bias = true;
  Ints stride{1, 1}, padding{0, 0}, dilation{1, 1};
  std::int64_t groups = 1;
};

std::vector<ConvCase> conv_cases() {
  return {
      {"3x3 plain", {2, 3, 5, 5}, {4, 3, 3, 3}},
      {"3x3 stride 2 padding 1", {2, 3, 7, 7}, {4, 3, 3, 3}, true, {2, 2}, {1, 1}},
      {"3x3 padding 1 odd size no bias", {3, 5, 9, 11}, {6, 5, 3, 3}, false, {1, 1}, {1, 1}},
      {"3x3 wider channels", {4, 16, 14, 14}, {32, 16, 3, 3}, true, {1, 1}, {1, 1}},
      {"1x1", {2, 4, 4, 4}, {5, 4, 1, 1}},
      {"1x1 many channels no bias", {2, 64, 7, 7}, {128, 64, 1, 1}, false},
      {"1x1 stride 2 (downsample)", {2, 8, 9, 9}, {16, 8, 1, 1}, false, {2, 2}},
      {"7x7 stride 2 padding 3 (stem)", {2, 3, 23, 21}, {8, 3, 7, 7}, false, {2, 2}, {3, 3}},
      {"7x7 stride 2 padding 3 with bias", {1, 3, 16, 16}, {4, 3, 7, 7}, true, {2, 2}, {3, 3}},
      {"dilation 2", {1, 2, 7, 7}, {3, 2, 3, 3}, false, {1, 1}, {2, 2}, {2, 2}},
      {"groups 2", {2, 4, 5, 5}, {6, 2, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 2},
      {"1x1 grouped", {2, 4, 5, 5}, {6, 2, 1, 1}, false, {1, 1}, {0, 0}, {1, 1}, 2},
      {"depthwise", {1, 4, 3, 3}, {4, 1, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 4},
      {"non-square everything", {2, 3, 5, 8}, {4, 3, 2, 3}, true, {1, 2}, {1, 0}, {1, 2}},
  };
}

TEST(CudaConvolution, Conv2dMatchesCpu) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  std::uint64_t seed = 1;
  for (const ConvCase& c : conv_cases()) {
    SCOPED_TRACE(c.name);
    const Attributes attributes{{"stride", c.stride}, {"padding", c.padding}, {"dilation", c.dilation}, {"groups", c.groups}};
    std::vector<Tensor> inputs{normal_tensor(c.x, seed), normal_tensor(c.w, seed + 1, 0.5f)};
    if (c.bias) inputs.push_back(normal_tensor({c.w[0]}, seed + 2));
    seed += 3;
    CudaOpCheck check;
    check.f32_tolerance = kConvF32Tolerance;
    expect_cuda_matches_cpu(OpType::Conv2d, attributes, inputs, check);
  }
}

// ---------------- MaxPool2d ----------------
// Values on a coarse grid (multiples of 0.5, exact in bf16) so that windows hold ties: the gradient
// must go to the same (first, row-major) maximum as on the CPU.
Tensor tied_tensor(const Shape& shape, std::uint64_t seed) {
  Tensor tensor = normal_tensor(shape, seed);
  float* data = tensor.data<float>();
  for (std::int64_t i = 0; i < tensor.numel(); ++i) data[i] = std::round(data[i] * 2.f) / 2.f;
  return tensor;
}

TEST(CudaConvolution, MaxPoolMatchesCpuWithPaddingAndTies) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  const Attributes stem{{"kernel", Ints{3, 3}}, {"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}};
  const Attributes two{{"kernel", Ints{2, 2}}};
  const Attributes overlapping{{"kernel", Ints{3, 3}}, {"stride", Ints{1, 1}}, {"padding", Ints{1, 1}}};
  const Attributes rectangular{{"kernel", Ints{3, 2}}, {"stride", Ints{2, 1}}, {"padding", Ints{1, 0}}};
  std::uint64_t seed = 10;
  for (const Attributes* attributes : {&stem, &two, &overlapping, &rectangular}) {
    SCOPED_TRACE(attributes->canonical_string());
    for (const Shape& shape : {Shape{2, 3, 9, 11}, Shape{1, 2, 8, 8}, Shape{2, 4, 7, 6}}) {
      expect_cuda_matches_cpu(OpType::MaxPool2d, *attributes, {normal_tensor(shape, seed++)});
      expect_cuda_matches_cpu(OpType::MaxPool2d, *attributes, {tied_tensor(shape, seed++)});
    }
  }
  // All-negative input: padded positions never win.
  Tensor negative = tied_tensor({2, 2, 5, 5}, 99);
  for (std::int64_t i = 0; i < negative.numel(); ++i) negative.data<float>()[i] = -std::abs(negative.data<float>()[i]) - 1;
  expect_cuda_matches_cpu(OpType::MaxPool2d, stem, {negative});
  // ResNet-sized plane stack.
  expect_cuda_matches_cpu(OpType::MaxPool2d, stem, {normal_tensor({4, 16, 28, 28}, 100)});
}

// ---------------- GlobalAvgPool ----------------
TEST(CudaConvolution, GlobalAvgPoolMatchesCpu) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  std::uint64_t seed = 200;
  for (const Shape& shape : {Shape{2, 3, 7, 7}, Shape{3, 5, 1, 1}, Shape{2, 4, 13, 17}, Shape{2, 256, 7, 7},
                             Shape{1, 2, 56, 56}})
    expect_cuda_matches_cpu(OpType::GlobalAvgPool, {}, {normal_tensor(shape, seed++)});
}

}  // namespace
}  // namespace partrain
