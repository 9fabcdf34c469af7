#pragma once
// Host-side geometry of the ops, shared by the CPU kernels (kernels/cpu/) and the CUDA kernels
// (kernels/cuda/): sizes, strides and layouts read from tensor shapes and op attributes, and the
// shape checks both backends make, with one set of error messages. Plain C++: no CUDA types, no
// BLAS calls (backend-specific checks, such as the CPU's BLAS int range, stay with the backend).
// Compiled into partrain_lib; partrain_cuda links it.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/shape.h"
#include "core/tensor.h"
#include "core/backend.h"
#include "core/attributes.h"

namespace partrain::kernels {

// ---------------- broadcasting ----------------

/// Element strides of `shape` aligned to the right of `output_shape` for numpy broadcasting: one
/// stride per output dimension, 0 where `shape` has size 1 (or is missing) and the output does not.
/// `shape` must not have a higher rank than `output_shape` (callers check it). Does not throw.
std::vector<std::int64_t> broadcast_strides(const Shape& shape, const Shape& output_shape);

// ---------------- shape ops ----------------

/// Product of the dimensions [begin, end) of `shape` (1 for an empty range).
std::int64_t dim_product(const Shape& shape, std::size_t begin, std::size_t end);

/// The row-major coordinates of flat index `flat` in `shape`, as text "[i, j, k]" (the form the
/// Gather and SoftmaxCrossEntropy errors report a bad position in). Does not throw.
std::string position_string(std::int64_t flat, const Shape& shape);

/// Checks that `a` and `b` have the same dtype and element count (so the same bytes); throws
/// partrain::Error "<op>: tensors <shape> <dtype> and <shape> <dtype> do not match" otherwise.
void check_same_bytes(const char* op, const Tensor& a, const Tensor& b);

/// The Permute op's "perm" attribute as ints (output axis k is input axis perm[k]).
std::vector<int> permutation(const Attributes& attributes);

/// The inverse of `perm` (inverse[perm[i]] = i), the permutation of a Permute's backward. `perm`
/// must be a permutation of [0, perm.size()) (callers validate it). Does not throw.
std::vector<int> inverse_permutation(std::span<const int> perm);

/// A permutation reduced to its essential axes: size-1 input axes dropped, output axes that are
/// consecutive in the input merged. Output axis g (g < rank()) has extent size[g] and input element
/// stride in_stride[g]; order lists the output axes by their position in the input (order[rank-1]
/// is the axis with input stride 1). rank() <= 1: the permutation moves no data.
struct MergedPermutation {
  std::vector<std::int64_t> size;
  std::vector<std::int64_t> in_stride;
  std::vector<int> order;

