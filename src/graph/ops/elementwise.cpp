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

// Saved tensors (OpSchema::saved_inputs / saved_outputs), from the backward kernels:
//   Add, Sub: nothing (dy reduced to each operand's shape).  Mul: both operands (da = dy·b, db = dy·a).
//   Scale: nothing (dx = value·dy).  Relu: its input (x > 0).  Tanh: its output (1 − y²).
//   Gelu: its input (the derivative is a function of x).
//   Dropout: nothing — the mask is regenerated in the backward from the Philox counter (seed, step,
//   microbatch, sample, element; core/rng.h), so no mask is stored (Korthikanti et al. count one
//   byte per element for it); only the input's shape is used.
// Possible reductions, not made (numerics would stay the same but kernels would change): Relu could
// read its output (y > 0 ⇔ x > 0), which the next op often saves anyway.
void add_elementwise_schemas(std::vector<OpSchema>& schemas) {
  for (OpType type : {OpType::Add, OpType::Sub, OpType::Mul}) {
    schemas.push_back({type, 2, 2, infer_binary, flops_one_per_output});
    schemas.back().saved_inputs = type == OpType::Mul ? 0b11u : 0u;
    schemas.back().saved_outputs = 0u;
  }
  auto unary = [&](OpType type, auto infer, auto flops, std::uint32_t saved_input, std::uint32_t saved_output) {
    schemas.push_back({type, 1, 1, infer, flops});
    schemas.back().saved_inputs = saved_input;
    schemas.back().saved_outputs = saved_output;
  };
  unary(OpType::Scale, infer_unary, flops_one_per_output, 0u, 0u);
  unary(OpType::Relu, infer_unary, flops_one_per_output, 1u, 0u);
  unary(OpType::Tanh, infer_unary, flops_gelu, 0u, 1u);
  unary(OpType::Gelu, infer_gelu, flops_gelu, 1u, 0u);
  unary(OpType::Dropout, infer_dropout, flops_one_per_output, 0u, 0u);
}

}  // namespace partrain
