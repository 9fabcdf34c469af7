// Schemas of the normalization ops.
//   LayerNorm: (x [..., H], weight [H], bias [H]) -> y [..., H]          attribute eps (float, 1e-5)
//              y = (x - mean) * rstd * weight + bias over the last dimension, rstd = 1 / sqrt(var + eps),
//              var biased. The backward recomputes mean and rstd from x (no saved statistics).
//   BatchNorm2d: (x [N, C, H, W], weight [C], bias [C], running_mean [C], running_var [C]) -> y
//              attributes eps (float, 1e-5), momentum (float in [0, 1], 0.1).
//              Training: statistics of the batch over (N, H, W) with the biased variance; the running
//              statistics are updated in place, running = (1 - momentum) * running + momentum * batch,
//              with the unbiased variance for running_var (PyTorch semantics).
//              Evaluation: the running statistics. Running statistics get no gradient.
#include "core/error.h"
#include "graph/op_schema.h"

namespace partrain {

namespace {
double checked_eps(const Attributes& attributes) {
  const double eps = attributes.get_float("eps", 1e-5);
  PARTRAIN_CHECK(eps >= 0, "eps must be non-negative, got " << eps);
  return eps;
}

void check_vector(const TensorType& type, const char* what, std::int64_t size, const char* size_name) {
  PARTRAIN_CHECK(is_floating(type.dtype), what << " must be floating point, got " << dtype_name(type.dtype));
  PARTRAIN_CHECK(type.shape == Shape{size}, what << " has shape " << shape_string(type.shape) << ", expected ["
                                                 << (size == kBatch ? std::string("B") : std::to_string(size))
                                                 << "] (" << size_name << ")");
}

std::vector<TensorType> infer_layer_norm(const Attributes& attributes, std::span<const TensorType> inputs) {
  checked_eps(attributes);
  const TensorType& x = inputs[0];
  PARTRAIN_CHECK(is_floating(x.dtype), "LayerNorm input must be floating point, got " << dtype_name(x.dtype));
  PARTRAIN_CHECK(!x.shape.empty(), "LayerNorm input must have rank >= 1, got a scalar");
  const std::int64_t hidden = x.shape.back();
  check_vector(inputs[1], "LayerNorm weight", hidden, "the last dimension of the input");
  check_vector(inputs[2], "LayerNorm bias", hidden, "the last dimension of the input");
  return {x};
}

std::vector<TensorType> infer_batch_norm(const Attributes& attributes, std::span<const TensorType> inputs) {
  checked_eps(attributes);
  const double momentum = attributes.get_float("momentum", 0.1);
  PARTRAIN_CHECK(momentum >= 0 && momentum <= 1, "BatchNorm2d momentum must be in [0, 1], got " << momentum);
  const TensorType& x = inputs[0];
  PARTRAIN_CHECK(is_floating(x.dtype), "BatchNorm2d input must be floating point, got " << dtype_name(x.dtype));
  PARTRAIN_CHECK(x.shape.size() == 4, "BatchNorm2d input must be [N, C, H, W], got " << shape_string(x.shape));
  const std::int64_t channels = x.shape[1];
  check_vector(inputs[1], "BatchNorm2d weight", channels, "channels of the input");
  check_vector(inputs[2], "BatchNorm2d bias", channels, "channels of the input");
  check_vector(inputs[3], "BatchNorm2d running_mean", channels, "channels of the input");
  check_vector(inputs[4], "BatchNorm2d running_var", channels, "channels of the input");
  return {x};
}

// Mean, variance, normalise and affine: about 8 operations per element.
double flops_normalization(const Attributes&, std::span<const TensorType>, std::span<const TensorType> outputs) {
  return 8.0 * static_cast<double>(numel(outputs[0].shape));
}
}  // namespace

void add_normalization_schemas(std::vector<OpSchema>& schemas) {
  // Saved tensors: LayerNorm reads x and the weight and recomputes each row's mean and 1/std from x
  // (PyTorch and Megatron store them: 2 floats per row, which we do not); the bias is not read.
  // BatchNorm2d reads x, the weight and the running statistics (the batch statistics are recomputed
  // from x in training).
  schemas.push_back({OpType::LayerNorm, 3, 3, infer_layer_norm, flops_normalization});
  schemas.back().saved_inputs = 0b011u;
  schemas.back().saved_outputs = 0u;
  schemas.push_back({OpType::BatchNorm2d, 5, 5, infer_batch_norm, flops_normalization, 0b00111u});
  schemas.back().saved_inputs = 0b11011u;
  schemas.back().saved_outputs = 0u;
}

}  // namespace partrain
