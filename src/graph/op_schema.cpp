#include "graph/op_schema.h"

#include <array>
#include <string>

#include "core/error.h"

namespace partrain {

namespace {
struct SchemaTable {
  std::array<OpSchema, kOpTypeCount> by_type{};
  SchemaTable() {
    std::vector<OpSchema> schemas;
    add_gemm_schemas(schemas);
    add_elementwise_schemas(schemas);
    add_normalization_schemas(schemas);
    add_softmax_schemas(schemas);
    add_attention_schemas(schemas);
    add_shape_schemas(schemas);
    add_convolution_schemas(schemas);
    add_tensor_parallel_schemas(schemas);
    for (const OpSchema& schema : schemas) by_type[static_cast<std::size_t>(schema.type)] = schema;
  }
};
}  // namespace

const OpSchema& op_schema(OpType type) {
  static const SchemaTable table;
  const OpSchema& schema = table.by_type.at(static_cast<std::size_t>(type));
  PARTRAIN_CHECK(schema.infer != nullptr, "op " << op_name(type) << " has no schema");
  return schema;
}

std::vector<TensorType> infer_output_types(OpType type, const Attributes& attributes,
                                           std::span<const TensorType> inputs) {
  const OpSchema& schema = op_schema(type);
  const int count = static_cast<int>(inputs.size());
  PARTRAIN_CHECK(count >= schema.min_inputs && (schema.max_inputs < 0 || count <= schema.max_inputs),
                 op_name(type) << " takes " << schema.min_inputs
                               << (schema.max_inputs < 0 ? std::string(" or more")
                                                         : " to " + std::to_string(schema.max_inputs))
                               << " inputs, got " << count);
  return schema.infer(attributes, inputs);
}

double flops_one_per_output(const Attributes&, std::span<const TensorType>, std::span<const TensorType> outputs) {
  double total = 0;
  for (const TensorType& output : outputs) total += static_cast<double>(numel(output.shape));
  return total;
}

}  // namespace partrain
