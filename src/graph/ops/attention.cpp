// Schemas of the attention ops.
//   Attention: (q, k, v[, mask]) -> y = softmax(scale * q k^T + mask) v  (fused scaled dot-product)
//     q [B, h, S, d], k [B, h, T, d], v [B, h, T, dv]; y [B, h, S, dv]; softmax over T.
//     mask: optional additive f32 mask broadcastable to [B, h, S, T] (e.g. [B, 1, 1, T] for BERT
//     padding); it is a constant (no gradient).
//     attributes: causal (int 0/1, default 0): key j is masked for query i when j > i + (T - S);
//                 scale (float, default 1/sqrt(d)).
//     A query row whose keys are all masked (-inf) gives a zero output row.
#include "core/error.h"
#include "graph/op_schema.h"

namespace partrain {

namespace {
std::vector<TensorType> infer_attention(const Attributes& attributes, std::span<const TensorType> inputs) {
  const Shape& q = inputs[0].shape;
  const Shape& k = inputs[1].shape;
  const Shape& v = inputs[2].shape;
  PARTRAIN_CHECK(is_floating(inputs[0].dtype), "Attention q must be floating point, got " << dtype_name(inputs[0].dtype));
  PARTRAIN_CHECK(inputs[1].dtype == inputs[0].dtype && inputs[2].dtype == inputs[0].dtype,
                 "Attention q, k, v have dtypes " << dtype_name(inputs[0].dtype) << ", " << dtype_name(inputs[1].dtype)
                                                  << ", " << dtype_name(inputs[2].dtype));
  PARTRAIN_CHECK(q.size() == 4, "Attention q must be [B, h, S, d], got " << shape_string(q));
  PARTRAIN_CHECK(k.size() == 4, "Attention k must be [B, h, T, d], got " << shape_string(k));
  PARTRAIN_CHECK(v.size() == 4, "Attention v must be [B, h, T, dv], got " << shape_string(v));
  PARTRAIN_CHECK(k[0] == q[0] && k[1] == q[1] && k[3] == q[3],
                 "Attention k " << shape_string(k) << " does not match q " << shape_string(q) << " (want [B, h, T, d])");
  PARTRAIN_CHECK(v[0] == q[0] && v[1] == q[1] && v[2] == k[2],
                 "Attention v " << shape_string(v) << " does not match k " << shape_string(k) << " (want [B, h, T, dv])");
  const std::int64_t causal = attributes.get_int("causal", 0);
  PARTRAIN_CHECK(causal == 0 || causal == 1, "Attention causal must be 0 or 1, got " << causal);
  if (causal == 1 && q[2] >= 0 && k[2] >= 0)
    PARTRAIN_CHECK(k[2] >= q[2], "causal Attention needs at least as many keys as queries, got S = " << q[2]
                                                                                                << ", T = " << k[2]);
  if (attributes.has("scale")) {
    const double scale = attributes.get_float("scale");
    PARTRAIN_CHECK(scale > 0, "Attention scale must be positive, got " << scale);
  }
  if (inputs.size() > 3) {
    const TensorType& mask = inputs[3];
    PARTRAIN_CHECK(is_floating(mask.dtype), "Attention mask must be floating point (additive), got "
                                                << dtype_name(mask.dtype));
    const Shape scores = {q[0], q[1], q[2], k[2]};
    bool broadcastable = mask.shape.size() <= 4;
    for (std::size_t i = 0; broadcastable && i < mask.shape.size(); ++i) {
      const std::int64_t m = mask.shape[mask.shape.size() - 1 - i];
      broadcastable = m == 1 || m == scores[3 - i];
    }
    PARTRAIN_CHECK(broadcastable, "Attention mask " << shape_string(mask.shape) << " does not broadcast to the scores "
                                                    << shape_string(scores) << " [B, h, S, T]");
  }
  return {{{q[0], q[1], q[2], v[3]}, inputs[0].dtype}};
}

double flops_attention(const Attributes&, std::span<const TensorType> inputs, std::span<const TensorType>) {
  const Shape& q = inputs[0].shape;
  const Shape& v = inputs[2].shape;
  const double scores = static_cast<double>(q[0]) * static_cast<double>(q[1]) * static_cast<double>(q[2]) *
                        static_cast<double>(v[2]);
  // q k^T and P v (multiply-add = 2), plus scale, mask, max, exp, sum and divide per score.
  return scores * (2.0 * static_cast<double>(q[3]) + 2.0 * static_cast<double>(v[3]) + 6.0);
}
}  // namespace

void add_attention_schemas(std::vector<OpSchema>& schemas) {
  OpSchema attention{OpType::Attention, 3, 4, infer_attention, flops_attention};
  attention.differentiable_inputs = 0b0111;  // the mask is a constant
  // Saved tensors: q, k, v and the mask; the probabilities are recomputed in the backward (as
  // FlashAttention does), so unlike the composed form nothing of size heads·S² is kept.
  attention.saved_inputs = 0b1111u;
  attention.saved_outputs = 0u;
  schemas.push_back(attention);
}

}  // namespace partrain
