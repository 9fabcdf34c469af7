// CPU kernels of the shape ops (schemas and semantics: src/graph/ops/shape.cpp).
// Reshape, Permute, Slice, Concat and Split move bytes, so they work for every dtype (gradients
// included); Gather copies rows of any floating dtype and scatter-adds f32 gradients.
#include <algorithm>
#include <cstring>

#include "kernels/common/op_geometry.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"

namespace partrain {

namespace {
using cpu::kParallelThreshold;
using kernels::check_same_bytes;
using kernels::permutation;

// Large copies are split into this many bytes per OpenMP chunk.
constexpr std::size_t kCopyChunkBytes = std::size_t{1} << 16;
constexpr std::size_t kParallelBytes = static_cast<std::size_t>(kParallelThreshold) * 4;

char* bytes_of(const Tensor& tensor) { return static_cast<char*>(tensor.raw_data()); }

void copy_bytes(char* destination, const char* source, std::size_t bytes) {
  if (bytes > 0) std::memcpy(destination, source, bytes);
}

// destination = source (same byte count), in parallel chunks when large.
void parallel_copy(char* destination, const char* source, std::size_t bytes) {
  if (bytes < kParallelBytes) {
    copy_bytes(destination, source, bytes);
    return;
  }
  const auto chunks = static_cast<std::int64_t>((bytes + kCopyChunkBytes - 1) / kCopyChunkBytes);
#pragma omp parallel for schedule(static)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::size_t begin = static_cast<std::size_t>(c) * kCopyChunkBytes;
    copy_bytes(destination + begin, source + begin, std::min(kCopyChunkBytes, bytes - begin));
  }
}

void parallel_zero(const Tensor& tensor) {
  char* data = bytes_of(tensor);
  const std::size_t bytes = tensor.nbytes();
  if (bytes < kParallelBytes) {
    if (bytes > 0) std::memset(data, 0, bytes);
    return;
  }
  const auto chunks = static_cast<std::int64_t>((bytes + kCopyChunkBytes - 1) / kCopyChunkBytes);
#pragma omp parallel for schedule(static)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::size_t begin = static_cast<std::size_t>(c) * kCopyChunkBytes;
    std::memset(data + begin, 0, std::min(kCopyChunkBytes, bytes - begin));
  }
}

// ---------------- Gather (embedding lookup) ----------------
void check_indices(const Tensor& indices, std::int64_t vocabulary) {
  const std::int64_t n = indices.numel();
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t index = cpu::index_at(indices, i);
    PARTRAIN_CHECK(index >= 0 && index < vocabulary,
                   "Gather index " << index << " at position " << kernels::position_string(i, indices.shape()) << " (flat " << i
                                   << ") of indices " << shape_string(indices.shape()) << " is out of range [0, "
                                   << vocabulary << ")");
  }
}

void gather_forward(const KernelContext&, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  const Tensor& weight = inputs[0];
  const Tensor& indices = inputs[1];
  const Tensor& y = outputs[0];
  check_indices(indices, weight.dim(0));
  const std::int64_t n = indices.numel();
  const std::size_t row_bytes = static_cast<std::size_t>(weight.dim(1)) * dtype_size(weight.dtype());
  const char* table = bytes_of(weight);
  char* out = bytes_of(y);
#pragma omp parallel for schedule(static) if (y.numel() > kParallelThreshold)
  for (std::int64_t i = 0; i < n; ++i)
    copy_bytes(out + i * row_bytes, table + cpu::index_at(indices, i) * row_bytes, row_bytes);
}

// dweight[v, :] = sum over positions p with indices[p] == v of dy[p, :]. Threads own disjoint column
// blocks and add positions in order, so repeated indices are race-free and the result does not
// depend on the thread count.
void gather_backward(const KernelContext&, std::span<const Tensor> inputs, std::span<const Tensor>,
                     std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  const Tensor& dweight = input_grads[0];
  if (!dweight.defined()) return;
  const Tensor& indices = inputs[1];
  PARTRAIN_CHECK(dweight.dtype() == DType::F32 && output_grads[0].dtype() == DType::F32,
                 "Gather backward supports f32 gradients only, got " << dtype_name(dweight.dtype()));
  check_indices(indices, dweight.dim(0));
  parallel_zero(dweight);
  const std::int64_t n = indices.numel();
  const std::int64_t hidden = dweight.dim(1);
  const float* dy = output_grads[0].data<float>();
  float* dw = dweight.data<float>();
  constexpr std::int64_t kBlock = 64;  // columns per task: whole cache lines, no false sharing
  const std::int64_t blocks = (hidden + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (blocks > 1 && n * hidden > kParallelThreshold)
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t begin = b * kBlock;
    const std::int64_t end = std::min(hidden, begin + kBlock);
    for (std::int64_t i = 0; i < n; ++i) {
      float* row = dw + cpu::index_at(indices, i) * hidden;
      const float* source = dy + i * hidden;
      for (std::int64_t h = begin; h < end; ++h) row[h] += source[h];
    }
  }
}

