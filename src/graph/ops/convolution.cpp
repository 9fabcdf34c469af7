// Schemas of the convolution ops (PyTorch semantics, NCHW layout).
//   Conv2d: (x [N, C, H, W], weight [O, C/groups, kh, kw], optional bias [O]) -> y [N, O, OH, OW]
//           attributes stride (2 ints, default [1, 1]), padding (2 ints, default [0, 0], zeros),
//           dilation (2 ints, default [1, 1]), groups (int, default 1; divides C and O).
//           OH = (H + 2 padding - dilation (kh - 1) - 1) / stride + 1 (floor), likewise OW.
//   MaxPool2d: x [N, C, H, W] -> y [N, C, OH, OW]; attributes kernel (2 ints, required),
//           stride (2 ints, default kernel), padding (2 ints, default [0, 0]; at most half the
//           kernel; padded positions are -inf). OH = (H + 2 padding - kernel) / stride + 1 (floor).
//           Gradient goes to the first maximum of each window (row-major order).
//   GlobalAvgPool: x [N, C, H, W] -> y [N, C], the mean over H and W.
// N may be the symbolic batch dimension; C, H, W must be concrete.
#include "core/error.h"
#include "graph/op_schema.h"

namespace partrain {

namespace {
// A 2-int attribute such as stride = [sh, sw], each element at least `minimum`.
std::vector<std::int64_t> pair_attribute(const Attributes& attributes, const std::string& name,
                                         std::vector<std::int64_t> fallback, std::int64_t minimum) {
  std::vector<std::int64_t> values = attributes.get_ints(name, std::move(fallback));
  PARTRAIN_CHECK(values.size() == 2, name << " must have 2 values (height, width), got " << values.size());
  PARTRAIN_CHECK(values[0] >= minimum && values[1] >= minimum,
                 name << " must be at least " << minimum << ", got [" << values[0] << ", " << values[1] << "]");
  return values;
}

// Checks x is an NCHW image batch with concrete C, H, W (N may be kBatch).
void check_image(const TensorType& x, const char* what) {
  PARTRAIN_CHECK(x.shape.size() == 4, what << " must have rank 4 [N, C, H, W], got " << shape_string(x.shape));
  PARTRAIN_CHECK(is_floating(x.dtype), what << " must be floating point, got " << dtype_name(x.dtype));
  PARTRAIN_CHECK(x.shape[0] == kBatch || x.shape[0] >= 0, what << " has invalid batch size " << x.shape[0]);
  for (int d = 1; d < 4; ++d)
    PARTRAIN_CHECK(x.shape[d] > 0, what << " " << shape_string(x.shape) << " needs positive concrete C, H and W");
}

// Output extent of a sliding window, or an error when the window does not fit.
std::int64_t window_output_size(std::int64_t input, std::int64_t padding, std::int64_t extent, std::int64_t stride,
                                const char* axis) {
  const std::int64_t span = input + 2 * padding - extent;
  PARTRAIN_CHECK(span >= 0, "window of extent " << extent << " does not fit the padded " << axis << " "
                                                << input + 2 * padding << " (" << axis << " " << input
                                                << ", padding " << padding << ")");
  return span / stride + 1;
}

// ---------------- Conv2d ----------------
std::vector<TensorType> infer_conv2d(const Attributes& attributes, std::span<const TensorType> inputs) {
  const TensorType& x = inputs[0];
  const TensorType& w = inputs[1];
  check_image(x, "Conv2d input");
  PARTRAIN_CHECK(w.shape.size() == 4, "Conv2d weight must have rank 4 [O, C/groups, kh, kw], got "
                                          << shape_string(w.shape));
  for (std::int64_t d : w.shape)
    PARTRAIN_CHECK(d > 0, "Conv2d weight " << shape_string(w.shape) << " needs positive concrete dimensions");
  PARTRAIN_CHECK(w.dtype == x.dtype, "Conv2d weight has dtype " << dtype_name(w.dtype) << ", input has "
                                                                << dtype_name(x.dtype));
  const auto stride = pair_attribute(attributes, "stride", {1, 1}, 1);
  const auto padding = pair_attribute(attributes, "padding", {0, 0}, 0);
  const auto dilation = pair_attribute(attributes, "dilation", {1, 1}, 1);
  const std::int64_t groups = attributes.get_int("groups", 1);
  PARTRAIN_CHECK(groups >= 1, "Conv2d groups must be at least 1, got " << groups);
  const std::int64_t channels = x.shape[1];
  const std::int64_t out_channels = w.shape[0];
  PARTRAIN_CHECK(channels % groups == 0, "Conv2d groups " << groups << " does not divide the input channels "
                                                          << channels);
  PARTRAIN_CHECK(out_channels % groups == 0, "Conv2d groups " << groups << " does not divide the output channels "
                                                              << out_channels);
  PARTRAIN_CHECK(w.shape[1] * groups == channels,
                 "Conv2d weight " << shape_string(w.shape) << " expects " << w.shape[1] * groups
                                  << " input channels (C/groups = " << w.shape[1] << ", groups " << groups
                                  << "), input " << shape_string(x.shape) << " has " << channels);
  if (inputs.size() == 3) {
    const TensorType& bias = inputs[2];
    PARTRAIN_CHECK(bias.shape == Shape{out_channels}, "Conv2d bias must have shape [" << out_channels << "], got "
                                                                                       << shape_string(bias.shape));
    PARTRAIN_CHECK(bias.dtype == x.dtype, "Conv2d bias has dtype " << dtype_name(bias.dtype) << ", input has "
                                                                   << dtype_name(x.dtype));
  }
  const std::int64_t oh = window_output_size(x.shape[2], padding[0], dilation[0] * (w.shape[2] - 1) + 1, stride[0],
                                             "height");
  const std::int64_t ow = window_output_size(x.shape[3], padding[1], dilation[1] * (w.shape[3] - 1) + 1, stride[1],
                                             "width");
  return {{{x.shape[0], out_channels, oh, ow}, x.dtype}};
}

// 2 (C/groups) kh kw per output element (w[1] is already C / groups), plus one add for the bias.
double flops_conv2d(const Attributes&, std::span<const TensorType> inputs, std::span<const TensorType> outputs) {
  const Shape& w = inputs[1].shape;
  const double outputs_count = static_cast<double>(numel(outputs[0].shape));
  const double per_output = 2.0 * static_cast<double>(w[1] * w[2] * w[3]);
  return outputs_count * per_output + (inputs.size() == 3 ? outputs_count : 0.0);
}

// ---------------- MaxPool2d ----------------
std::vector<TensorType> infer_maxpool2d(const Attributes& attributes, std::span<const TensorType> inputs) {
  const TensorType& x = inputs[0];
  check_image(x, "MaxPool2d input");
  PARTRAIN_CHECK(attributes.has("kernel"), "MaxPool2d needs attribute kernel (2 ints)");
  const auto kernel = pair_attribute(attributes, "kernel", {}, 1);
  const auto stride = pair_attribute(attributes, "stride", kernel, 1);
  const auto padding = pair_attribute(attributes, "padding", {0, 0}, 0);
  PARTRAIN_CHECK(2 * padding[0] <= kernel[0] && 2 * padding[1] <= kernel[1],
                 "MaxPool2d padding [" << padding[0] << ", " << padding[1] << "] must be at most half the kernel ["
                                       << kernel[0] << ", " << kernel[1] << "]");
  const std::int64_t oh = window_output_size(x.shape[2], padding[0], kernel[0], stride[0], "height");
  const std::int64_t ow = window_output_size(x.shape[3], padding[1], kernel[1], stride[1], "width");
  return {{{x.shape[0], x.shape[1], oh, ow}, x.dtype}};
}

double flops_maxpool2d(const Attributes& attributes, std::span<const TensorType>,
                       std::span<const TensorType> outputs) {
  const auto kernel = attributes.get_ints("kernel");
  return static_cast<double>(numel(outputs[0].shape)) * static_cast<double>(kernel[0] * kernel[1]);  // comparisons
}

// ---------------- GlobalAvgPool ----------------
std::vector<TensorType> infer_global_avg_pool(const Attributes&, std::span<const TensorType> inputs) {
  const TensorType& x = inputs[0];
  check_image(x, "GlobalAvgPool input");
  return {{{x.shape[0], x.shape[1]}, x.dtype}};
}

double flops_global_avg_pool(const Attributes&, std::span<const TensorType> inputs, std::span<const TensorType>) {
  return static_cast<double>(numel(inputs[0].shape));  // one add per input element
}
}  // namespace

void add_convolution_schemas(std::vector<OpSchema>& schemas) {
  // Saved tensors: Conv2d reads x and the weight (not the bias, not y: only its shape); MaxPool2d
  // reads x (the argmax of each window is recomputed, not stored); GlobalAvgPool reads nothing.
  schemas.push_back({OpType::Conv2d, 2, 3, infer_conv2d, flops_conv2d});
  schemas.back().saved_inputs = 0b011u;
  schemas.back().saved_outputs = 0u;
  schemas.push_back({OpType::MaxPool2d, 1, 1, infer_maxpool2d, flops_maxpool2d});
  schemas.back().saved_inputs = 0b1u;
  schemas.back().saved_outputs = 0u;
  schemas.push_back({OpType::GlobalAvgPool, 1, 1, infer_global_avg_pool, flops_global_avg_pool});
  schemas.back().saved_inputs = 0u;
  schemas.back().saved_outputs = 0u;
}

}  // namespace partrain
