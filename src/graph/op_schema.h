#pragma once
// Graph-level description of each op: arity, shape/dtype inference, FLOPs and which inputs carry
// gradients. Kernels (how an op runs on a device) live in kernels/<backend>/, not here.
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"
#include "core/attributes.h"
#include "core/op_type.h"

namespace partrain {

/// Shape and dtype of a value. Shapes may hold kBatch (graph level) or be concrete (run time).
struct TensorType {
  Shape shape;
  DType dtype = DType::F32;
  bool operator==(const TensorType&) const = default;
  /// Bytes of a tensor of this type with the batch dimension (kBatch) set to `batch`.
  std::int64_t bytes(std::int64_t batch) const {
    return numel(with_batch(shape, batch)) * static_cast<std::int64_t>(dtype_size(dtype));
  }
};

struct OpSchema {
  OpType type = OpType::Count;
  /// Inclusive arity bounds (max_inputs = -1: variadic).
  int min_inputs = 1;
  int max_inputs = 1;
  /// Output types from input types. Throws partrain::Error describing the mismatch; the caller
  /// (Graph) adds the task name. Works on symbolic (kBatch) and concrete shapes alike.
  std::vector<TensorType> (*infer)(const Attributes& attributes, std::span<const TensorType> inputs) = nullptr;
  /// Forward floating-point operations (a multiply-add counts 2) for concrete types.
  double (*flops)(const Attributes& attributes, std::span<const TensorType> inputs,
                  std::span<const TensorType> outputs) = nullptr;
  /// Bit i set: input i can receive a gradient (clear for indices, labels, masks, running stats).
  std::uint32_t differentiable_inputs = ~0u;
  /// Communication ops of tensor-parallel graphs: bytes all-reduced over the tensor-parallel group
  /// in the forward and in the backward pass, for concrete types (nullptr: none). An all-gather or
  /// reduce-scatter of a whole tensor of W bytes (sequence parallelism) counts as the all-reduce
  /// that moves as much per rank, W/2.
  std::pair<double, double> (*allreduce_bytes)(std::span<const TensorType> inputs,
                                               std::span<const TensorType> outputs) = nullptr;
  /// The saved tensors of the op (Korthikanti et al. 2022 §4, "activation memory"): bit i set when
  /// the backward kernel reads the data of input i (saved_inputs) or output i (saved_outputs). Of
  /// the others the backward uses the shape and dtype only, so the runtime frees them after the
  /// forward pass (graph/saved_tensors.h) and the analytic memory model does not count them. Both
  /// CPU and CUDA kernels must read no more than declared (the runtime hands them shape-only
  /// tensors, whose data() throws). Default: everything (an op without a declaration keeps all).
  std::uint32_t saved_inputs = ~0u;
  std::uint32_t saved_outputs = ~0u;

  bool input_is_differentiable(std::size_t index) const {
    return index < 32 && ((differentiable_inputs >> index) & 1u);
  }
  /// True when the backward kernel reads the data of input `index` (indices >= 32: true).
  bool input_is_saved(std::size_t index) const { return index >= 32 || ((saved_inputs >> index) & 1u); }
  /// True when the backward kernel reads the data of output `index` (indices >= 32: true).
  bool output_is_saved(std::size_t index) const { return index >= 32 || ((saved_outputs >> index) & 1u); }
};

/// The schema of an op; every OpType has one.
const OpSchema& op_schema(OpType type);

/// Runs the schema's inference, after checking arity. Throws partrain::Error.
std::vector<TensorType> infer_output_types(OpType type, const Attributes& attributes,
                                           std::span<const TensorType> inputs);

// Each family file in graph/ops/ appends its schemas (called once by op_schema.cpp).
void add_gemm_schemas(std::vector<OpSchema>& schemas);
void add_elementwise_schemas(std::vector<OpSchema>& schemas);
void add_normalization_schemas(std::vector<OpSchema>& schemas);
void add_softmax_schemas(std::vector<OpSchema>& schemas);
void add_attention_schemas(std::vector<OpSchema>& schemas);
void add_shape_schemas(std::vector<OpSchema>& schemas);
void add_convolution_schemas(std::vector<OpSchema>& schemas);
void add_tensor_parallel_schemas(std::vector<OpSchema>& schemas);

/// Elementwise FLOPs: one per output element (shared by many schemas).
double flops_one_per_output(const Attributes&, std::span<const TensorType>, std::span<const TensorType> outputs);

}  // namespace partrain
