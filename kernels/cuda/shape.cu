// CUDA kernels of the shape ops (schemas: src/graph/ops/shape.cpp; the reference semantics, checks
// and error messages are those of kernels/cpu/shape.cpp). Overview in shape.cuh.
#include "kernels/cuda/shape.cuh"

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <vector>

#include "kernels/common/op_geometry.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/device_errors.cuh"

namespace partrain::cuda {

namespace {

using kernels::check_same_bytes;
using kernels::permutation;

#define PARTRAIN_GRID_STRIDE(i, n)                                                                  \
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

char* bytes_of(const Tensor& tensor) {
  PARTRAIN_CHECK(!tensor.device().is_cpu(), "CUDA shape kernel given a host tensor");
  return static_cast<char*>(tensor.raw_data());
}

void device_copy(cudaStream_t stream, void* destination, const void* source, std::size_t bytes) {
  if (bytes == 0 || destination == source) return;
  PARTRAIN_CUDA_CHECK(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDeviceToDevice, stream));
}

void device_zero(cudaStream_t stream, const Tensor& tensor) {
  if (tensor.nbytes() > 0) PARTRAIN_CUDA_CHECK(cudaMemsetAsync(bytes_of(tensor), 0, tensor.nbytes(), stream));
}

// Unsigned types of 1, 2, 4, 8 and 16 bytes: data is moved as opaque units of this size.
template <int Bytes> struct UnitOf;
template <> struct UnitOf<1> { using type = std::uint8_t; };
template <> struct UnitOf<2> { using type = std::uint16_t; };
template <> struct UnitOf<4> { using type = std::uint32_t; };
template <> struct UnitOf<8> { using type = uint2; };
template <> struct UnitOf<16> { using type = uint4; };

/// Calls function(Unit{}) with the unsigned type of `bytes` bytes (1, 2, 4, 8 or 16).
template <typename Function>
void dispatch_unit(std::size_t bytes, Function&& function) {
  switch (bytes) {
    case 1: function(UnitOf<1>::type{}); return;
    case 2: function(UnitOf<2>::type{}); return;
    case 4: function(UnitOf<4>::type{}); return;
    case 8: function(UnitOf<8>::type{}); return;
    case 16: function(UnitOf<16>::type{}); return;
    default: PARTRAIN_FAIL("CUDA shape kernel: no copy unit of " << bytes << " bytes");
  }
}

/// Calls function(Index{}) with Index = int32_t for i32 and int64_t for i64 indices.
template <typename Function>
void dispatch_index(DType dtype, Function&& function) {
  switch (dtype) {
    case DType::I32: function(std::int32_t{}); return;
    case DType::I64: function(std::int64_t{}); return;
    default: PARTRAIN_FAIL("Gather indices must be i32 or i64, got " << dtype_name(dtype));
  }
}

// ---------------- strided row copies (Slice, Concat, Split, Gather rows) ----------------
// dst[o * dst_outer + j * dst_row + u] = src[o * src_outer + j * src_row + u] for o < outer,
// j < rows, u < units; every extent and stride in units of the copy.
struct RowCopy {
  std::int64_t outer = 1, rows = 1, units = 0;
  std::int64_t src_outer = 0, src_row = 0, dst_outer = 0, dst_row = 0;
};

template <typename Unit>
__global__ void row_copy_kernel(const Unit* __restrict__ src, Unit* __restrict__ dst, RowCopy copy) {
  const std::int64_t total = copy.outer * copy.rows * copy.units;
  PARTRAIN_GRID_STRIDE(i, total) {
    const std::int64_t u = i % copy.units;
    const std::int64_t r = i / copy.units;
    const std::int64_t j = r % copy.rows;
    const std::int64_t o = r / copy.rows;
    dst[o * copy.dst_outer + j * copy.dst_row + u] = src[o * copy.src_outer + j * copy.src_row + u];
  }
}

// The widest unit (16 bytes down to 1) that divides every byte extent/stride and both addresses,
// so that rows of bf16 or f32 elements move as 16-byte vectors when the layout allows it.
std::size_t widest_unit(std::initializer_list<std::int64_t> byte_values, std::initializer_list<const void*> pointers) {
  for (std::size_t unit = 16; unit > 1; unit /= 2) {
    bool fits = true;
    for (std::int64_t value : byte_values) fits = fits && value % static_cast<std::int64_t>(unit) == 0;
    for (const void* pointer : pointers) fits = fits && reinterpret_cast<std::uintptr_t>(pointer) % unit == 0;
    if (fits) return unit;
  }
  return 1;
}

// `copy` given in bytes (units = bytes per row); runs it in the widest possible unit.
void copy_rows(cudaStream_t stream, const char* src, char* dst, const RowCopy& copy) {
  if (copy.outer == 0 || copy.rows == 0 || copy.units == 0) return;
  if (copy.outer == 1 && copy.rows == 1) {  // one contiguous block
    device_copy(stream, dst, src, static_cast<std::size_t>(copy.units));
    return;
  }
  const std::size_t unit = widest_unit(
      {copy.units, copy.src_outer, copy.src_row, copy.dst_outer, copy.dst_row}, {src, dst});
  const auto u = static_cast<std::int64_t>(unit);
  RowCopy scaled = copy;
  scaled.units /= u;
  scaled.src_outer /= u;
  scaled.src_row /= u;
  scaled.dst_outer /= u;
  scaled.dst_row /= u;
  dispatch_unit(unit, [&](auto tag) {
    using Unit = decltype(tag);
    row_copy_kernel<Unit><<<blocks_for(scaled.outer * scaled.rows * scaled.units), kThreadsPerBlock, 0, stream>>>(
        reinterpret_cast<const Unit*>(src), reinterpret_cast<Unit*>(dst), scaled);
    PARTRAIN_CUDA_CHECK_LAUNCH();
  });
}

// ---------------- Gather (embedding lookup) ----------------
// Flags the lowest flat position whose index is outside [0, vocabulary) in `slot`.
template <typename Index>
__global__ void find_bad_index_kernel(const Index* __restrict__ indices, std::int64_t count, std::int64_t vocabulary,
                                      IndexCheckSlot* __restrict__ slot) {
  PARTRAIN_GRID_STRIDE(i, count) {
    const auto index = static_cast<std::int64_t>(indices[i]);
    if (index < 0 || index >= vocabulary) flag_bad_position(slot, i);
  }
}

// Queues the check that every index is in [0, vocabulary); a bad one becomes the CPU's error at
// the backend's next report (the step's end; at once under plain ordering). Nothing waits here:
// the kernels below never read outside the table whatever the indices.
void check_indices(const CudaBackend& cuda, const Tensor& indices, std::int64_t vocabulary, const char* op) {
  const std::int64_t count = indices.numel();
  if (count == 0) return;
  const Shape shape = indices.shape();
  IndexCheckSlot* slot = cuda.device_errors().reserve(op, [shape, vocabulary](std::int64_t index, std::int64_t position) {
    std::ostringstream message;
    message << "Gather index " << index << " at position " << kernels::position_string(position, shape) << " (flat "
            << position << ") of indices " << shape_string(shape) << " is out of range [0, " << vocabulary << ")";
    return message.str();
  });
  dispatch_index(indices.dtype(), [&](auto tag) {
    using Index = decltype(tag);
    find_bad_index_kernel<Index><<<blocks_for(count), kThreadsPerBlock, 0, cuda.stream()>>>(
        device_data<Index>(indices), count, vocabulary, slot);
    PARTRAIN_CUDA_CHECK_LAUNCH();
  });
  cuda.device_errors().record_bad_value(slot, indices);
}

// out[p, u] = table[indices[p], u] in copy units (a row of H elements is row_units units). Bad
// indices (reported by check_indices) read nothing: their rows are zero.
template <typename Unit, typename Index>
__global__ void gather_rows_kernel(const Unit* __restrict__ table, const Index* __restrict__ indices,
                                   Unit* __restrict__ out, std::int64_t positions, std::int64_t row_units,
                                   std::int64_t vocabulary) {
  PARTRAIN_GRID_STRIDE(i, positions * row_units) {
    const std::int64_t p = i / row_units;
    const std::int64_t u = i - p * row_units;
    const auto index = static_cast<std::int64_t>(indices[p]);
    out[i] = index >= 0 && index < vocabulary ? table[index * row_units + u] : Unit{};
  }
}

void gather_forward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  const CudaBackend& cuda = cuda_of(context);
  const Tensor& weight = inputs[0];
  const Tensor& indices = inputs[1];
  const Tensor& y = outputs[0];
  PARTRAIN_CHECK(weight.rank() == 2 && y.dtype() == weight.dtype() && y.numel() == indices.numel() * weight.dim(1),
                 "Gather kernel got weight " << shape_string(weight.shape()) << " " << dtype_name(weight.dtype())
                                             << ", indices " << shape_string(indices.shape()) << ", output "
                                             << shape_string(y.shape()) << " " << dtype_name(y.dtype()));
  check_indices(cuda, indices, weight.dim(0), "Gather forward");
  const std::int64_t positions = indices.numel();
  const auto row_bytes = static_cast<std::int64_t>(weight.dim(1) * static_cast<std::int64_t>(dtype_size(weight.dtype())));
  if (positions == 0 || row_bytes == 0) return;
  const char* table = bytes_of(weight);
  char* out = bytes_of(y);
  const std::size_t unit = widest_unit({row_bytes}, {table, out});
  const std::int64_t row_units = row_bytes / static_cast<std::int64_t>(unit);
  cudaStream_t stream = cuda.stream();
  dispatch_unit(unit, [&](auto unit_tag) {
    using Unit = decltype(unit_tag);
    dispatch_index(indices.dtype(), [&](auto index_tag) {
      using Index = decltype(index_tag);
      gather_rows_kernel<Unit, Index><<<blocks_for(positions * row_units), kThreadsPerBlock, 0, stream>>>(
          reinterpret_cast<const Unit*>(table), device_data<Index>(indices), reinterpret_cast<Unit*>(out), positions,
          row_units, weight.dim(0));
      PARTRAIN_CUDA_CHECK_LAUNCH();
    });
  });
}