// ---------------- Reshape ----------------
void reshape_forward(const KernelContext&, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  check_same_bytes("Reshape", inputs[0], outputs[0]);
  parallel_copy(bytes_of(outputs[0]), bytes_of(inputs[0]), inputs[0].nbytes());
}

void reshape_backward(const KernelContext&, std::span<const Tensor>, std::span<const Tensor>,
                      std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  if (!input_grads[0].defined()) return;
  check_same_bytes("Reshape backward", input_grads[0], output_grads[0]);
  parallel_copy(bytes_of(input_grads[0]), bytes_of(output_grads[0]), output_grads[0].nbytes());
}

// ---------------- Permute ----------------
// Copies a row of `count` elements gathered with `stride` (in elements) from `source`.
template <typename Element>
void strided_row(char* destination, const char* source, std::int64_t count, std::int64_t stride) {
  Element* out = reinterpret_cast<Element*>(destination);
  const Element* in = reinterpret_cast<const Element*>(source);
  for (std::int64_t j = 0; j < count; ++j) out[j] = in[j * stride];
}

// destination[i_0, ..., i_{r-1}] = source[...] with destination.shape[k] = source.shape[perm[k]].
void permute_copy(const Tensor& source, const Tensor& destination, const std::vector<int>& perm) {
  check_same_bytes("Permute", source, destination);
  const Shape& in_shape = source.shape();
  PARTRAIN_CHECK(perm.size() == in_shape.size(), "Permute: perm of size " << perm.size() << " for rank " << in_shape.size());
  const std::size_t element = dtype_size(source.dtype());
  if (source.numel() == 0) return;

  // Reduce: drop size-1 input axes, then merge output axes that are consecutive in the input.
  const kernels::MergedPermutation merged = kernels::merge_permutation(in_shape, perm);
  const std::size_t rank = merged.rank();
  if (rank <= 1) {  // the permutation does not move any data
    parallel_copy(bytes_of(destination), bytes_of(source), source.nbytes());
    return;
  }
  // Output axis g has size group_size[g] and input stride group_stride[g] (elements).
  const std::vector<std::int64_t>& group_size = merged.size;
  const std::vector<std::int64_t>& group_stride = merged.in_stride;
  const std::int64_t inner = group_size[rank - 1];
  const std::int64_t inner_stride = group_stride[rank - 1];
  const std::int64_t rows = source.numel() / inner;
  const char* in = bytes_of(source);
  char* out = bytes_of(destination);
  const std::size_t row_bytes = static_cast<std::size_t>(inner) * element;
#pragma omp parallel for schedule(static) if (source.numel() > kParallelThreshold)
  for (std::int64_t row = 0; row < rows; ++row) {
    std::int64_t rest = row, offset = 0;
    for (std::size_t g = rank - 1; g-- > 0;) {
      offset += (rest % group_size[g]) * group_stride[g];
      rest /= group_size[g];
    }
    char* target = out + row * row_bytes;
    const char* origin = in + offset * static_cast<std::int64_t>(element);
    if (inner_stride == 1) {
      copy_bytes(target, origin, row_bytes);
      continue;
    }
    switch (element) {
      case 1: strided_row<std::uint8_t>(target, origin, inner, inner_stride); break;
      case 2: strided_row<std::uint16_t>(target, origin, inner, inner_stride); break;
      case 4: strided_row<std::uint32_t>(target, origin, inner, inner_stride); break;
      default: strided_row<std::uint64_t>(target, origin, inner, inner_stride); break;
    }
  }
}

void permute_forward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  permute_copy(inputs[0], outputs[0], permutation(context.attributes));
}

void permute_backward(const KernelContext& context, std::span<const Tensor>, std::span<const Tensor>,
                      std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  if (!input_grads[0].defined()) return;
  const std::vector<int> perm = permutation(context.attributes);
  permute_copy(output_grads[0], input_grads[0], kernels::inverse_permutation(perm));
}

// ---------------- Slice ----------------
using kernels::SliceLayout;
using kernels::slice_layout;

