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
//           outside [0, V) is an error at run time; indices get no gradient. Attribute vocab_size
//           (default V): the real vocabulary when the table ends in Megatron-LM's vocabulary
//           padding (rows [vocab_size, V), zero; graph/tensor_parallel.h); an index among them is
//           an error too.
//   VocabParallelCrossEntropy: (logits [..., C/t], labels [...] i32|i64) -> (loss [] f32,
//           log_sum_exp [...] f32). The rank holds classes [r·C/t, (r+1)·C/t) of the logits; the
//           row maxima, the sums of exponentials and the target logits are all-reduced over the group
//           (3 floats per row), so every rank gets SoftmaxCrossEntropy's loss of the whole logits
//           (attribute ignore_index, default -100) without gathering them. log_sum_exp is kept for
//           the backward pass (0 on ignored positions). Labels get no gradient. Attribute
//           vocab_size (default C): the real classes when the logits end in vocabulary padding —
//           classes [vocab_size, C) take no part in the softmax (as if their logits were −inf),
//           get a zero gradient, and a label among them is an error.
// Sequence parallelism (Korthikanti et al. 2022 §4.2.2; Megatron-LM's --sequence-parallel): between
// the tensor-parallel regions each rank holds 1/t of the sequence. Attributes: axis (the sequence
// dimension of the tensor, default 1: [B, S, H]) and parts (t, the group's size; the kernels check
// it). "Part" is 1/t of dimension axis, rank r holding [r·n, (r+1)·n) of it; "whole" the full one.
//   SequenceParallelAllGather (Megatron's f under sequence parallelism): part -> whole, gathered
//           over the group. Backward: reduce-scatter of the gradient (a column-parallel layer's ranks
//           each contribute part of the gradient of the whole input).
//   SequenceParallelReduceScatter (g under sequence parallelism): whole -> part of the sum over the
//           group. Backward: all-gather of the gradient. Follows a row-parallel layer or the
//           vocabulary-parallel embedding.
//   SequenceParallelScatter: whole (the same on every rank) -> the rank's part. Backward: all-gather
//           of the gradient (a replicated tensor, e.g. the position embeddings, entering the
//           sequence-parallel region).
//   SequenceParallelGather: part -> whole, gathered. Backward: the rank's part of the gradient
//           (the region after it is replicated, so every rank has the same whole gradient); e.g.
//           before BERT's pooler, which reads the first token.
// Communication volumes, as the bytes of the all-reduce that moves as much: an all-gather or a
// reduce-scatter of a whole tensor of W bytes moves (t − 1)/t · W per rank, a ring all-reduce of W
// twice that, so each counts W/2 (TaskCost::forward/backward_allreduce_bytes).
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

// The real vocabulary of a padded vocabulary-parallel op (the kernels check it against the group).
void check_vocab_size(const Attributes& attributes) {
  const std::int64_t vocab_size = attributes.get_int("vocab_size", 1);
  PARTRAIN_CHECK(vocab_size >= 1, "vocab_size must be positive, got " << vocab_size);
}

std::vector<TensorType> infer_embedding(const Attributes& attributes, std::span<const TensorType> inputs) {
  check_vocab_size(attributes);
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

std::vector<TensorType> infer_cross_entropy(const Attributes& attributes, std::span<const TensorType> inputs) {
  check_vocab_size(attributes);
  attributes.get_int("ignore_index", -100);  // type check
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

// Sequence parallelism: `axis` of the input type (default 1) and the group size `parts`.
std::pair<std::size_t, std::int64_t> sequence_axis(const Attributes& attributes, const TensorType& input) {
  const std::int64_t parts = attributes.get_int("parts");
  PARTRAIN_CHECK(parts >= 1, "parts must be at least 1, got " << parts);
  const std::int64_t axis = attributes.get_int("axis", 1);
  PARTRAIN_CHECK(axis >= 0 && static_cast<std::size_t>(axis) < input.shape.size(),
                 "axis " << axis << " is not a dimension of " << shape_string(input.shape));
  PARTRAIN_CHECK(input.shape[static_cast<std::size_t>(axis)] != kBatch, "axis " << axis << " is the batch dimension");
  return {static_cast<std::size_t>(axis), parts};
}

// part -> whole (all-gathers).
std::vector<TensorType> infer_gathered(const Attributes& attributes, std::span<const TensorType> inputs) {
  PARTRAIN_CHECK(is_floating(inputs[0].dtype), "input must be floating point, got " << dtype_name(inputs[0].dtype));
  const auto [axis, parts] = sequence_axis(attributes, inputs[0]);
  TensorType output = inputs[0];
  output.shape[axis] *= parts;
  return {output};
}

// whole -> part (reduce-scatter, scatter).
std::vector<TensorType> infer_scattered(const Attributes& attributes, std::span<const TensorType> inputs) {
  PARTRAIN_CHECK(is_floating(inputs[0].dtype), "input must be floating point, got " << dtype_name(inputs[0].dtype));
  const auto [axis, parts] = sequence_axis(attributes, inputs[0]);
  TensorType output = inputs[0];
  PARTRAIN_CHECK(output.shape[axis] % parts == 0, "dimension " << axis << " of " << shape_string(output.shape)
                                                                << " does not divide into " << parts << " parts");
  output.shape[axis] /= parts;
  return {output};
}

// Half the whole tensor (see the header comment): the whole tensor is the output of an all-gather
// and the input of a reduce-scatter or scatter.
std::pair<double, double> all_gather_bytes(std::span<const TensorType>, std::span<const TensorType> outputs) {
  return {bytes_of(outputs[0]) / 2, bytes_of(outputs[0]) / 2};
}
std::pair<double, double> reduce_scatter_bytes(std::span<const TensorType> inputs, std::span<const TensorType>) {
  return {bytes_of(inputs[0]) / 2, bytes_of(inputs[0]) / 2};
}
std::pair<double, double> scatter_bytes(std::span<const TensorType> inputs, std::span<const TensorType>) {
  return {0.0, bytes_of(inputs[0]) / 2};
}
std::pair<double, double> gather_bytes(std::span<const TensorType>, std::span<const TensorType> outputs) {
  return {bytes_of(outputs[0]) / 2, 0.0};
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
  // Sequence parallelism: every backward moves or copies the output gradient; nothing is saved.
  const std::pair<OpType, bool> sequence_ops[] = {{OpType::SequenceParallelAllGather, true},
                                                  {OpType::SequenceParallelReduceScatter, false},
                                                  {OpType::SequenceParallelScatter, false},
                                                  {OpType::SequenceParallelGather, true}};
  for (const auto& [op, gathers] : sequence_ops) {
    OpSchema schema{op, 1, 1, gathers ? infer_gathered : infer_scattered, zero_flops};
    schema.allreduce_bytes = op == OpType::SequenceParallelAllGather       ? all_gather_bytes
                             : op == OpType::SequenceParallelReduceScatter ? reduce_scatter_bytes
                             : op == OpType::SequenceParallelScatter       ? scatter_bytes
                                                                           : gather_bytes;
    schema.saved_inputs = schema.saved_outputs = 0u;
    schemas.push_back(schema);
  }
}

}  // namespace partrain