// dweight[indices[p], h] += dy[p, h] with fp32 atomics: repeated indices add in a nondeterministic
// order (fp32 rounding differences only; the CPU adds positions in order).
template <typename T, typename Index>
__global__ void scatter_add_rows_kernel(const T* __restrict__ dy, const Index* __restrict__ indices,
                                        float* __restrict__ dweight, std::int64_t positions, std::int64_t hidden,
                                        std::int64_t vocabulary) {
  PARTRAIN_GRID_STRIDE(i, positions * hidden) {
    const std::int64_t p = i / hidden;
    const std::int64_t h = i - p * hidden;
    const auto index = static_cast<std::int64_t>(indices[p]);
    if (index >= 0 && index < vocabulary) atomicAdd(dweight + index * hidden + h, to_float(dy[i]));
  }
}

template <typename T>
__global__ void round_kernel(T* __restrict__ out, const float* __restrict__ in, std::int64_t count) {
  PARTRAIN_GRID_STRIDE(i, count) out[i] = from_float<T>(in[i]);
}

void gather_backward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor>,
                     std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  const Tensor& dweight = input_grads[0];
  if (!dweight.defined()) return;
  const CudaBackend& cuda = cuda_of(context);
  cudaStream_t stream = cuda.stream();
  const Tensor& indices = inputs[1];
  const Tensor& dy = output_grads[0];
  PARTRAIN_CHECK(dweight.rank() == 2 && dy.numel() == indices.numel() * dweight.dim(1),
                 "Gather backward got weight gradient " << shape_string(dweight.shape()) << ", indices "
                                                        << shape_string(indices.shape()) << ", output gradient "
                                                        << shape_string(dy.shape()));
  PARTRAIN_CHECK(is_floating(dweight.dtype()), "Gather backward: weight gradient of dtype " << dtype_name(dweight.dtype()));
  check_indices(cuda, indices, dweight.dim(0), "Gather backward");
  if (dweight.numel() == 0) return;
  const std::int64_t positions = indices.numel(), hidden = dweight.dim(1);
  // fp32 accumulation target: the gradient itself, or an f32 scratch rounded to bf16 at the end
  // (bf16 atomics would round after every addition).
  Tensor accumulator;
  float* target = nullptr;
  if (dweight.dtype() == DType::F32) {
    target = device_data<float>(dweight);
  } else {
    accumulator = cuda.scratch(static_cast<std::size_t>(dweight.numel()) * sizeof(float));
    target = static_cast<float*>(accumulator.raw_data());
  }
  PARTRAIN_CUDA_CHECK(cudaMemsetAsync(target, 0, static_cast<std::size_t>(dweight.numel()) * sizeof(float), stream));
  if (positions * hidden > 0) {
    dispatch_floating(dy.dtype(), "Gather backward", [&](auto tag) {
      using T = decltype(tag);
      dispatch_index(indices.dtype(), [&](auto index_tag) {
        using Index = decltype(index_tag);
        scatter_add_rows_kernel<T, Index><<<blocks_for(positions * hidden), kThreadsPerBlock, 0, stream>>>(
            device_data<T>(dy), device_data<Index>(indices), target, positions, hidden, dweight.dim(0));
        PARTRAIN_CUDA_CHECK_LAUNCH();
      });
    });
  }
  if (dweight.dtype() == DType::BF16) {
    round_kernel<__nv_bfloat16><<<blocks_for(dweight.numel()), kThreadsPerBlock, 0, stream>>>(
        device_data<__nv_bfloat16>(dweight), target, dweight.numel());
    PARTRAIN_CUDA_CHECK_LAUNCH();
  }
}

