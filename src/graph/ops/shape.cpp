// Schemas of the shape ops (pure data movement, plus the embedding lookup). None does arithmetic:
// their FLOPs are 0. All but Gather accept any dtype (kernels copy bytes); the output has the
// input's dtype. B below is the symbolic batch dimension kBatch.
//   Gather: (weight [V, H], indices [...] i32|i64) -> [..., H]     out[p, :] = weight[indices[p], :]
//           an index outside [0, V) is an error at run time; indices get no gradient.
//   Reshape: x -> y                       attribute shape (int list), ONNX semantics: 0 copies the
//           input dimension at that position, -1 is inferred (at most one). A symbolic batch
//           dimension of x must be kept by a 0 at its position ([B, S, 768] with [0, 0, 12, 64]
//           gives [B, S, 12, 64]); -1 is then inferred from the non-batch dimensions.
//   Permute: x -> y                       attribute perm (int list, a permutation of 0..rank-1):
//           y.shape[i] = x.shape[perm[i]] (ONNX Transpose).
//   Slice: x -> y                         attributes axis, start, end, step (default 1, >= 1):
//           x[..., start:end:step, ...] along axis with Python semantics (negative start/end count
//           from the end, then clamped to [0, dim]). start defaults to 0 and end to the end.
//           The axis may not be the symbolic batch dimension.
//   Concat: (x_0, ..., x_{n-1}) -> y      attribute axis; every other dimension must match; the
//           axis may not be symbolic in any input.
//   Split: x -> (y_0, ..., y_{k-1})       attributes axis, sizes (int list, entries >= 0, summing
//           to x.shape[axis], which may not be symbolic); y_i has sizes[i] along axis.
#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>

#include "core/error.h"
#include "graph/op_schema.h"

