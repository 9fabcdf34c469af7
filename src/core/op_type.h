#pragma once
// The operator set of partrain graphs (ONNX-like, operator granularity as in the RaNNC and
// Tarnawski et al. operator graphs). Semantics of each op: see its schema in graph/ops/<family>.cpp.
// In core/ because the Backend's kernel table (core/backend.h) is indexed by it.
#include <cstdint>
#include <string_view>

namespace partrain {

enum class OpType : std::uint8_t {
  // gemm.cpp
  MatMul, Gemm,
  // elementwise.cpp
  Add, Sub, Mul, Scale, Relu, Gelu, Tanh, Dropout,
  // normalization.cpp
  LayerNorm, BatchNorm2d,
  // softmax.cpp
  Softmax, SoftmaxCrossEntropy,
  // attention.cpp
  Attention,
  // shape.cpp (and embedding)
  Gather, Reshape, Permute, Slice, Concat, Split,
  // convolution.cpp
  Conv2d, MaxPool2d, GlobalAvgPool,
  // tensor_parallel.cpp (inserted by the tensor-parallel transformation, graph/tensor_parallel.h)
  TensorParallelCopy, TensorParallelAllReduce, VocabParallelEmbedding, VocabParallelCrossEntropy,
  // tensor_parallel.cpp: sequence parallelism (Korthikanti et al. 2022 §4.2.2)
  SequenceParallelAllGather, SequenceParallelReduceScatter, SequenceParallelScatter, SequenceParallelGather,
  Count  // number of op types, not an op
};

inline constexpr std::size_t kOpTypeCount = static_cast<std::size_t>(OpType::Count);

/// The op's name as written in plans, traces and error messages ("MatMul").
std::string_view op_name(OpType type);
/// Parses an op name; throws partrain::Error on an unknown name.
OpType parse_op_type(std::string_view name);

}  // namespace partrain