// ---------------- Reshape ----------------
void reshape_forward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  check_same_bytes("Reshape", inputs[0], outputs[0]);
  if (inputs[0].nbytes() == 0) return;
  device_copy(cuda_of(context).stream(), bytes_of(outputs[0]), bytes_of(inputs[0]), inputs[0].nbytes());
}

void reshape_backward(const KernelContext& context, std::span<const Tensor>, std::span<const Tensor>,
                      std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  if (!input_grads[0].defined()) return;
  check_same_bytes("Reshape backward", input_grads[0], output_grads[0]);
  if (output_grads[0].nbytes() == 0) return;
  device_copy(cuda_of(context).stream(), bytes_of(input_grads[0]), bytes_of(output_grads[0]), output_grads[0].nbytes());
}

// ---------------- Permute ----------------
constexpr int kMaxPermuteRank = 8;

// Output axis d of the reduced permutation has extent size[d] and input stride in_stride[d].
struct PermuteLayout {
  int rank = 0;
  std::int64_t size[kMaxPermuteRank] = {};
  std::int64_t in_stride[kMaxPermuteRank] = {};
};

template <typename Element>
__global__ void permute_kernel(const Element* __restrict__ in, Element* __restrict__ out, std::int64_t total,
                               PermuteLayout layout) {
  PARTRAIN_GRID_STRIDE(i, total) {
    std::int64_t rest = i, offset = 0;
    for (int d = layout.rank - 1; d >= 0; --d) {
      const std::int64_t size = layout.size[d];
      offset += (rest % size) * layout.in_stride[d];
      rest /= size;
    }
    out[i] = in[offset];
  }
}

