// Schemas of the softmax ops.
//   Softmax: (x [..., N], optional mask) -> y = softmax(x + mask) over the last dimension
//            mask: additive, floating point, broadcastable to x (e.g. [B, 1, 1, T]); no gradient.
//            attribute causal (int, 0): over the last two dimensions [..., S, T], element j of row i
//            is masked (-inf) when j > i + (T - S). Rows with every element masked (-inf) give zeros.
//            Backward: dx = y * (dy - sum(dy * y)).
//   SoftmaxCrossEntropy: (logits [..., C], labels [...] i32/i64) -> loss [] (f32 scalar)
//            attribute ignore_index (int, -100). loss = mean over the positions whose label is not
//            ignore_index of -log softmax(logits)[label]; 0 when every position is ignored. A label
//            outside [0, C) other than ignore_index is an error. Labels get no gradient.
#include "core/error.h"
#include "graph/op_schema.h"

namespace partrain {

namespace {
std::vector<TensorType> infer_softmax(const Attributes& attributes, std::span<const TensorType> inputs) {
  const TensorType& x = inputs[0];
  PARTRAIN_CHECK(is_floating(x.dtype), "Softmax input must be floating point, got " << dtype_name(x.dtype));
  PARTRAIN_CHECK(!x.shape.empty(), "Softmax input must have rank >= 1, got a scalar");
  const std::int64_t causal = attributes.get_int("causal", 0);
  PARTRAIN_CHECK(causal == 0 || causal == 1, "Softmax causal must be 0 or 1, got " << causal);
  PARTRAIN_CHECK(!causal || x.shape.size() >= 2,
                 "causal Softmax needs an input of rank >= 2 ([..., S, T]), got " << shape_string(x.shape));
  if (inputs.size() > 1) {
    const TensorType& mask = inputs[1];
    PARTRAIN_CHECK(is_floating(mask.dtype), "Softmax mask must be floating point, got " << dtype_name(mask.dtype));
    bool broadcastable = mask.shape.size() <= x.shape.size();
    if (broadcastable) {
      const std::size_t shift = x.shape.size() - mask.shape.size();
      for (std::size_t d = 0; d < mask.shape.size(); ++d)
        broadcastable = broadcastable && (mask.shape[d] == 1 || mask.shape[d] == x.shape[d + shift]);
    }
    PARTRAIN_CHECK(broadcastable, "Softmax mask of shape " << shape_string(mask.shape)
                                                           << " does not broadcast to the input shape "
                                                           << shape_string(x.shape));
  }
  return {x};
}

std::vector<TensorType> infer_cross_entropy(const Attributes& attributes, std::span<const TensorType> inputs) {
  attributes.get_int("ignore_index", -100);  // type check
  const TensorType& logits = inputs[0];
  const TensorType& labels = inputs[1];
  PARTRAIN_CHECK(is_floating(logits.dtype),
                 "SoftmaxCrossEntropy logits must be floating point, got " << dtype_name(logits.dtype));
  PARTRAIN_CHECK(!logits.shape.empty(), "SoftmaxCrossEntropy logits must have rank >= 1 ([..., C]), got a scalar");
  PARTRAIN_CHECK(labels.dtype == DType::I32 || labels.dtype == DType::I64,
                 "SoftmaxCrossEntropy labels must be i32 or i64, got " << dtype_name(labels.dtype));
  const Shape leading(logits.shape.begin(), logits.shape.end() - 1);
  PARTRAIN_CHECK(labels.shape == leading, "SoftmaxCrossEntropy labels have shape "
                                              << shape_string(labels.shape) << ", expected "
                                              << shape_string(leading) << " for logits "
                                              << shape_string(logits.shape));
  return {{Shape{}, DType::F32}};
}

// Max, subtract, exp, sum, divide (and the mask add): about 5 operations per element.
double flops_softmax(const Attributes&, std::span<const TensorType> inputs, std::span<const TensorType>) {
  return 5.0 * static_cast<double>(numel(inputs[0].shape));
}
}  // namespace

void add_softmax_schemas(std::vector<OpSchema>& schemas) {
  // Saved tensors: Softmax reads its output only (dx = y ⊙ (dy − Σ dy·y)), not its input or mask.
  // SoftmaxCrossEntropy reads the logits and labels (the probabilities are recomputed), not the loss.
  schemas.push_back({OpType::Softmax, 1, 2, infer_softmax, flops_softmax, 0b01u});
  schemas.back().saved_inputs = 0u;
  schemas.back().saved_outputs = 0b1u;
  schemas.push_back({OpType::SoftmaxCrossEntropy, 2, 2, infer_cross_entropy, flops_softmax, 0b01u});
  schemas.back().saved_inputs = 0b11u;
  schemas.back().saved_outputs = 0u;
}

}  // namespace partrain