  std::size_t rank() const { return size.size(); }
};

/// Reduces `perm` (a valid permutation of in_shape's axes; callers validate it) over `in_shape`
/// (any rank). Does not throw.
MergedPermutation merge_permutation(const Shape& in_shape, std::span<const int> perm);

/// The strided copy of a Slice: `whole` viewed as [outer, dim, inner], `part` as [outer, length,
/// inner]; part row j is whole row start + j * step.
struct SliceLayout {
  std::int64_t outer = 1, dim = 0, length = 0, inner = 1, start = 0, step = 1;
};

/// The Slice layout of `part` (the output) in `whole` (the input), both of the same rank, from the
/// attributes axis, start (clamped to [0, dim], negative counts from the end) and step. Throws
/// partrain::Error "Slice: output <shape> does not fit input <shape>" when the rows run past the end
/// (and the attribute getters' errors).
SliceLayout slice_layout(const Attributes& attributes, const Shape& whole, const Shape& part);

/// Concat/Split: `whole` viewed as [outer, total, inner] along `axis` and part k as [outer, d_k,
/// inner]. All row sizes and offsets are in bytes: part k covers bytes [part_offset[k],
/// part_offset[k] + part_row[k]) of each whole row of whole_row bytes.
struct ConcatLayout {
  int axis = 0;
  std::int64_t outer = 1, inner = 1, whole_row = 0;
  std::vector<std::int64_t> part_row, part_offset;
};

/// The Concat/Split layout of `whole` and its parts: d_k is taken from layouts[k] (always defined:
/// the forward tensors); parts[k] (possibly undefined: no gradient wanted) must match layouts[k]
/// in dtype and element count and `whole` in dtype. Throws partrain::Error ("Concat/Split: ...")
/// when the counts differ, a part does not fit `whole` along the axis, or the parts do not add up.
ConcatLayout concat_layout(const Tensor& whole, std::span<const Tensor> layouts, std::span<const Tensor> parts,
                           std::int64_t axis_attribute);

// ---------------- gemm ops ----------------

/// MatMul y [..., M, N] = alpha op(a) op(b) with op(a) [..., M, K] and op(b) [..., K, N]; `batch` is
/// the product of a's leading dimensions. Entry strides are in elements.
struct MatMulDims {
  bool trans_a = false, trans_b = false;
  float alpha = 1;
  std::int64_t batch = 1, m = 0, k = 0, n = 0;
  bool shared_b = false;  // b has rank 2 and is used by every batch entry
  std::int64_t stride_a() const { return m * k; }
  std::int64_t stride_b() const { return shared_b ? 0 : k * n; }
  std::int64_t stride_y() const { return m * n; }
};

/// The MatMul dimensions of `a` (rank >= 2) and `b` (rank 2, or a's rank) from the attributes
/// trans_a, trans_b and alpha. Throws only the attribute getters' errors.
MatMulDims matmul_dims(const Attributes& attributes, const Shape& a, const Shape& b);

/// Gemm (linear layer) y [rows, n] = x [rows, k] op(w) (+ bias), x's leading dimensions flattened
/// into rows; w is [n, k] when trans_b, else [k, n].
struct GemmDims {
  bool trans_b = true;
  std::int64_t rows = 0, k = 0, n = 0;
};

/// The Gemm dimensions of x (rank >= 1) and w (rank 2) from the attribute trans_b (default 1).
GemmDims gemm_dims(const Attributes& attributes, const Tensor& x, const Tensor& w);

// ---------------- attention ----------------

/// Scaled dot-product attention over q [B, h, S, d], k [B, h, T, d], v [B, h, T, dv]; `scale`
/// defaults to 1/sqrt(d) (1 when d = 0), `causal` lets query i see key j <= i + (T - S).
struct AttentionShape {
  std::int64_t batch = 0, heads = 0, s = 0, t = 0, d = 0, dv = 0;
  float scale = 1;
  bool causal = false;

  std::int64_t pairs() const { return batch * heads; }
};

/// The attention shape of inputs (q, k, v[, mask]) and the attributes causal and scale. Throws
/// only the tensors' dim() and the attribute getters' errors.
AttentionShape attention_shape(const Attributes& attributes, std::span<const Tensor> inputs);

// ---------------- convolution ops ----------------

/// A 2-int attribute (the schema has validated it) or `fallback` when absent; throws
/// partrain::Error "<name> must have 2 values, got <n>" otherwise.
std::vector<std::int64_t> pair_attribute(const Attributes& attributes, const std::string& name,
                                         std::vector<std::int64_t> fallback);

/// Conv2d of x [N, C, H, W] with w [OC, C/groups, KH, KW] into y [N, OC, OH, OW].
struct ConvGeometry {
  std::int64_t batch, channels, height, width;
  std::int64_t out_channels, out_height, out_width;
  std::int64_t kernel_h, kernel_w;
  std::int64_t stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w;
  std::int64_t groups;