constexpr int kTile = 32;
constexpr int kTileRows = 8;  // blockDim.y of the tile transpose (blockDim.x = kTile)

// The tile transpose: output axis `rows` is the input's contiguous axis (input stride 1, output
// stride row_out_stride), the last output axis `cols` has input stride col_in_stride (output stride
// 1); the remaining output axes form the batch.
struct TileLayout {
  std::int64_t rows = 0, cols = 0, col_in_stride = 0, row_out_stride = 0;
  std::int64_t tiles_rows = 0, tiles_cols = 0, tiles_total = 0;
  int batch_rank = 0;
  std::int64_t batch_size[kMaxPermuteRank] = {};
  std::int64_t batch_in_stride[kMaxPermuteRank] = {};
  std::int64_t batch_out_stride[kMaxPermuteRank] = {};
};

template <typename Element>
__global__ void permute_tile_kernel(const Element* __restrict__ in, Element* __restrict__ out, TileLayout t) {
  __shared__ Element tile[kTile][kTile + 1];  // +1: no bank conflicts on the transposed read
  for (std::int64_t index = blockIdx.x; index < t.tiles_total; index += gridDim.x) {
    const std::int64_t tile_row = index % t.tiles_rows;
    std::int64_t rest = index / t.tiles_rows;
    const std::int64_t tile_col = rest % t.tiles_cols;
    rest /= t.tiles_cols;
    std::int64_t in_base = 0, out_base = 0;
    for (int d = t.batch_rank - 1; d >= 0; --d) {
      const std::int64_t coordinate = rest % t.batch_size[d];
      rest /= t.batch_size[d];
      in_base += coordinate * t.batch_in_stride[d];
      out_base += coordinate * t.batch_out_stride[d];
    }
    const std::int64_t row0 = tile_row * kTile, col0 = tile_col * kTile;
    // Load: threadIdx.x runs along the input's contiguous axis (coalesced reads).
    for (int k = threadIdx.y; k < kTile; k += blockDim.y) {
      const std::int64_t row = row0 + threadIdx.x, col = col0 + k;
      if (row < t.rows && col < t.cols) tile[k][threadIdx.x] = in[in_base + row + col * t.col_in_stride];
    }
    __syncthreads();
    // Store: threadIdx.x runs along the output's contiguous axis (coalesced writes).
    for (int k = threadIdx.y; k < kTile; k += blockDim.y) {
      const std::int64_t row = row0 + k, col = col0 + threadIdx.x;
      if (row < t.rows && col < t.cols) out[out_base + row * t.row_out_stride + col] = tile[threadIdx.x][k];
    }
    __syncthreads();  // the tile is reused by the next iteration
  }
}

}  // namespace

