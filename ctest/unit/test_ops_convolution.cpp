// Finite-difference gradient checks, direct-loop references and shape inference of the convolution
// ops (Conv2d, MaxPool2d, GlobalAvgPool).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>

#include "graph/op_schema.h"
#include "kernels/common/op_geometry.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/onednn_convolution.h"
#include "support/errors.h"
#include "support/expectations.h"

namespace partrain {
namespace {
using testing::check_gradients;
using testing::expect_gradients;
using testing::normal_tensor;
using testing::run_forward;
using Ints = std::vector<std::int64_t>;

struct ConvConfig {
  Shape x, w;
  bool bias = true;
  Ints stride{1, 1}, padding{0, 0}, dilation{1, 1};
  std::int64_t groups = 1;

  Attributes attributes() const {
    return {{"stride", stride}, {"padding", padding}, {"dilation", dilation}, {"groups", groups}};
  }
  std::vector<Tensor> inputs(std::uint64_t seed) const {
    std::vector<Tensor> tensors{normal_tensor(x, seed), normal_tensor(w, seed + 1, 0.5f)};
    if (bias) tensors.push_back(normal_tensor({w[0]}, seed + 2));
    return tensors;
  }
};

// Configurations covering every attribute, the 1x1 fast path and non-square shapes.
std::vector<ConvConfig> conv_configs() {
  return {
      {{2, 3, 5, 5}, {4, 3, 3, 3}},                                             // plain, with bias
      {{2, 3, 7, 7}, {4, 3, 3, 3}, true, {2, 2}, {1, 1}},                       // stride 2, padding 1
      {{1, 2, 7, 7}, {3, 2, 3, 3}, false, {1, 1}, {2, 2}, {2, 2}},              // dilation 2, no bias
      {{2, 4, 5, 5}, {6, 2, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 2},            // groups 2
      {{2, 4, 4, 4}, {5, 4, 1, 1}},                                             // 1x1 (direct columns)
      {{2, 4, 5, 5}, {6, 2, 1, 1}, false, {1, 1}, {0, 0}, {1, 1}, 2},           // 1x1 grouped
      {{2, 3, 5, 5}, {2, 3, 1, 1}, true, {2, 2}},                               // 1x1 stride 2 (im2col)
      {{2, 3, 5, 8}, {4, 3, 2, 3}, true, {1, 2}, {1, 0}, {1, 2}},               // non-square everything
      {{1, 4, 3, 3}, {4, 1, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 4},            // depthwise
      {{2, 8, 4, 4}, {8, 8, 3, 3}, false, {1, 1}, {1, 1}},                      // ResNet block (oneDNN on AVX2)
      {{2, 5, 1, 1}, {3, 5, 3, 3}, true, {1, 1}, {1, 1}},                       // 1x1 map: single live tap
      {{2, 4, 1, 1}, {3, 4, 3, 3}, false, {2, 2}, {1, 1}},                      // single tap, stride 2
      {{2, 4, 1, 1}, {3, 4, 2, 2}, true, {2, 2}, {1, 1}},                       // single tap in a corner
      {{2, 4, 1, 1}, {3, 4, 3, 3}, true, {1, 1}, {2, 2}, {2, 2}},               // single tap, dilation 2
  };
}

// Direct convolution: y[n, o, oh, ow] = b[o] + sum_{c, ki, kj} w[o, c, ki, kj] x[n, g*Cg + c, ih, iw].
std::vector<double> direct_conv2d(const ConvConfig& config, const std::vector<Tensor>& inputs, const Shape& y_shape) {
  const float* x = inputs[0].data<float>();
  const float* w = inputs[1].data<float>();
  const float* b = config.bias ? inputs[2].data<float>() : nullptr;
  const std::int64_t N = y_shape[0], O = y_shape[1], OH = y_shape[2], OW = y_shape[3];
  const std::int64_t C = config.x[1], H = config.x[2], W = config.x[3];
  const std::int64_t Cg = config.w[1], KH = config.w[2], KW = config.w[3], Og = O / config.groups;
  std::vector<double> y(static_cast<std::size_t>(N * O * OH * OW));
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t o = 0; o < O; ++o)
      for (std::int64_t oh = 0; oh < OH; ++oh)
        for (std::int64_t ow = 0; ow < OW; ++ow) {
          double sum = b ? b[o] : 0.0;
          const std::int64_t group = o / Og;
          for (std::int64_t c = 0; c < Cg; ++c)
            for (std::int64_t ki = 0; ki < KH; ++ki)
              for (std::int64_t kj = 0; kj < KW; ++kj) {
                const std::int64_t ih = oh * config.stride[0] - config.padding[0] + ki * config.dilation[0];
                const std::int64_t iw = ow * config.stride[1] - config.padding[1] + kj * config.dilation[1];
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                sum += double(w[((o * Cg + c) * KH + ki) * KW + kj]) * x[((n * C + group * Cg + c) * H + ih) * W + iw];
              }
          y[((n * O + o) * OH + oh) * OW + ow] = sum;
        }
  return y;
}

// Direct vector-Jacobian product of the convolution: gradients of sum(dy * y) w.r.t. x, w, b.
void direct_conv2d_backward(const ConvConfig& config, const std::vector<Tensor>& inputs, const Tensor& dy_tensor,
                            std::vector<double>& dx, std::vector<double>& dw, std::vector<double>& db) {
  const float* x = inputs[0].data<float>();
  const float* w = inputs[1].data<float>();
  const float* dy = dy_tensor.data<float>();
  const Shape& y_shape = dy_tensor.shape();
  const std::int64_t N = y_shape[0], O = y_shape[1], OH = y_shape[2], OW = y_shape[3];
  const std::int64_t C = config.x[1], H = config.x[2], W = config.x[3];
  const std::int64_t Cg = config.w[1], KH = config.w[2], KW = config.w[3], Og = O / config.groups;
  dx.assign(static_cast<std::size_t>(inputs[0].numel()), 0.0);
  dw.assign(static_cast<std::size_t>(inputs[1].numel()), 0.0);
  db.assign(static_cast<std::size_t>(O), 0.0);
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t o = 0; o < O; ++o)
      for (std::int64_t oh = 0; oh < OH; ++oh)
        for (std::int64_t ow = 0; ow < OW; ++ow) {
          const double g = dy[((n * O + o) * OH + oh) * OW + ow];
          db[o] += g;
          const std::int64_t group = o / Og;
          for (std::int64_t c = 0; c < Cg; ++c)
            for (std::int64_t ki = 0; ki < KH; ++ki)
              for (std::int64_t kj = 0; kj < KW; ++kj) {
                const std::int64_t ih = oh * config.stride[0] - config.padding[0] + ki * config.dilation[0];
                const std::int64_t iw = ow * config.stride[1] - config.padding[1] + kj * config.dilation[1];
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                const std::int64_t xi = ((n * C + group * Cg + c) * H + ih) * W + iw;
                const std::int64_t wi = ((o * Cg + c) * KH + ki) * KW + kj;
                dx[xi] += g * w[wi];
                dw[wi] += g * x[xi];
              }
        }
}

void expect_close(const std::vector<float>& actual, const std::vector<double>& expected, double tolerance,
                  const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (std::size_t i = 0; i < actual.size(); ++i)
    ASSERT_NEAR(actual[i], expected[i], tolerance * (1 + std::abs(expected[i]))) << what << " element " << i;
}

std::string shape_of(const ConvConfig& config) {
  return "x " + shape_string(config.x) + " w " + shape_string(config.w) + " groups " + std::to_string(config.groups);
}

// An f32 tensor holding a random permutation of 0, gap, 2 gap, ...: no near ties, so finite
// differences of max pooling never switch the winner.
Tensor separated_tensor(const Shape& shape, std::uint64_t seed, float gap = 0.05f) {
  std::vector<float> values(static_cast<std::size_t>(numel(shape)));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * gap - 1.f;
  std::mt19937_64 generator(seed);
  std::shuffle(values.begin(), values.end(), generator);
  return Tensor::from_vector<float>(shape, values);
}

Shape output_shape(OpType type, const Attributes& attributes, const std::vector<Shape>& shapes) {
  std::vector<TensorType> types;
  for (const Shape& shape : shapes) types.push_back({shape});
  return infer_output_types(type, attributes, types)[0].shape;
}

// The message of the partrain::Error thrown by shape inference ("" when none is thrown).
std::string inference_error(OpType type, const Attributes& attributes, const std::vector<Shape>& shapes) {
  return testing::error_message([&] { output_shape(type, attributes, shapes); });
}

// Expects shape inference to throw a partrain::Error whose message contains `expected`.
void expect_error(OpType type, const Attributes& attributes, const std::vector<Shape>& shapes,
                  const std::string& expected) {
  const std::string message = inference_error(type, attributes, shapes);
  EXPECT_NE(message.find(expected), std::string::npos) << "error \"" << message << "\" lacks \"" << expected << "\"";
}

// ---------------- Conv2d ----------------
TEST(ConvolutionOps, Conv2dGradients) {
  std::uint64_t seed = 100;
  for (const ConvConfig& config : conv_configs()) {
    SCOPED_TRACE(shape_of(config));
    expect_gradients(OpType::Conv2d, config.attributes(), config.inputs(seed += 10));
  }
}

TEST(ConvolutionOps, Conv2dForwardMatchesDirectLoops) {
  std::vector<ConvConfig> configs = conv_configs();
  // Large enough to run several threads over the batch.
  configs.push_back({{5, 8, 12, 12}, {8, 8, 3, 3}, true, {1, 1}, {1, 1}});
  configs.push_back({{6, 8, 11, 9}, {12, 4, 3, 3}, true, {2, 2}, {1, 1}, {1, 1}, 2});
  configs.push_back({{4, 16, 10, 10}, {8, 16, 1, 1}, false});
  std::uint64_t seed = 500;
  for (const ConvConfig& config : configs) {
    const std::vector<Tensor> inputs = config.inputs(seed += 10);
    const Tensor y = run_forward(OpType::Conv2d, config.attributes(), inputs)[0];
    expect_close(y.to_float_vector(), direct_conv2d(config, inputs, y.shape()), 1e-4, shape_of(config));
  }
}

TEST(ConvolutionOps, Conv2dBackwardMatchesDirectLoops) {
  std::vector<ConvConfig> configs = conv_configs();
  configs.push_back({{5, 8, 12, 12}, {8, 8, 3, 3}, true, {1, 1}, {1, 1}});
  configs.push_back({{6, 8, 11, 9}, {12, 4, 3, 3}, true, {2, 2}, {1, 1}, {1, 1}, 2});
  configs.push_back({{4, 16, 10, 10}, {8, 16, 1, 1}, false});
  CpuBackend& backend = cpu_backend();
  std::uint64_t seed = 900;
  for (const ConvConfig& config : configs) {
    SCOPED_TRACE(shape_of(config));
    const Attributes attributes = config.attributes();
    const std::vector<Tensor> inputs = config.inputs(seed += 10);
    const std::vector<Tensor> outputs = run_forward(OpType::Conv2d, attributes, inputs);
    const Tensor dy = normal_tensor(outputs[0].shape(), seed + 5);
    std::vector<double> dx, dw, db;
    direct_conv2d_backward(config, inputs, dy, dx, dw, db);
    const KernelContext context{attributes, backend};
    // All gradients, then each alone (e.g. the first layer needs no dx).
    for (int wanted = 0; wanted < 4; ++wanted) {
      std::vector<Tensor> grads(inputs.size());
      for (std::size_t i = 0; i < inputs.size(); ++i)
        if (wanted == 0 || wanted == static_cast<int>(i) + 1) grads[i] = Tensor::full(inputs[i].shape(), std::nan(""));
      backend.backward(OpType::Conv2d, context, inputs, outputs, std::vector<Tensor>{dy}, grads);
      if (grads[0].defined()) expect_close(grads[0].to_float_vector(), dx, 1e-4, "dx");
      if (grads[1].defined()) expect_close(grads[1].to_float_vector(), dw, 1e-4, "dweight");
      if (grads.size() > 2 && grads[2].defined()) expect_close(grads[2].to_float_vector(), db, 1e-4, "dbias");
    }
  }
}

// On a CPU with AVX2 and a oneDNN build, stride-1 ResNet convolutions take the oneDNN path (so the
// tests above checked it); strided ones and 1x1 maps do not. PARTRAIN_CPU_CONVOLUTION=im2col (the
// ConvolutionOps_im2col test) switches it off.
TEST(ConvolutionOps, OneDnnServesStrideOneConvolutionsOnAvx2) {
  const char* selected = std::getenv("PARTRAIN_CPU_CONVOLUTION");
  const bool im2col = selected != nullptr && std::string(selected) == "im2col";
  const auto geometry = [](const ConvConfig& config) {
    const Attributes attributes = config.attributes();
    const std::vector<Tensor> inputs = config.inputs(1);
    const Tensor y = run_forward(OpType::Conv2d, attributes, inputs)[0];
    return kernels::conv_geometry(attributes, inputs[0], inputs[1], y);
  };
  const auto block = geometry({{2, 8, 4, 4}, {8, 8, 3, 3}, false, {1, 1}, {1, 1}});
  const auto strided = geometry({{2, 8, 4, 4}, {8, 8, 3, 3}, false, {2, 2}, {1, 1}});
  const bool expected = cpu::onednn_convolution_built() && __builtin_cpu_supports("avx2") &&
                        __builtin_cpu_supports("fma") && !im2col;
  for (auto pass : {cpu::ConvolutionPass::Forward, cpu::ConvolutionPass::BackwardData,
                    cpu::ConvolutionPass::BackwardWeights}) {
    EXPECT_EQ(cpu::onednn_convolution_available(block, false, pass), expected);
    EXPECT_FALSE(cpu::onednn_convolution_available(strided, false, pass));
  }
}

TEST(ConvolutionOps, Conv2dShapesAndFlops) {
  const Attributes stem{{"stride", Ints{2, 2}}, {"padding", Ints{3, 3}}};
  EXPECT_EQ(output_shape(OpType::Conv2d, stem, {{kBatch, 3, 224, 224}, {64, 3, 7, 7}}), (Shape{kBatch, 64, 112, 112}));
  EXPECT_EQ(output_shape(OpType::Conv2d, stem, {{8, 3, 224, 224}, {64, 3, 7, 7}}), (Shape{8, 64, 112, 112}));
  // ResNet-50 bottleneck convolutions.
  EXPECT_EQ(output_shape(OpType::Conv2d, {}, {{kBatch, 256, 56, 56}, {64, 256, 1, 1}}), (Shape{kBatch, 64, 56, 56}));
  EXPECT_EQ(output_shape(OpType::Conv2d, {{"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}},
                         {{kBatch, 128, 56, 56}, {128, 128, 3, 3}, {128}}),
            (Shape{kBatch, 128, 28, 28}));
  EXPECT_EQ(output_shape(OpType::Conv2d, {{"stride", Ints{2, 2}}}, {{kBatch, 256, 56, 56}, {512, 256, 1, 1}}),
            (Shape{kBatch, 512, 28, 28}));
  // Dilation, groups, non-square.
  EXPECT_EQ(output_shape(OpType::Conv2d, {{"dilation", Ints{2, 3}}, {"groups", std::int64_t{4}}},
                         {{2, 8, 10, 12}, {4, 2, 3, 3}}),
            (Shape{2, 4, 6, 6}));
  EXPECT_EQ(output_shape(OpType::Conv2d, {{"stride", Ints{1, 2}}, {"padding", Ints{1, 0}}},
                         {{3, 3, 5, 8}, {4, 3, 2, 3}}),
            (Shape{3, 4, 6, 3}));

  // FLOPs: 2 * N * O * OH * OW * (C / groups) * kh * kw, plus one per output for the bias.
  const OpSchema& schema = op_schema(OpType::Conv2d);
  const std::vector<TensorType> inputs{{{2, 3, 224, 224}}, {{64, 3, 7, 7}}};
  const std::vector<TensorType> outputs = infer_output_types(OpType::Conv2d, stem, inputs);
  EXPECT_DOUBLE_EQ(schema.flops(stem, inputs, outputs), 2.0 * 2 * 64 * 112 * 112 * 3 * 7 * 7);
  const Attributes grouped{{"groups", std::int64_t{2}}};
  const std::vector<TensorType> grouped_inputs{{{1, 4, 5, 5}}, {{6, 2, 3, 3}}, {{6}}};
  const std::vector<TensorType> grouped_outputs = infer_output_types(OpType::Conv2d, grouped, grouped_inputs);
  EXPECT_DOUBLE_EQ(schema.flops(grouped, grouped_inputs, grouped_outputs), 2.0 * 6 * 3 * 3 * 2 * 3 * 3 + 6 * 3 * 3);
}

TEST(ConvolutionOps, Conv2dErrors) {
  expect_error(OpType::Conv2d, {}, {{2, 4, 8, 8}, {8, 3, 3, 3}}, "input channels");
  expect_error(OpType::Conv2d, {{"groups", std::int64_t{3}}}, {{2, 4, 8, 8}, {6, 1, 3, 3}},
               "does not divide the input channels 4");
  expect_error(OpType::Conv2d, {{"groups", std::int64_t{2}}}, {{2, 4, 8, 8}, {5, 2, 3, 3}},
               "does not divide the output channels 5");
  expect_error(OpType::Conv2d, {}, {{2, 4, 8, 8}, {8, 4, 3, 3}, {4}}, "bias");
  expect_error(OpType::Conv2d, {}, {{4, 8, 8}, {8, 4, 3, 3}}, "rank 4");
  expect_error(OpType::Conv2d, {}, {{2, 4, 2, 8}, {8, 4, 3, 3}}, "does not fit");
  expect_error(OpType::Conv2d, {{"stride", Ints{0, 1}}}, {{2, 4, 8, 8}, {8, 4, 3, 3}}, "stride");
  expect_error(OpType::Conv2d, {{"padding", Ints{1}}}, {{2, 4, 8, 8}, {8, 4, 3, 3}}, "padding must have 2 values");
  EXPECT_THROW(output_shape(OpType::Conv2d, {}, {{2, 4, 8, 8}}), Error);  // weight missing
}

// ---------------- MaxPool2d ----------------
TEST(ConvolutionOps, MaxPoolMatchesHandComputation) {
  const std::vector<float> values = {1, 5, 2, 0,  //
                                     3, 4, 9, 1,  //
                                     7, 0, 6, 8,  //
                                     2, 3, 1, 4};
  const Tensor x = Tensor::from_vector<float>({1, 1, 4, 4}, values);
  EXPECT_EQ(run_forward(OpType::MaxPool2d, {{"kernel", Ints{2, 2}}}, {x})[0].to_float_vector(),
            (std::vector<float>{5, 9, 7, 8}));
  const Attributes stem{{"kernel", Ints{3, 3}}, {"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}};
  const std::vector<Tensor> outputs = run_forward(OpType::MaxPool2d, stem, {x});
  EXPECT_EQ(outputs[0].to_float_vector(), (std::vector<float>{5, 9, 7, 9}));

  // Padding is -inf, never zero: an all-negative input keeps its own maxima.
  std::vector<float> negative = values;
  for (float& value : negative) value -= 10;
  const Tensor negative_x = Tensor::from_vector<float>({1, 1, 4, 4}, negative);
  EXPECT_EQ(run_forward(OpType::MaxPool2d, stem, {negative_x})[0].to_float_vector(), (std::vector<float>{-5, -1, -3, -1}));

  // Backward routes each output gradient to its window's maximum (9 is the maximum of two windows).
  CpuBackend& backend = cpu_backend();
  const KernelContext context{stem, backend};
  const Tensor dy = Tensor::from_vector<float>({1, 1, 2, 2}, {1, 2, 3, 4});
  const std::vector<Tensor> grads{Tensor::full({1, 1, 4, 4}, std::nan(""))};
  backend.backward(OpType::MaxPool2d, context, std::vector<Tensor>{x}, outputs, std::vector<Tensor>{dy}, grads);
  EXPECT_EQ(grads[0].to_float_vector(), (std::vector<float>{0, 1, 0, 0,  //
                                                            0, 0, 6, 0,  //
                                                            3, 0, 0, 0,  //
                                                            0, 0, 0, 0}));

  // Ties: the first maximum of the window (row-major) takes the gradient.
  const Tensor ties = Tensor::full({1, 1, 2, 2}, 1.0);
  const Attributes two{{"kernel", Ints{2, 2}}};
  const KernelContext tie_context{two, backend};
  const std::vector<Tensor> tie_outputs = run_forward(OpType::MaxPool2d, two, {ties});
  const std::vector<Tensor> tie_grads{Tensor::full({1, 1, 2, 2}, std::nan(""))};
  backend.backward(OpType::MaxPool2d, tie_context, std::vector<Tensor>{ties}, tie_outputs,
                   std::vector<Tensor>{Tensor::full({1, 1, 1, 1}, 5.0)}, tie_grads);
  EXPECT_EQ(tie_grads[0].to_float_vector(), (std::vector<float>{5, 0, 0, 0}));
}

TEST(ConvolutionOps, MaxPoolGradients) {
  const Attributes stem{{"kernel", Ints{3, 3}}, {"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}};
  expect_gradients(OpType::MaxPool2d, stem, {separated_tensor({2, 3, 7, 7}, 1)});
  expect_gradients(OpType::MaxPool2d, stem, {separated_tensor({1, 2, 8, 6}, 2)});
  expect_gradients(OpType::MaxPool2d, {{"kernel", Ints{2, 2}}}, {separated_tensor({2, 2, 6, 5}, 3)});
  expect_gradients(OpType::MaxPool2d, {{"kernel", Ints{2, 3}}, {"stride", Ints{1, 2}}},
                   {separated_tensor({1, 3, 5, 7}, 4)});
  // Larger than the parallel threshold (several planes at once).
  const Tensor big = separated_tensor({4, 16, 20, 20}, 5, 0.001f);
  std::vector<Tensor> outputs = run_forward(OpType::MaxPool2d, stem, {big});
  EXPECT_EQ(outputs[0].shape(), (Shape{4, 16, 10, 10}));
  CpuBackend& backend = cpu_backend();
  const KernelContext context{stem, backend};
  const Tensor dy = Tensor::full(outputs[0].shape(), 1.0);
  const std::vector<Tensor> grads{Tensor::full(big.shape(), std::nan(""))};
  backend.backward(OpType::MaxPool2d, context, std::vector<Tensor>{big}, outputs, std::vector<Tensor>{dy}, grads);
  const std::vector<float> dx = grads[0].to_float_vector();
  EXPECT_DOUBLE_EQ(std::accumulate(dx.begin(), dx.end(), 0.0), static_cast<double>(outputs[0].numel()));
}

TEST(ConvolutionOps, MaxPoolShapesAndErrors) {
  const Attributes stem{{"kernel", Ints{3, 3}}, {"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}};
  EXPECT_EQ(output_shape(OpType::MaxPool2d, stem, {{kBatch, 64, 112, 112}}), (Shape{kBatch, 64, 56, 56}));
  EXPECT_EQ(output_shape(OpType::MaxPool2d, stem, {{8, 64, 112, 112}}), (Shape{8, 64, 56, 56}));
  EXPECT_EQ(output_shape(OpType::MaxPool2d, {{"kernel", Ints{2, 2}}}, {{kBatch, 3, 7, 9}}), (Shape{kBatch, 3, 3, 4}));
  expect_error(OpType::MaxPool2d, {}, {{2, 3, 8, 8}}, "kernel");
  expect_error(OpType::MaxPool2d, {{"kernel", Ints{2, 2}}, {"padding", Ints{2, 2}}}, {{2, 3, 8, 8}},
               "at most half the kernel");
  expect_error(OpType::MaxPool2d, {{"kernel", Ints{5, 5}}}, {{2, 3, 4, 8}}, "does not fit");
  expect_error(OpType::MaxPool2d, {{"kernel", Ints{2, 2}}}, {{2, 3, 8}}, "rank 4");
  const std::vector<TensorType> inputs{{{2, 64, 112, 112}}};
  const std::vector<TensorType> outputs = infer_output_types(OpType::MaxPool2d, stem, inputs);
  EXPECT_DOUBLE_EQ(op_schema(OpType::MaxPool2d).flops(stem, inputs, outputs), 2.0 * 64 * 56 * 56 * 9);
}

// ---------------- GlobalAvgPool ----------------
TEST(ConvolutionOps, GlobalAvgPool) {
  const Tensor x = Tensor::from_vector<float>({1, 2, 2, 2}, {1, 2, 3, 4, -1, 0, 5, 8});
  EXPECT_EQ(run_forward(OpType::GlobalAvgPool, {}, {x})[0].to_float_vector(), (std::vector<float>{2.5f, 3.f}));
  expect_gradients(OpType::GlobalAvgPool, {}, {normal_tensor({3, 4, 5, 6}, 21)});
  expect_gradients(OpType::GlobalAvgPool, {}, {normal_tensor({2, 64, 7, 7}, 22)});  // parallel path
  EXPECT_EQ(output_shape(OpType::GlobalAvgPool, {}, {{kBatch, 2048, 7, 7}}), (Shape{kBatch, 2048}));
  expect_error(OpType::GlobalAvgPool, {}, {{kBatch, 2048}}, "rank 4");

  CpuBackend& backend = cpu_backend();
  const Attributes none;
  const KernelContext context{none, backend};
  const std::vector<Tensor> grads{Tensor::full(x.shape(), std::nan(""))};
  backend.backward(OpType::GlobalAvgPool, context, std::vector<Tensor>{x}, run_forward(OpType::GlobalAvgPool, {}, {x}),
                   std::vector<Tensor>{Tensor::from_vector<float>({1, 2}, {4, -8})}, grads);
  EXPECT_EQ(grads[0].to_float_vector(), (std::vector<float>{1, 1, 1, 1, -2, -2, -2, -2}));
}

}  // namespace
}  // namespace partrain