  std::int64_t group_channels() const { return channels / groups; }
  std::int64_t group_out_channels() const { return out_channels / groups; }
  // The im2col column matrix of one (sample, group) is [col_rows, col_cols].
  std::int64_t col_rows() const { return group_channels() * kernel_h * kernel_w; }
  std::int64_t col_cols() const { return out_height * out_width; }
  std::int64_t plane() const { return height * width; }
  std::int64_t out_plane() const { return out_height * out_width; }
  // 1x1, stride 1, no padding: the input [C/groups, H*W] is already the column matrix.
  bool direct_columns() const {
    return kernel_h == 1 && kernel_w == 1 && stride_h == 1 && stride_w == 1 && pad_h == 0 && pad_w == 0;
  }
};

/// The Conv2d geometry of x, w, y from the attributes stride, padding, dilation (pairs) and groups.
/// Throws partrain::Error "Conv2d kernel got input <shape>, weight <shape>, output <shape>, groups
/// <g>" when a tensor is not rank 4 or the channels, groups and batch do not agree (and
/// pair_attribute's errors).
ConvGeometry conv_geometry(const Attributes& attributes, const Tensor& x, const Tensor& w, const Tensor& y);

/// MaxPool2d of x [N, C, H, W] into y [N, C, OH, OW]; planes = N * C.
struct PoolGeometry {
  std::int64_t planes, height, width, out_height, out_width;
  std::int64_t kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w;
};

/// The MaxPool2d geometry of x and y from the attributes kernel, stride (default: kernel) and
/// padding. Throws partrain::Error "MaxPool2d kernel got input <shape>, output <shape>" when x or y
/// is not rank 4 or their N, C differ (and pair_attribute's errors).
PoolGeometry pool_geometry(const Attributes& attributes, const Tensor& x, const Tensor& y);

// ---------------- softmax ops ----------------

/// SoftmaxCrossEntropy of logits [..., classes] against labels [...] (rows = labels.numel()).
struct CrossEntropyShape {
  std::int64_t classes = 0, rows = 0, ignore_index = -100;
};

/// The cross-entropy shape from logits, labels and the attribute ignore_index (default -100).
CrossEntropyShape cross_entropy_shape(const Attributes& attributes, const Tensor& logits, const Tensor& labels);

/// Dropout on the rank's part of a tensor split over the tensor-parallel group along dimension 1
/// (attribute tensor_parallel_split = 1, graph/tensor_parallel.h): the index in the whole tensor's
/// sample of the part's first element, rank × elements per sample of the part, so that every rank
/// draws the whole tensor's mask for its elements. 0 for an unsplit tensor.
std::uint64_t dropout_first_element(const KernelContext& context, std::int64_t part_elements_per_sample);

// ---------------- vocabulary parallelism ----------------

/// A rank's part of a vocabulary split over the tensor-parallel group (VocabParallelEmbedding's
/// table rows, VocabParallelCrossEntropy's classes; graph/ops/tensor_parallel.cpp): the rank holds
/// rows [first, first + rows) of rows × parts, of which [first, first + real) are below the real
/// vocabulary and the rest are Megatron-LM's vocabulary padding.
struct VocabularyPart {
  std::int64_t first = 0;       // the rank's first row (class)
  std::int64_t rows = 0;        // rows (classes) the rank holds, padding included
  std::int64_t real = 0;        // of those, the ones below `vocabulary`
  std::int64_t vocabulary = 0;  // the real vocabulary: attribute vocab_size, default rows × parts
};

/// The part of rank `rank` of `parts` that holds `rows` rows, for the op `op` (its error message):
/// throws partrain::Error when the attribute vocab_size is outside [1, rows × parts].
VocabularyPart vocabulary_part(const Attributes& attributes, std::int64_t rows, int rank, int parts, const char* op);

// ---------------- sequence parallelism ----------------

/// A tensor split along dimension `axis` (attribute, default 1) over the tensor-parallel group
/// (sequence parallelism, graph/ops/tensor_parallel.cpp): the whole tensor viewed as
/// [outer, parts, chunk] elements, rank r's part as [outer, chunk] (its slice r of the middle
/// dimension). The group's all-gather and reduce-scatter lay the parts out as [parts, outer, chunk]:
/// when outer is 1 both views are the same and no rearranging copy is needed.
struct SequenceSplit {
  int parts = 1;            // the group's size t
  int rank = 0;             // this rank's position in the group
  std::int64_t outer = 1;   // product of the dimensions before axis
  std::int64_t chunk = 0;   // elements of one part per outer index
};

/// The split of `whole` into `part` for the op `op` (its error messages): checks that the context
/// has a tensor-parallel group whose size is the attribute parts and that `whole` is `part` with
/// dimension axis multiplied by it. Throws partrain::Error naming the op and the shapes.
SequenceSplit sequence_split(const KernelContext& context, const Tensor& part, const Tensor& whole, const char* op);

}  // namespace partrain::kernels