void permute_device(const CudaBackend& backend, const Tensor& source, const Tensor& destination,
                    std::span<const int> perm) {
  check_same_bytes("Permute", source, destination);
  const Shape& in_shape = source.shape();
  PARTRAIN_CHECK(perm.size() == in_shape.size(), "Permute: perm of size " << perm.size() << " for rank " << in_shape.size());
  std::vector<bool> seen(in_shape.size(), false);
  for (int p : perm) {
    PARTRAIN_CHECK(p >= 0 && p < static_cast<int>(in_shape.size()) && !seen[p], "Permute: perm is not a permutation");
    seen[p] = true;
  }
  const std::size_t element = dtype_size(source.dtype());
  if (source.numel() == 0) return;
  cudaStream_t stream = backend.stream();

  // Reduce as the CPU does: drop size-1 input axes, then merge output axes that are consecutive in
  // the input.
  const kernels::MergedPermutation merged = kernels::merge_permutation(in_shape, perm);
  const int rank = static_cast<int>(merged.rank());
  if (rank <= 1) {  // the permutation does not move any data
    device_copy(stream, bytes_of(destination), bytes_of(source), source.nbytes());
    return;
  }
  PARTRAIN_CHECK(rank <= kMaxPermuteRank, "Permute of " << shape_string(in_shape) << ": " << rank
                                                        << " axes after merging, the CUDA kernel takes at most "
                                                        << kMaxPermuteRank);
  const std::vector<int>& order = merged.order;
  const std::vector<std::int64_t>& group_size = merged.size;
  const std::vector<std::int64_t>& group_stride = merged.in_stride;
  std::vector<std::int64_t> out_stride(rank);
  std::int64_t stride = 1;
  for (int g = rank; g-- > 0;) {
    out_stride[g] = stride;
    stride *= group_size[g];
  }
  const std::int64_t total = source.numel();
  const char* in = bytes_of(source);
  char* out = bytes_of(destination);

  if (group_stride[rank - 1] == 1) {
    // The innermost output axis is contiguous in the input too: reads and writes coalesce.
    PermuteLayout layout;
    layout.rank = rank;
    for (int g = 0; g < rank; ++g) {
      layout.size[g] = group_size[g];
      layout.in_stride[g] = group_stride[g];
    }
    dispatch_unit(element, [&](auto tag) {
      using Element = decltype(tag);
      permute_kernel<Element><<<blocks_for(total), kThreadsPerBlock, 0, stream>>>(
          reinterpret_cast<const Element*>(in), reinterpret_cast<Element*>(out), total, layout);
      PARTRAIN_CUDA_CHECK_LAUNCH();
    });
    return;
  }
  // Otherwise transpose tiles between the input's contiguous axis (output axis `a`, the group with
  // input stride 1) and the last output axis.
  const int a = order[rank - 1];
  TileLayout t;
  t.rows = group_size[a];
  t.cols = group_size[rank - 1];
  t.col_in_stride = group_stride[rank - 1];
  t.row_out_stride = out_stride[a];
  t.tiles_rows = (t.rows + kTile - 1) / kTile;
  t.tiles_cols = (t.cols + kTile - 1) / kTile;
  t.tiles_total = t.tiles_rows * t.tiles_cols;
  for (int g = 0; g < rank; ++g) {
    if (g == a || g == rank - 1) continue;
    t.batch_size[t.batch_rank] = group_size[g];
    t.batch_in_stride[t.batch_rank] = group_stride[g];
    t.batch_out_stride[t.batch_rank] = out_stride[g];
    t.tiles_total *= group_size[g];
    ++t.batch_rank;
  }
  const auto grid = static_cast<unsigned int>(std::min<std::int64_t>(t.tiles_total, 65535 * 8));
  dispatch_unit(element, [&](auto tag) {
    using Element = decltype(tag);
    permute_tile_kernel<Element><<<grid, dim3(kTile, kTileRows), 0, stream>>>(reinterpret_cast<const Element*>(in),
                                                                              reinterpret_cast<Element*>(out), t);
    PARTRAIN_CUDA_CHECK_LAUNCH();
  });
}