namespace partrain {

namespace {
std::string list_string(const std::vector<std::int64_t>& values) {
  std::ostringstream out;
  out << '[';
  for (std::size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << values[i];
  out << ']';
  return out.str();
}

double zero_flops(const Attributes&, std::span<const TensorType>, std::span<const TensorType>) { return 0; }

// ---------------- Gather ----------------
std::vector<TensorType> infer_gather(const Attributes&, std::span<const TensorType> inputs) {
  const TensorType& weight = inputs[0];
  const TensorType& indices = inputs[1];
  PARTRAIN_CHECK(weight.shape.size() == 2, "Gather weight must be [V, H], got " << shape_string(weight.shape));
  PARTRAIN_CHECK(!has_batch_dim(weight.shape) && weight.shape[0] >= 0 && weight.shape[1] >= 0,
                 "Gather weight must have a concrete shape, got " << shape_string(weight.shape));
  PARTRAIN_CHECK(is_floating(weight.dtype), "Gather weight must be floating point, got " << dtype_name(weight.dtype));
  PARTRAIN_CHECK(indices.dtype == DType::I32 || indices.dtype == DType::I64,
                 "Gather indices must be i32 or i64, got " << dtype_name(indices.dtype));
  Shape shape = indices.shape;
  shape.push_back(weight.shape[1]);
  return {{shape, weight.dtype}};
}

// ---------------- Reshape ----------------
std::vector<TensorType> infer_reshape(const Attributes& attributes, std::span<const TensorType> inputs) {
  const Shape& input = inputs[0].shape;
  const std::vector<std::int64_t>& target = attributes.get_ints("shape");
  const auto describe = [&] {
    return "Reshape of " + shape_string(input) + " with shape " + list_string(target) + ": ";
  };
  Shape output(target.size());
  int inferred = -1;
  for (std::size_t i = 0; i < target.size(); ++i) {
    const std::int64_t t = target[i];
    if (t == 0) {
      PARTRAIN_CHECK(i < input.size(), describe() << "entry " << i << " is 0 (copy the input dimension) but the input has rank "
                                                  << input.size());
      output[i] = input[i];
    } else if (t == -1) {
      PARTRAIN_CHECK(inferred < 0, describe() << "at most one entry may be -1 (inferred)");
      inferred = static_cast<int>(i);
    } else {
      PARTRAIN_CHECK(t > 0, describe() << "entry " << i << " is " << t << "; entries must be > 0, 0 (copy) or -1 (infer)");
      output[i] = t;
    }
  }
  // Each symbolic batch dimension maps to itself, so only the non-batch dimensions must agree.
  for (std::size_t j = 0; j < input.size(); ++j)
    PARTRAIN_CHECK(input[j] != kBatch || (j < target.size() && target[j] == 0),
                   describe() << "the symbolic batch dimension at position " << j
                              << " must be kept by a 0 at that position of shape (it cannot be merged, split or inferred)");
  std::int64_t input_count = 1;
  for (std::int64_t d : input)
    if (d != kBatch) {
      PARTRAIN_CHECK(d >= 0, describe() << "the input has a negative dimension");
      input_count *= d;
    }
  std::int64_t output_count = 1;
  for (std::size_t i = 0; i < output.size(); ++i)
    if (static_cast<int>(i) != inferred && output[i] != kBatch) output_count *= output[i];
  if (inferred >= 0) {
    PARTRAIN_CHECK(output_count > 0, describe() << "cannot infer the -1 entry next to zero-size dimensions");
    PARTRAIN_CHECK(input_count % output_count == 0,
                   describe() << input_count << " (non-batch) elements do not divide into blocks of " << output_count);
    output[inferred] = input_count / output_count;
  } else {
    PARTRAIN_CHECK(input_count == output_count, describe() << "the element counts differ (" << input_count << " and "
                                                           << output_count << ", batch dimensions excluded)");
  }
  return {{output, inputs[0].dtype}};
}

// ---------------- Permute ----------------
std::vector<TensorType> infer_permute(const Attributes& attributes, std::span<const TensorType> inputs) {
  const Shape& input = inputs[0].shape;
  const std::vector<std::int64_t>& perm = attributes.get_ints("perm");
  PARTRAIN_CHECK(perm.size() == input.size(), "Permute perm " << list_string(perm) << " has " << perm.size()
                                                              << " entries for an input of rank " << input.size() << " "
                                                              << shape_string(input));
  std::vector<bool> seen(input.size(), false);
  Shape output(input.size());
  for (std::size_t i = 0; i < perm.size(); ++i) {
    const std::int64_t p = perm[i];
    PARTRAIN_CHECK(p >= 0 && p < static_cast<std::int64_t>(input.size()) && !seen[p],
                   "Permute perm " << list_string(perm) << " is not a permutation of 0.." << input.size() - 1);
    seen[p] = true;
    output[i] = input[p];
  }
  return {{output, inputs[0].dtype}};
}

// ---------------- Slice ----------------
std::vector<TensorType> infer_slice(const Attributes& attributes, std::span<const TensorType> inputs) {
  const Shape& input = inputs[0].shape;
  const std::int64_t axis_attribute = attributes.get_int("axis");
  PARTRAIN_CHECK(!input.empty(), "Slice of a rank-0 input");
  const int axis = normalise_axis(axis_attribute, input.size());
  const std::int64_t dim = input[axis];
  PARTRAIN_CHECK(dim != kBatch, "Slice along axis " << axis_attribute << " of " << shape_string(input)
                                                    << ": the symbolic batch dimension cannot be sliced");
  const std::int64_t step = attributes.get_int("step", 1);
  PARTRAIN_CHECK(step >= 1, "Slice step must be >= 1, got " << step);
  const auto resolve = [dim](std::int64_t index) { return std::clamp(index < 0 ? index + dim : index, std::int64_t{0}, dim); };
  const std::int64_t start = resolve(attributes.get_int("start", 0));
  const std::int64_t end = resolve(attributes.get_int("end", dim));
  Shape output = input;
  output[axis] = end > start ? (end - start + step - 1) / step : 0;
  return {{output, inputs[0].dtype}};
}

// ---------------- Concat ----------------
std::vector<TensorType> infer_concat(const Attributes& attributes, std::span<const TensorType> inputs) {
  const Shape& first = inputs[0].shape;
  const std::int64_t axis_attribute = attributes.get_int("axis");
  PARTRAIN_CHECK(!first.empty(), "Concat of rank-0 inputs");
  const int axis = normalise_axis(axis_attribute, first.size());
  Shape output = first;
  output[axis] = 0;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    const Shape& shape = inputs[k].shape;
    PARTRAIN_CHECK(inputs[k].dtype == inputs[0].dtype, "Concat input " << k << " has dtype " << dtype_name(inputs[k].dtype)
                                                                       << ", input 0 has " << dtype_name(inputs[0].dtype));
    PARTRAIN_CHECK(shape.size() == first.size(), "Concat input " << k << " " << shape_string(shape) << " has rank "
                                                                 << shape.size() << ", input 0 " << shape_string(first)
                                                                 << " has rank " << first.size());
    for (std::size_t d = 0; d < shape.size(); ++d)
      PARTRAIN_CHECK(static_cast<int>(d) == axis || shape[d] == first[d],
                     "Concat along axis " << axis << ": input " << k << " " << shape_string(shape) << " and input 0 "
                                          << shape_string(first) << " differ in dimension " << d);
    PARTRAIN_CHECK(shape[axis] != kBatch, "Concat along axis " << axis << ": input " << k << " " << shape_string(shape)
                                                              << " has the symbolic batch dimension there");
    output[axis] += shape[axis];
  }
  return {{output, inputs[0].dtype}};
}

// ---------------- Split ----------------
std::vector<TensorType> infer_split(const Attributes& attributes, std::span<const TensorType> inputs) {
  const Shape& input = inputs[0].shape;
  const std::int64_t axis_attribute = attributes.get_int("axis");
  const std::vector<std::int64_t>& sizes = attributes.get_ints("sizes");
  PARTRAIN_CHECK(!input.empty(), "Split of a rank-0 input");
  const int axis = normalise_axis(axis_attribute, input.size());
  PARTRAIN_CHECK(input[axis] != kBatch, "Split along axis " << axis_attribute << " of " << shape_string(input)
                                                            << ": the symbolic batch dimension cannot be split");
  PARTRAIN_CHECK(!sizes.empty(), "Split sizes must not be empty");
  std::int64_t total = 0;
  std::vector<TensorType> outputs;
  for (std::int64_t size : sizes) {
    PARTRAIN_CHECK(size >= 0, "Split sizes " << list_string(sizes) << " has a negative entry");
    total += size;
    Shape shape = input;
    shape[axis] = size;
    outputs.push_back({shape, inputs[0].dtype});
  }
  PARTRAIN_CHECK(total == input[axis], "Split sizes " << list_string(sizes) << " sum to " << total << " but dimension "
                                                      << axis << " of " << shape_string(input) << " is " << input[axis]);
  return outputs;
}
}  // namespace

void add_shape_schemas(std::vector<OpSchema>& schemas) {
  // Saved tensors: Gather reads its indices (the table's gradient is scattered by them; of the table
  // only the shape); the data-movement ops read nothing (their backward moves dy by shapes alone).
  schemas.push_back({OpType::Gather, 2, 2, infer_gather, zero_flops, 0b01u});
  schemas.back().saved_inputs = 0b10u;
  schemas.back().saved_outputs = 0u;
  schemas.push_back({OpType::Reshape, 1, 1, infer_reshape, zero_flops});
  schemas.push_back({OpType::Permute, 1, 1, infer_permute, zero_flops});
  schemas.push_back({OpType::Slice, 1, 1, infer_slice, zero_flops});
  schemas.push_back({OpType::Concat, 1, -1, infer_concat, zero_flops});
  schemas.push_back({OpType::Split, 1, 1, infer_split, zero_flops});
  for (auto schema = schemas.end() - 5; schema != schemas.end(); ++schema) schema->saved_inputs = schema->saved_outputs = 0u;
}

}  // namespace partrain