// The strided copy of a slice (layout: kernels::SliceLayout). into_part: whole -> part, else part -> whole.
void slice_copy(const SliceLayout& layout, std::size_t element, char* whole, char* part, bool into_part) {
  const std::int64_t rows = layout.outer * layout.length;
  if (rows == 0 || layout.inner == 0) return;
  // Contiguous runs: a whole [length, inner] block per outer index when step == 1, else one row.
  const bool blocks = layout.step == 1;
  const std::int64_t count = blocks ? layout.outer : rows;
  const std::size_t run = static_cast<std::size_t>(layout.inner * (blocks ? layout.length : 1)) * element;
  const std::size_t row_bytes = static_cast<std::size_t>(layout.inner) * element;
#pragma omp parallel for schedule(static) if (rows * layout.inner > kParallelThreshold)
  for (std::int64_t c = 0; c < count; ++c) {
    const std::int64_t o = blocks ? c : c / layout.length;
    const std::int64_t j = blocks ? 0 : c % layout.length;
    char* w = whole + static_cast<std::size_t>(o * layout.dim + layout.start + j * layout.step) * row_bytes;
    char* p = part + static_cast<std::size_t>(o * layout.length + j) * row_bytes;
    if (into_part) copy_bytes(p, w, run);
    else copy_bytes(w, p, run);
  }
}

void slice_forward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  PARTRAIN_CHECK(inputs[0].dtype() == outputs[0].dtype(), "Slice: dtypes differ");
  const SliceLayout layout = slice_layout(context.attributes, inputs[0].shape(), outputs[0].shape());
  slice_copy(layout, dtype_size(inputs[0].dtype()), bytes_of(inputs[0]), bytes_of(outputs[0]), true);
}

void slice_backward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor>,
                    std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  const Tensor& dx = input_grads[0];
  if (!dx.defined()) return;
  PARTRAIN_CHECK(dx.dtype() == output_grads[0].dtype(), "Slice backward: dtypes differ");
  const SliceLayout layout = slice_layout(context.attributes, inputs[0].shape(), output_grads[0].shape());
  parallel_zero(dx);
  slice_copy(layout, dtype_size(dx.dtype()), bytes_of(dx), bytes_of(output_grads[0]), false);
}

// ---------------- Concat and Split ----------------
// `whole` viewed as [outer, total, inner] and part k as [outer, d_k, inner] along `axis`, where d_k
// is taken from layouts[k] (always defined: the forward tensors). into_whole: parts -> whole, else
// whole -> parts. Undefined parts are skipped (no gradient wanted).
void concat_copy(const Tensor& whole, std::span<const Tensor> layouts, std::span<const Tensor> parts,
                 std::int64_t axis_attribute, bool into_whole) {
  const kernels::ConcatLayout layout = kernels::concat_layout(whole, layouts, parts, axis_attribute);
  const std::vector<std::int64_t>& part_row = layout.part_row;        // bytes
  const std::vector<std::int64_t>& part_offset = layout.part_offset;  // bytes
  char* base = bytes_of(whole);
  const auto part_count = static_cast<std::int64_t>(parts.size());
  if (layout.outer == 1) {  // one block per part: parallelise inside each copy
    for (std::int64_t k = 0; k < part_count; ++k) {
      if (!parts[k].defined()) continue;
      char* w = base + part_offset[k];
      char* p = bytes_of(parts[k]);
      if (into_whole) parallel_copy(w, p, static_cast<std::size_t>(part_row[k]));
      else parallel_copy(p, w, static_cast<std::size_t>(part_row[k]));
    }
    return;
  }
#pragma omp parallel for collapse(2) schedule(static) if (whole.numel() > kParallelThreshold)
  for (std::int64_t o = 0; o < layout.outer; ++o)
    for (std::int64_t k = 0; k < part_count; ++k) {
      if (!parts[k].defined()) continue;
      char* w = base + o * layout.whole_row + part_offset[k];
      char* p = bytes_of(parts[k]) + o * part_row[k];
      if (into_whole) copy_bytes(w, p, static_cast<std::size_t>(part_row[k]));
      else copy_bytes(p, w, static_cast<std::size_t>(part_row[k]));
    }
}

void concat_forward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  concat_copy(outputs[0], inputs, inputs, context.attributes.get_int("axis"), true);
}

void concat_backward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor>,
                     std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  concat_copy(output_grads[0], inputs, input_grads, context.attributes.get_int("axis"), false);
}

void split_forward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  concat_copy(inputs[0], outputs, outputs, context.attributes.get_int("axis"), false);
}

void split_backward(const KernelContext& context, std::span<const Tensor>, std::span<const Tensor>,
                    std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  if (!input_grads[0].defined()) return;
  concat_copy(input_grads[0], output_grads, output_grads, context.attributes.get_int("axis"), true);
}
}  // namespace

void register_cpu_shape_kernels(Backend& backend) {
  backend.set_kernels(OpType::Gather, {gather_forward, gather_backward});
  backend.set_kernels(OpType::Reshape, {reshape_forward, reshape_backward});
  backend.set_kernels(OpType::Permute, {permute_forward, permute_backward});
  backend.set_kernels(OpType::Slice, {slice_forward, slice_backward});
  backend.set_kernels(OpType::Concat, {concat_forward, concat_backward});
  backend.set_kernels(OpType::Split, {split_forward, split_backward});
}

}  // namespace partrain
