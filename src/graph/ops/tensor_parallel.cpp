// Schemas of the communication ops of tensor-parallel graphs (Megatron-LM, Shoeybi et al. 2019 §3),
// which graph/tensor_parallel.h inserts; each rank of a tensor-parallel group of t ranks runs them
// on its part of the tensors. B is the symbolic batch dimension.
//   TensorParallelCopy (Megatron's f): x -> x. Forward: identity; backward: the input gradient is
//           all-reduced (summed) over the group. Precedes a column-parallel layer, whose ranks each
//           contribute part of the gradient of the replicated input.
//   TensorParallelAllReduce (Megatron's g): x -> Σ over the group of x. Backward: identity.
//           Follows a row-parallel layer (partial sums) or the vocabulary-parallel embedding.
//   VocabParallelEmbedding: (weight [V/t, H], indices [...] i32|i64) -> [..., H]. Rank r holds
//           vocabulary rows [r·V/t, (r+1)·V/t); positions whose index lies elsewhere get zeros, so
//           the group's sum (a following TensorParallelAllReduce) is the full embedding. An index
//           outside [0, V) is an error at run time; indices get no gradient.
//   VocabParallelCrossEntropy: (logits [..., C/t], labels [...] i32|i64) -> (loss [] f32,
//           log_sum_exp [...] f32). The rank holds classes [r·C/t, (r+1)·C/t) of the logits; the
//           row maxima, the sums of exponentials and the target logits are all-reduced over the group
//           (3 floats per row), so every rank gets SoftmaxCrossEntropy's loss of the whole logits
//           (attribute ignore_index, default -100) without gathering them. log_sum_exp is kept for
//           the backward pass (0 on ignored positions). Labels get no gradient.
#include "core/error.h"
#include "graph/op_schema.h"

namespace partrain {

namespace {
double zero_flops(const Attributes&, std::span<const TensorType>, std::span<const TensorType>) { return 0; }

std::vector<TensorType> infer_identity(const Attributes&, std::span<const TensorType> inputs) {
  PARTRAIN_CHECK(is_floating(inputs[0].dtype), "input must be floating point, got " << dtype_name(inputs[0].dtype));
  return {inputs[0]};
}

double bytes_of(const TensorType& type) { return static_cast<double>(numel(type.shape)) * dtype_size(type.dtype); }

std::pair<double, double> copy_allreduce_bytes(std::span<const TensorType> inputs, std::span<const TensorType>) {
  return {0.0, bytes_of(inputs[0])};
}
std::pair<double, double> reduce_allreduce_bytes(std::span<const TensorType>, std::span<const TensorType> outputs) {
  return {bytes_of(outputs[0]), 0.0};
}

std::vector<TensorType> infer_embedding(const Attributes&, std::span<const TensorType> inputs) {
  const TensorType& weight = inputs[0];
  const TensorType& indices = inputs[1];
  PARTRAIN_CHECK(weight.shape.size() == 2 && !has_batch_dim(weight.shape),
                 "VocabParallelEmbedding weight must be a concrete [V/t, H], got " << shape_string(weight.shape));
  PARTRAIN_CHECK(is_floating(weight.dtype), "VocabParallelEmbedding weight must be floating point");
  PARTRAIN_CHECK(indices.dtype == DType::I32 || indices.dtype == DType::I64,
                 "VocabParallelEmbedding indices must be i32 or i64, got " << dtype_name(indices.dtype));
  Shape shape = indices.shape;
  shape.push_back(weight.shape[1]);
  return {{shape, weight.dtype}};
}

std::vector<TensorType> infer_cross_entropy(const Attributes&, std::span<const TensorType> inputs) {
  const TensorType& logits = inputs[0];
  const TensorType& labels = inputs[1];
  PARTRAIN_CHECK(is_floating(logits.dtype) && !logits.shape.empty(),
                 "VocabParallelCrossEntropy logits must be floating point [..., C/t], got "
                     << dtype_name(logits.dtype) << shape_string(logits.shape));
  PARTRAIN_CHECK(labels.dtype == DType::I32 || labels.dtype == DType::I64,
                 "VocabParallelCrossEntropy labels must be i32 or i64, got " << dtype_name(labels.dtype));
  const Shape leading(logits.shape.begin(), logits.shape.end() - 1);
  PARTRAIN_CHECK(labels.shape == leading, "VocabParallelCrossEntropy labels have shape " << shape_string(labels.shape)
                                                                                          << ", expected " << shape_string(leading));
  return {{Shape{}, DType::F32}, {labels.shape, DType::F32}};
}

double flops_cross_entropy(const Attributes&, std::span<const TensorType> inputs, std::span<const TensorType>) {
  return 5.0 * static_cast<double>(numel(inputs[0].shape));
}

std::pair<double, double> cross_entropy_allreduce_bytes(std::span<const TensorType> inputs, std::span<const TensorType>) {
  return {3.0 * static_cast<double>(numel(inputs[1].shape)) * sizeof(float), 0.0};  // max, Σ exp, target logit
}
}  // namespace

void add_tensor_parallel_schemas(std::vector<OpSchema>& schemas) {
  // Saved tensors: the f and g operators read nothing (their backward copies or all-reduces dy); the
  // embedding reads its indices (and the table's shape); the cross-entropy reads the logits, the
  // labels and its per-row log Σ exp output (output 1), not the loss.
  OpSchema copy{OpType::TensorParallelCopy, 1, 1, infer_identity, zero_flops};
  copy.allreduce_bytes = copy_allreduce_bytes;
  copy.saved_inputs = copy.saved_outputs = 0u;
  schemas.push_back(copy);
  OpSchema reduce{OpType::TensorParallelAllReduce, 1, 1, infer_identity, zero_flops};
  reduce.allreduce_bytes = reduce_allreduce_bytes;
  reduce.saved_inputs = reduce.saved_outputs = 0u;
  schemas.push_back(reduce);
  schemas.push_back({OpType::VocabParallelEmbedding, 2, 2, infer_embedding, zero_flops, 0b01u});
  schemas.back().saved_inputs = 0b10u;
  schemas.back().saved_outputs = 0u;
  OpSchema cross_entropy{OpType::VocabParallelCrossEntropy, 2, 2, infer_cross_entropy, flops_cross_entropy, 0b01u};
  cross_entropy.allreduce_bytes = cross_entropy_allreduce_bytes;
  cross_entropy.saved_inputs = 0b11u;
  cross_entropy.saved_outputs = 0b10u;
  schemas.push_back(cross_entropy);
}

}  // namespace partrain
