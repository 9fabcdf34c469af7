// Op names. See op_type.h.
#include "core/op_type.h"

#include <array>

#include "core/error.h"

namespace partrain {

namespace {
constexpr std::array<std::string_view, kOpTypeCount> kOpNames = {
    "MatMul", "Gemm", "Add", "Sub", "Mul", "Scale", "Relu", "Gelu", "Tanh", "Dropout",
    "LayerNorm", "BatchNorm2d", "Softmax", "SoftmaxCrossEntropy", "Attention",
    "Gather", "Reshape", "Permute", "Slice", "Concat", "Split",
    "Conv2d", "MaxPool2d", "GlobalAvgPool",
    "TensorParallelCopy", "TensorParallelAllReduce", "VocabParallelEmbedding", "VocabParallelCrossEntropy",
    "SequenceParallelAllGather", "SequenceParallelReduceScatter", "SequenceParallelScatter", "SequenceParallelGather"};
}  // namespace

std::string_view op_name(OpType type) {
  const auto index = static_cast<std::size_t>(type);
  return index < kOpTypeCount ? kOpNames[index] : std::string_view("?");
}

OpType parse_op_type(std::string_view name) {
  for (std::size_t i = 0; i < kOpTypeCount; ++i)
    if (kOpNames[i] == name) return static_cast<OpType>(i);
  PARTRAIN_FAIL("unknown op '" << name << "'");
}

}  // namespace partrain