namespace {

void permute_forward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  const std::vector<int> perm = permutation(context.attributes);
  permute_device(cuda_of(context), inputs[0], outputs[0], perm);
}

void permute_backward(const KernelContext& context, std::span<const Tensor>, std::span<const Tensor>,
                      std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  if (!input_grads[0].defined()) return;
  const std::vector<int> perm = permutation(context.attributes);
  for (std::size_t i = 0; i < perm.size(); ++i)
    PARTRAIN_CHECK(perm[i] >= 0 && perm[i] < static_cast<int>(perm.size()), "Permute backward: bad perm");
  const std::vector<int> inverse = kernels::inverse_permutation(perm);
  permute_device(cuda_of(context), output_grads[0], input_grads[0], inverse);
}

// ---------------- Slice ----------------
// kernels::slice_layout (the CPU's), after the rank check the CUDA kernels add.
using kernels::SliceLayout;

SliceLayout slice_layout(const Attributes& attributes, const Shape& whole, const Shape& part) {
  normalise_axis(attributes.get_int("axis"), whole.size());  // its error first, as in kernels::slice_layout
  PARTRAIN_CHECK(part.size() == whole.size(), "Slice: output " << shape_string(part) << " and input "
                                                               << shape_string(whole) << " differ in rank");
  return kernels::slice_layout(attributes, whole, part);
}

// into_part: whole -> part, else part -> whole.
void slice_copy(cudaStream_t stream, const SliceLayout& layout, std::size_t element, char* whole, char* part,
                bool into_part) {
  const auto row = static_cast<std::int64_t>(layout.inner * static_cast<std::int64_t>(element));
  char* whole_first = whole + layout.start * row;
  RowCopy copy;
  copy.outer = layout.outer;
  copy.rows = layout.length;
  copy.units = row;
  const std::int64_t whole_outer = layout.dim * row, whole_row = layout.step * row;
  const std::int64_t part_outer = layout.length * row, part_row = row;
  if (into_part) {
    copy.src_outer = whole_outer;
    copy.src_row = whole_row;
    copy.dst_outer = part_outer;
    copy.dst_row = part_row;
    copy_rows(stream, whole_first, part, copy);
  } else {
    copy.src_outer = part_outer;
    copy.src_row = part_row;
    copy.dst_outer = whole_outer;
    copy.dst_row = whole_row;
    copy_rows(stream, part, whole_first, copy);
  }
}

