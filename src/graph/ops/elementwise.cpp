// Schemas of the elementwise ops.
//   Add, Sub, Mul: (a, b) -> y, numpy broadcasting; y has a's dtype.
//   Scale: x -> x * value                         attribute value (float)
//   Relu, Tanh: x -> f(x)
//   Gelu: x -> x * Phi(x)                         attribute approximate: "none" (erf, default) | "tanh"
//   Dropout: x -> x * mask / (1 - p) in training, x in evaluation; attribute p (float in [0, 1)).
//            mask element = uniform(seed, step, microbatch, sample, element) >= p (core/rng.h).
#include "core/error.h"
#include "graph/op_schema.h"

namespace partrain {

namespace {
std::vector<TensorType> infer_binary(const Attributes&, std::span<const TensorType> inputs) {
  PARTRAIN_CHECK(inputs[0].dtype == inputs[1].dtype, "operands have dtypes " << dtype_name(inputs[0].dtype)
                                                                              << " and " << dtype_name(inputs[1].dtype));
  return {{broadcast_shapes(inputs[0].shape, inputs[1].shape), inputs[0].dtype}};
}

std::vector<TensorType> infer_unary(const Attributes&, std::span<const TensorType> inputs) {
  PARTRAIN_CHECK(is_floating(inputs[0].dtype), "input must be floating point, got " << dtype_name(inputs[0].dtype));
  return {inputs[0]};
}

std::vector<TensorType> infer_gelu(const Attributes& attributes, std::span<const TensorType> inputs) {
  const std::string approximate = attributes.get_string("approximate", "none");
  PARTRAIN_CHECK(approximate == "none" || approximate == "tanh",
                 "Gelu approximate must be \"none\" or \"tanh\", got \"" << approximate << "\"");
  return infer_unary(attributes, inputs);
}

std::vector<TensorType> infer_dropout(const Attributes& attributes, std::span<const TensorType> inputs) {
  const double p = attributes.get_float("p");
  PARTRAIN_CHECK(p >= 0 && p < 1, "Dropout p must be in [0, 1), got " << p);
  return infer_unary(attributes, inputs);
}

double flops_gelu(const Attributes&, std::span<const TensorType>, std::span<const TensorType> outputs) {
  return 8.0 * static_cast<double>(numel(outputs[0].shape));  // erf/tanh and a few multiply-adds
}
}  // namespace

void add_elementwise_schemas(std::vector<OpSchema>& schemas) {
  for (OpType type : {OpType::Add, OpType::Sub, OpType::Mul})
    schemas.push_back({type, 2, 2, infer_binary, flops_one_per_output});
  schemas.push_back({OpType::Scale, 1, 1, infer_unary, flops_one_per_output});
  schemas.push_back({OpType::Relu, 1, 1, infer_unary, flops_one_per_output});
  schemas.push_back({OpType::Tanh, 1, 1, infer_unary, flops_gelu});
  schemas.push_back({OpType::Gelu, 1, 1, infer_gelu, flops_gelu});
  schemas.push_back({OpType::Dropout, 1, 1, infer_dropout, flops_one_per_output});
}

}  // namespace partrain
