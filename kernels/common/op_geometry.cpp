#include "kernels/common/op_geometry.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>

#include "core/error.h"

namespace partrain::kernels {

// ---------------- broadcasting ----------------
std::vector<std::int64_t> broadcast_strides(const Shape& shape, const Shape& output_shape) {
  std::vector<std::int64_t> strides(output_shape.size(), 0);
  const std::vector<std::int64_t> own = contiguous_strides(shape);
  const std::size_t shift = output_shape.size() - shape.size();
  for (std::size_t d = 0; d < shape.size(); ++d)
    strides[d + shift] = (shape[d] == 1 && output_shape[d + shift] != 1) ? 0 : own[d];
  return strides;
}

// ---------------- shape ops ----------------
std::int64_t dim_product(const Shape& shape, std::size_t begin, std::size_t end) {
  std::int64_t count = 1;
  for (std::size_t d = begin; d < end; ++d) count *= shape[d];
  return count;
}

std::string position_string(std::int64_t flat, const Shape& shape) {
  std::vector<std::int64_t> coordinates(shape.size());
  std::int64_t rest = flat;
  for (std::size_t d = shape.size(); d-- > 0;) {
    coordinates[d] = shape[d] > 0 ? rest % shape[d] : 0;
    rest = shape[d] > 0 ? rest / shape[d] : 0;
  }
  std::ostringstream out;
  out << '[';
  for (std::size_t d = 0; d < coordinates.size(); ++d) out << (d ? ", " : "") << coordinates[d];
  out << ']';
  return out.str();
}

void check_same_bytes(const char* op, const Tensor& a, const Tensor& b) {
  PARTRAIN_CHECK(a.dtype() == b.dtype() && a.numel() == b.numel(),
                 op << ": tensors " << shape_string(a.shape()) << " " << dtype_name(a.dtype()) << " and "
                    << shape_string(b.shape()) << " " << dtype_name(b.dtype()) << " do not match");
}

std::vector<int> permutation(const Attributes& attributes) {
  const std::vector<std::int64_t>& perm = attributes.get_ints("perm");
  return {perm.begin(), perm.end()};
}

std::vector<int> inverse_permutation(std::span<const int> perm) {
  std::vector<int> inverse(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i) inverse[perm[i]] = static_cast<int>(i);
  return inverse;
}

MergedPermutation merge_permutation(const Shape& in_shape, std::span<const int> perm) {
  // Drop size-1 input axes, then merge output axes that are consecutive in the input.
  std::vector<int> renumber(in_shape.size(), -1);
  Shape kept_shape;
  for (std::size_t d = 0; d < in_shape.size(); ++d)
    if (in_shape[d] != 1) {
      renumber[d] = static_cast<int>(kept_shape.size());
      kept_shape.push_back(in_shape[d]);
    }
  std::vector<int> kept_perm;
  for (int p : perm)
    if (renumber[p] >= 0) kept_perm.push_back(renumber[p]);
  // Groups of input axes in output order; each group is a run of consecutive input axes.
  std::vector<std::pair<int, int>> groups;  // [first, last] input axis
  for (int p : kept_perm) {
    if (!groups.empty() && groups.back().second + 1 == p) groups.back().second = p;
    else groups.emplace_back(p, p);
  }
  const std::size_t rank = groups.size();
  // Merged input shape (groups sorted by first axis) and its strides.
  MergedPermutation merged;
  merged.order.resize(rank);
  for (std::size_t g = 0; g < rank; ++g) merged.order[g] = static_cast<int>(g);
  std::sort(merged.order.begin(), merged.order.end(),
            [&](int a, int b) { return groups[a].first < groups[b].first; });
  merged.size.resize(rank);
  merged.in_stride.resize(rank);
  std::int64_t stride = 1;
  for (std::size_t k = rank; k-- > 0;) {
    const int g = merged.order[k];
    const auto& [first, last] = groups[g];
    merged.size[g] = dim_product(kept_shape, first, last + 1);
    merged.in_stride[g] = stride;
    stride *= merged.size[g];
  }
  return merged;
}

SliceLayout slice_layout(const Attributes& attributes, const Shape& whole, const Shape& part) {
  const int axis = normalise_axis(attributes.get_int("axis"), whole.size());
  SliceLayout layout;
  layout.dim = whole[axis];
  layout.length = part[axis];
  layout.outer = dim_product(whole, 0, axis);
  layout.inner = dim_product(whole, axis + 1, whole.size());
  layout.step = attributes.get_int("step", 1);
  const std::int64_t start = attributes.get_int("start", 0);
  layout.start = std::clamp(start < 0 ? start + layout.dim : start, std::int64_t{0}, layout.dim);
  PARTRAIN_CHECK(layout.length == 0 || layout.start + (layout.length - 1) * layout.step < layout.dim,
                 "Slice: output " << shape_string(part) << " does not fit input " << shape_string(whole));
  return layout;
}

ConcatLayout concat_layout(const Tensor& whole, std::span<const Tensor> layouts, std::span<const Tensor> parts,
                           std::int64_t axis_attribute) {
  const Shape& shape = whole.shape();
  ConcatLayout layout;
  const int axis = normalise_axis(axis_attribute, shape.size());
  layout.axis = axis;
  layout.outer = dim_product(shape, 0, axis);
  layout.inner = dim_product(shape, axis + 1, shape.size());
  const auto element = static_cast<std::int64_t>(dtype_size(whole.dtype()));
  layout.whole_row = shape[axis] * layout.inner * element;
  PARTRAIN_CHECK(layouts.size() == parts.size(), "Concat/Split: " << parts.size() << " parts, " << layouts.size() << " layouts");
  layout.part_row.resize(parts.size());
  layout.part_offset.resize(parts.size());
  std::int64_t offset = 0;
  for (std::size_t k = 0; k < parts.size(); ++k) {
    const Shape& part_shape = layouts[k].shape();
    bool fits = part_shape.size() == shape.size();
    for (std::size_t d = 0; fits && d < shape.size(); ++d) fits = static_cast<int>(d) == axis || part_shape[d] == shape[d];
    PARTRAIN_CHECK(fits, "Concat/Split: part " << k << " " << shape_string(part_shape) << " does not fit "
                                               << shape_string(shape) << " along axis " << axis);
    if (parts[k].defined()) check_same_bytes("Concat/Split", parts[k], layouts[k]);
    PARTRAIN_CHECK(!parts[k].defined() || parts[k].dtype() == whole.dtype(), "Concat/Split: part " << k << " has dtype "
                                                                                << dtype_name(parts[k].dtype()));
    layout.part_row[k] = part_shape[axis] * layout.inner * element;
    layout.part_offset[k] = offset;
    offset += layout.part_row[k];
  }
  PARTRAIN_CHECK(offset == layout.whole_row,
                 "Concat/Split: parts do not add up to " << shape_string(shape) << " along axis " << axis);
  return layout;
}

// ---------------- gemm ops ----------------
MatMulDims matmul_dims(const Attributes& attributes, const Shape& sa, const Shape& sb) {
  MatMulDims dims;
  dims.trans_a = attributes.get_int("trans_a", 0) == 1;
  dims.trans_b = attributes.get_int("trans_b", 0) == 1;
  dims.alpha = static_cast<float>(attributes.get_float("alpha", 1.0));
  const std::size_t ra = sa.size();
  const std::size_t rb = sb.size();
  for (std::size_t i = 0; i + 2 < ra; ++i) dims.batch *= sa[i];
  dims.m = dims.trans_a ? sa[ra - 1] : sa[ra - 2];
  dims.k = dims.trans_a ? sa[ra - 2] : sa[ra - 1];
  dims.n = dims.trans_b ? sb[rb - 2] : sb[rb - 1];
  dims.shared_b = rb == 2;
  return dims;
}

GemmDims gemm_dims(const Attributes& attributes, const Tensor& x, const Tensor& w) {
  GemmDims dims;
  dims.trans_b = attributes.get_int("trans_b", 1) == 1;
  dims.k = x.shape().back();
  dims.rows = 1;
  for (std::size_t i = 0; i + 1 < x.rank(); ++i) dims.rows *= x.shape()[i];
  dims.n = dims.trans_b ? w.dim(0) : w.dim(1);
  return dims;
}

// ---------------- attention ----------------
AttentionShape attention_shape(const Attributes& attributes, std::span<const Tensor> inputs) {
  AttentionShape shape;
  const Tensor& q = inputs[0];
  shape.batch = q.dim(0);
  shape.heads = q.dim(1);
  shape.s = q.dim(2);
  shape.d = q.dim(3);
  shape.t = inputs[1].dim(2);
  shape.dv = inputs[2].dim(3);
  shape.causal = attributes.get_int("causal", 0) == 1;
  const double default_scale = shape.d > 0 ? 1.0 / std::sqrt(static_cast<double>(shape.d)) : 1.0;
  shape.scale = static_cast<float>(attributes.get_float("scale", default_scale));
  return shape;
}

// ---------------- convolution ops ----------------
std::vector<std::int64_t> pair_attribute(const Attributes& attributes, const std::string& name,
                                         std::vector<std::int64_t> fallback) {
  std::vector<std::int64_t> values = attributes.get_ints(name, std::move(fallback));
  PARTRAIN_CHECK(values.size() == 2, name << " must have 2 values, got " << values.size());
  return values;
}

ConvGeometry conv_geometry(const Attributes& attributes, const Tensor& x, const Tensor& w, const Tensor& y) {
  const auto stride = pair_attribute(attributes, "stride", {1, 1});
  const auto padding = pair_attribute(attributes, "padding", {0, 0});
  const auto dilation = pair_attribute(attributes, "dilation", {1, 1});
  ConvGeometry g{x.dim(0), x.dim(1),  x.dim(2),   x.dim(3),   w.dim(0),    y.dim(2),    y.dim(3),   w.dim(2),
                 w.dim(3), stride[0], stride[1], padding[0], padding[1], dilation[0], dilation[1],
                 attributes.get_int("groups", 1)};
  PARTRAIN_CHECK(x.rank() == 4 && w.rank() == 4 && y.rank() == 4 && g.groups >= 1 && g.channels % g.groups == 0 &&
                     w.dim(1) * g.groups == g.channels && y.dim(1) == g.out_channels && y.dim(0) == g.batch,
                 "Conv2d kernel got input " << shape_string(x.shape()) << ", weight " << shape_string(w.shape())
                                            << ", output " << shape_string(y.shape()) << ", groups " << g.groups);
  return g;
}

PoolGeometry pool_geometry(const Attributes& attributes, const Tensor& x, const Tensor& y) {
  const auto kernel = pair_attribute(attributes, "kernel", {});
  const auto stride = pair_attribute(attributes, "stride", kernel);
  const auto padding = pair_attribute(attributes, "padding", {0, 0});
  PARTRAIN_CHECK(x.rank() == 4 && y.rank() == 4 && x.dim(0) == y.dim(0) && x.dim(1) == y.dim(1),
                 "MaxPool2d kernel got input " << shape_string(x.shape()) << ", output " << shape_string(y.shape()));
  return {x.dim(0) * x.dim(1), x.dim(2),  x.dim(3),  y.dim(2),   y.dim(3),  kernel[0],
          kernel[1],           stride[0], stride[1], padding[0], padding[1]};
}

// ---------------- softmax ops ----------------
CrossEntropyShape cross_entropy_shape(const Attributes& attributes, const Tensor& logits, const Tensor& labels) {
  CrossEntropyShape shape;
  shape.classes = logits.dim(-1);
  shape.rows = labels.numel();
  shape.ignore_index = attributes.get_int("ignore_index", -100);
  return shape;
}

std::uint64_t dropout_first_element(const KernelContext& context, std::int64_t part_elements_per_sample) {
  if (context.attributes.get_int("tensor_parallel_split", 0) == 0) return 0;
  PARTRAIN_CHECK(context.tensor_parallel != nullptr, "Dropout of a tensor-parallel part ran without a tensor-parallel group");
  return static_cast<std::uint64_t>(context.tensor_parallel->rank()) * static_cast<std::uint64_t>(part_elements_per_sample);
}

VocabularyPart vocabulary_part(const Attributes& attributes, std::int64_t rows, int rank, int parts, const char* op) {
  VocabularyPart part;
  part.rows = rows;
  part.first = rows * rank;
  part.vocabulary = attributes.get_int("vocab_size", rows * parts);
  PARTRAIN_CHECK(part.vocabulary >= 1 && part.vocabulary <= rows * parts,
                 op << ": vocab_size " << part.vocabulary << " is outside [1, " << rows * parts << "] (" << rows
                    << " rows on each of " << parts << " ranks)");
  part.real = std::clamp(part.vocabulary - part.first, std::int64_t{0}, rows);
  return part;
}

SequenceSplit sequence_split(const KernelContext& context, const Tensor& part, const Tensor& whole, const char* op) {
  PARTRAIN_CHECK(context.tensor_parallel != nullptr,
                 op << " ran without a tensor-parallel group (a graph transformed for t > 1 on one rank?)");
  SequenceSplit split;
  split.parts = context.tensor_parallel->size();
  split.rank = context.tensor_parallel->rank();
  const std::int64_t parts = context.attributes.get_int("parts");
  PARTRAIN_CHECK(parts == split.parts, op << " was made for " << parts << " ranks but runs in a tensor-parallel group of "
                                          << split.parts);
  const std::int64_t axis = context.attributes.get_int("axis", 1);
  const Shape& part_shape = part.shape();
  PARTRAIN_CHECK(axis >= 0 && static_cast<std::size_t>(axis) < part_shape.size(),
                 op << ": axis " << axis << " is not a dimension of " << shape_string(part_shape));
  Shape expected = part_shape;
  expected[static_cast<std::size_t>(axis)] *= split.parts;
  PARTRAIN_CHECK(whole.shape() == expected, op << ": the whole tensor " << shape_string(whole.shape()) << " is not "
                                               << split.parts << " parts " << shape_string(part_shape) << " along dimension "
                                               << axis);
  PARTRAIN_CHECK(part.dtype() == whole.dtype(), op << ": dtypes " << dtype_name(part.dtype()) << " and "
                                                   << dtype_name(whole.dtype()) << " differ");
  split.outer = dim_product(part_shape, 0, static_cast<std::size_t>(axis));
  split.chunk = split.outer == 0 ? 0 : part.numel() / split.outer;
  return split;
}

}  // namespace partrain::kernels