void slice_forward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  PARTRAIN_CHECK(inputs[0].dtype() == outputs[0].dtype(), "Slice: dtypes differ");
  const SliceLayout layout = slice_layout(context.attributes, inputs[0].shape(), outputs[0].shape());
  if (outputs[0].numel() == 0) return;
  slice_copy(cuda_of(context).stream(), layout, dtype_size(inputs[0].dtype()), bytes_of(inputs[0]),
             bytes_of(outputs[0]), true);
}

void slice_backward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor>,
                    std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  const Tensor& dx = input_grads[0];
  if (!dx.defined()) return;
  PARTRAIN_CHECK(dx.dtype() == output_grads[0].dtype(), "Slice backward: dtypes differ");
  const SliceLayout layout = slice_layout(context.attributes, inputs[0].shape(), output_grads[0].shape());
  cudaStream_t stream = cuda_of(context).stream();
  device_zero(stream, dx);
  if (output_grads[0].numel() == 0) return;
  slice_copy(stream, layout, dtype_size(dx.dtype()), bytes_of(dx), bytes_of(output_grads[0]), false);
}

// ---------------- Concat and Split ----------------
// `whole` viewed as [outer, total, inner] and part k as [outer, d_k, inner] along `axis`, where d_k
// is taken from layouts[k] (always defined: the forward tensors). into_whole: parts -> whole, else
// whole -> parts. Undefined parts are skipped (no gradient wanted). One strided copy per part.
void concat_copy(cudaStream_t stream, const Tensor& whole, std::span<const Tensor> layouts,
                 std::span<const Tensor> parts, std::int64_t axis_attribute, bool into_whole) {
  const kernels::ConcatLayout layout = kernels::concat_layout(whole, layouts, parts, axis_attribute);
  const std::int64_t outer = layout.outer, whole_row = layout.whole_row;
  const std::vector<std::int64_t>& part_row = layout.part_row;        // bytes
  const std::vector<std::int64_t>& part_offset = layout.part_offset;  // bytes
  if (whole.numel() == 0) return;
  char* base = bytes_of(whole);
  for (std::size_t k = 0; k < parts.size(); ++k) {
    if (!parts[k].defined() || part_row[k] == 0) continue;
    RowCopy copy;
    copy.outer = outer;
    copy.rows = 1;
    copy.units = part_row[k];
    char* w = base + part_offset[k];
    char* p = bytes_of(parts[k]);
    if (into_whole) {
      copy.src_outer = part_row[k];
      copy.dst_outer = whole_row;
      copy_rows(stream, p, w, copy);
    } else {
      copy.src_outer = whole_row;
      copy.dst_outer = part_row[k];
      copy_rows(stream, w, p, copy);
    }
  }
}

void concat_forward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  concat_copy(cuda_of(context).stream(), outputs[0], inputs, inputs, context.attributes.get_int("axis"), true);
}

void concat_backward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor>,
                     std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  concat_copy(cuda_of(context).stream(), output_grads[0], inputs, input_grads, context.attributes.get_int("axis"), false);
}

void split_forward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  concat_copy(cuda_of(context).stream(), inputs[0], outputs, outputs, context.attributes.get_int("axis"), false);
}

void split_backward(const KernelContext& context, std::span<const Tensor>, std::span<const Tensor>,
                    std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  if (!input_grads[0].defined()) return;
  concat_copy(cuda_of(context).stream(), input_grads[0], output_grads, output_grads, context.attributes.get_int("axis"),
              true);
}

#undef PARTRAIN_GRID_STRIDE

}  // namespace

void register_cuda_shape_kernels(Backend& backend) {
  backend.set_kernels(OpType::Gather, {gather_forward, gather_backward});
  backend.set_kernels(OpType::Reshape, {reshape_forward, reshape_backward});
  backend.set_kernels(OpType::Permute, {permute_forward, permute_backward});
  backend.set_kernels(OpType::Slice, {slice_forward, slice_backward});
  backend.set_kernels(OpType::Concat, {concat_forward, concat_backward});
  backend.set_kernels(OpType::Split, {split_forward, split_backward});
}

}  // namespace partrain::cuda
