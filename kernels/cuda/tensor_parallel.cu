// CUDA kernels of the tensor-parallel ops (schemas and semantics: src/graph/ops/tensor_parallel.cpp;
// reference, checks and error messages: kernels/cpu/tensor_parallel.cpp; overview:
// kernels/cuda/tensor_parallel.cuh).
#include "kernels/cuda/tensor_parallel.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <utility>

#include "kernels/common/op_geometry.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/device_errors.cuh"
#include "kernels/cuda/rows.cuh"

namespace partrain::cuda {

namespace {

using Reduction = TensorParallelGroup::Reduction;

#define PARTRAIN_GRID_STRIDE(i, n)                                                                  \
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

TensorParallelGroup& group_of(const KernelContext& context) {
  PARTRAIN_CHECK(context.tensor_parallel != nullptr,
                 "a tensor-parallel op ran without a tensor-parallel group (a graph transformed for t > 1 on one rank?)");
  return *context.tensor_parallel;
}

/// Calls function(Index{}) with Index = int32_t for i32 and int64_t for i64; `what` names the
/// tensor in the error for any other dtype.
template <typename Function>
void dispatch_index(DType dtype, const char* what, Function&& function) {
  switch (dtype) {
    case DType::I32: function(std::int32_t{}); return;
    case DType::I64: function(std::int64_t{}); return;
    default: PARTRAIN_FAIL(what << " must be i32 or i64, got " << dtype_name(dtype));
  }
}

void device_copy(const CudaBackend& cuda, const Tensor& destination, const Tensor& source, const char* what) {
  kernels::check_same_bytes(what, destination, source);
  if (source.nbytes() == 0 || destination.raw_data() == source.raw_data()) return;
  PARTRAIN_CUDA_CHECK(cudaMemcpyAsync(destination.raw_data(), source.raw_data(), source.nbytes(),
                                      cudaMemcpyDeviceToDevice, cuda.stream()));
}

// ---------------- the group's all-reduces ----------------
// Every all-reduce of these kernels goes through here: `start` calls the group on `tensor` (f32,
// on this backend's device).
//
// Why the backend's stream may need a wait first: the kernels that wrote `tensor` were queued on
// CudaBackend::stream() and may still be running when the host gets here. A group that does not
// order device work (TensorParallelGroup::orders_device_work false) may read the tensor outside that
// stream's order: staged through host memory (Open MPI here is not CUDA-aware), copied on the
// legacy default stream, or reduced on a stream of its own; for it the host waits, and the data is
// then complete. What the kernels need in return: when the call returns, the reduction is done or
// ordered before the work queued next on the backend's stream, so that kernels queued next read its
// result (the cross-entropy's next kernels, the bf16 rounding below).
//
// The group the runtime uses on the GPU (comm::CommunicatorTensorParallelGroup over the NCCL
// communicator) orders device work with CUDA events, also when started as a deferrable
// all-reduce, so nothing waits: a wait would cost a host round trip per all-reduce (the GPU idles
// while the host queues the collective and the next kernels), two per layer and direction in a
// Megatron layer.
// Waits for the backend's stream when `group` does not order device work itself (see above).
void wait_unless_ordered(const KernelContext& context, const TensorParallelGroup& group) {
  if (!group.orders_device_work()) PARTRAIN_CUDA_CHECK(cudaStreamSynchronize(cuda_of(context).stream()));
}

template <typename Start>
void reduce_over_group(const KernelContext& context, const Tensor& tensor, Start&& start) {
  TensorParallelGroup& group = group_of(context);
  PARTRAIN_CHECK(tensor.dtype() == DType::F32,
                 "tensor-parallel all-reduce of a " << dtype_name(tensor.dtype()) << " tensor");
  wait_unless_ordered(context, group);
  start(group, tensor);
}

// A blocking all-reduce of `tensor` (f32) with `reduction`.
void all_reduce_over_group(const KernelContext& context, const Tensor& tensor, Reduction reduction) {
  reduce_over_group(context, tensor,
                    [reduction](TensorParallelGroup& group, const Tensor& t) { group.all_reduce(t, reduction); });
}

// Megatron's f and g: sums a float tensor (f32 or bf16) over the group in place with the group's
// deferrable all-reduce, as the CPU kernels do (under sub-pipelined TMP the interpreter completes it
// before the next task of the same sub-microbatch). A bf16 tensor is summed as an f32 copy and
// rounded once, as the CPU backend does for it (it widens bf16 to f32 around its kernels), so the
// group sees f32 tensors only; the rounding is queued on the stream after the reduction (see above).
void sum_over_group(const KernelContext& context, const Tensor& tensor) {
  auto deferrable = [](TensorParallelGroup& group, const Tensor& t) { group.all_reduce_deferrable(t); };
  if (tensor.dtype() == DType::F32) {
    reduce_over_group(context, tensor, deferrable);
    return;
  }
  PARTRAIN_CHECK(tensor.dtype() == DType::BF16,
                 "tensor-parallel all-reduce: CUDA kernels take f32 or bf16, got " << dtype_name(tensor.dtype()));
  CudaBackend& cuda = cuda_of(context);
  const Tensor wide = cuda.empty(tensor.shape(), DType::F32);
  cuda.convert(wide, tensor);
  reduce_over_group(context, wide, deferrable);
  cuda.convert(tensor, wide);
}

// ---------------- TensorParallelCopy (f) and TensorParallelAllReduce (g) ----------------
void copy_forward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out) {
  device_copy(cuda_of(context), out[0], in[0], "TensorParallelCopy");
}

void copy_backward(const KernelContext& context, std::span<const Tensor>, std::span<const Tensor>,
                   std::span<const Tensor> dout, std::span<const Tensor> din) {
  if (!din[0].defined()) return;
  device_copy(cuda_of(context), din[0], dout[0], "TensorParallelCopy backward");
  sum_over_group(context, din[0]);
}

void all_reduce_forward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out) {
  device_copy(cuda_of(context), out[0], in[0], "TensorParallelAllReduce");
  sum_over_group(context, out[0]);
}

void all_reduce_backward(const KernelContext& context, std::span<const Tensor>, std::span<const Tensor>,
                         std::span<const Tensor> dout, std::span<const Tensor> din) {
  if (din[0].defined()) device_copy(cuda_of(context), din[0], dout[0], "TensorParallelAllReduce backward");
}

// ---------------- sequence parallelism ----------------
// The group's all-gather and reduce-scatter lay the ranks' parts out one after another
// ([parts, outer, chunk]); the tensors are [outer, parts, chunk] (kernels::SequenceSplit): staged
// through an f32 buffer and rearranged by strided copies on the stream when outer > 1. bf16 tensors
// are communicated as f32 copies (the group takes f32 only) and rounded once, as the CPU backend's
// widening does; an all-gather of bf16 values is exact either way. The stream is waited for before
// each collective only as reduce_over_group explains.
using kernels::SequenceSplit;

// Copies, for every rank r, the [outer, chunk] block r between `grouped` ([parts, outer, chunk]) and
// its rows in `interleaved` ([outer, parts, chunk]) of `element` bytes per element.
void regroup(const CudaBackend& cuda, void* grouped, void* interleaved, const SequenceSplit& split, std::size_t element,
             bool to_grouped) {
  const std::size_t row = static_cast<std::size_t>(split.chunk) * element;
  if (row == 0 || split.outer == 0) return;
  for (int r = 0; r < split.parts; ++r) {
    char* block = static_cast<char*>(grouped) + static_cast<std::size_t>(r) * static_cast<std::size_t>(split.outer) * row;
    char* rows = static_cast<char*>(interleaved) + static_cast<std::size_t>(r) * row;
    const std::size_t pitch = static_cast<std::size_t>(split.parts) * row;
    if (to_grouped) {
      PARTRAIN_CUDA_CHECK(cudaMemcpy2DAsync(block, row, rows, pitch, row, static_cast<std::size_t>(split.outer),
                                            cudaMemcpyDeviceToDevice, cuda.stream()));
    } else {
      PARTRAIN_CUDA_CHECK(cudaMemcpy2DAsync(rows, pitch, block, row, row, static_cast<std::size_t>(split.outer),
                                            cudaMemcpyDeviceToDevice, cuda.stream()));
    }
  }
}

// `tensor` as f32 on the device: itself, or an f32 copy of a bf16 tensor (`copy_values`: converted).
Tensor as_f32(CudaBackend& cuda, const Tensor& tensor, bool copy_values) {
  if (tensor.dtype() == DType::F32) return tensor;
  PARTRAIN_CHECK(tensor.dtype() == DType::BF16,
                 "sequence-parallel communication: CUDA kernels take f32 or bf16, got " << dtype_name(tensor.dtype()));
  Tensor wide = cuda.empty(tensor.shape(), DType::F32);
  if (copy_values) cuda.convert(wide, tensor);
  return wide;
}

// whole = every rank's part, gathered along the axis.
void gather_parts(const KernelContext& context, const Tensor& part, const Tensor& whole, const char* op) {
  const SequenceSplit split = kernels::sequence_split(context, part, whole, op);
  CudaBackend& cuda = cuda_of(context);
  TensorParallelGroup& group = group_of(context);
  const Tensor part_f32 = as_f32(cuda, part, true);
  const Tensor whole_f32 = as_f32(cuda, whole, false);
  const Tensor gathered = split.outer == 1 ? whole_f32 : cuda.empty({whole.numel()}, DType::F32);
  wait_unless_ordered(context, group);
  group.all_gather(part_f32, gathered);
  if (split.outer != 1) regroup(cuda, gathered.raw_data(), whole_f32.raw_data(), split, sizeof(float), false);
  if (whole.dtype() != DType::F32) cuda.convert(whole, whole_f32);
}

// part = the rank's part of the sum over the group of every rank's `whole`.
void reduce_scatter_parts(const KernelContext& context, const Tensor& whole, const Tensor& part, const char* op) {
  const SequenceSplit split = kernels::sequence_split(context, part, whole, op);
  CudaBackend& cuda = cuda_of(context);
  TensorParallelGroup& group = group_of(context);
  const Tensor whole_f32 = as_f32(cuda, whole, true);
  Tensor grouped = whole_f32;
  if (split.outer != 1) {
    grouped = cuda.empty({whole.numel()}, DType::F32);
    regroup(cuda, grouped.raw_data(), whole_f32.raw_data(), split, sizeof(float), true);
  }
  const Tensor part_f32 = as_f32(cuda, part, false);
  wait_unless_ordered(context, group);
  group.reduce_scatter(grouped, part_f32);
  if (part.dtype() != DType::F32) cuda.convert(part, part_f32);
}

// part = the rank's part of `whole` (any dtype; no communication).
void take_part(const KernelContext& context, const Tensor& whole, const Tensor& part, const char* op) {
  const SequenceSplit split = kernels::sequence_split(context, part, whole, op);
  const std::size_t row = static_cast<std::size_t>(split.chunk) * dtype_size(part.dtype());
  if (row == 0 || split.outer == 0) return;
  const char* source = static_cast<const char*>(whole.raw_data()) + static_cast<std::size_t>(split.rank) * row;
  PARTRAIN_CUDA_CHECK(cudaMemcpy2DAsync(part.raw_data(), row, source, static_cast<std::size_t>(split.parts) * row, row,
                                        static_cast<std::size_t>(split.outer), cudaMemcpyDeviceToDevice,
                                        cuda_of(context).stream()));
}

void sequence_all_gather_forward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out) {
  gather_parts(context, in[0], out[0], "SequenceParallelAllGather");
}
void sequence_all_gather_backward(const KernelContext& context, std::span<const Tensor>, std::span<const Tensor>,
                                  std::span<const Tensor> dout, std::span<const Tensor> din) {
  if (din[0].defined()) reduce_scatter_parts(context, dout[0], din[0], "SequenceParallelAllGather backward");
}
void sequence_reduce_scatter_forward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out) {
  reduce_scatter_parts(context, in[0], out[0], "SequenceParallelReduceScatter");
}
void sequence_reduce_scatter_backward(const KernelContext& context, std::span<const Tensor>, std::span<const Tensor>,
                                      std::span<const Tensor> dout, std::span<const Tensor> din) {
  if (din[0].defined()) gather_parts(context, dout[0], din[0], "SequenceParallelReduceScatter backward");
}
void sequence_scatter_forward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out) {
  take_part(context, in[0], out[0], "SequenceParallelScatter");
}
void sequence_scatter_backward(const KernelContext& context, std::span<const Tensor>, std::span<const Tensor>,
                               std::span<const Tensor> dout, std::span<const Tensor> din) {
  if (din[0].defined()) gather_parts(context, dout[0], din[0], "SequenceParallelScatter backward");
}
void sequence_gather_forward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out) {
  gather_parts(context, in[0], out[0], "SequenceParallelGather");
}
void sequence_gather_backward(const KernelContext& context, std::span<const Tensor>, std::span<const Tensor>,
                              std::span<const Tensor> dout, std::span<const Tensor> din) {
  if (din[0].defined()) take_part(context, dout[0], din[0], "SequenceParallelGather backward");
}

// ---------------- index and label checks ----------------
// One pass over `indices`: flags the lowest flat position whose value is outside [0, limit)
// (positions holding ignore_index excepted when `ignoring`) in `slot`, as the CPU reports the first
// bad position in row-major order; *counted += the positions whose value is not ignore_index (all
// of them without `ignoring`). Integer counts: the result is exact.
template <typename Index>
__global__ void scan_indices_kernel(const Index* __restrict__ indices, std::int64_t count, std::int64_t limit,
                                    bool ignoring, std::int64_t ignore_index, IndexCheckSlot* __restrict__ slot,
                                    unsigned long long* __restrict__ counted) {
  unsigned long long own = 0;
  PARTRAIN_GRID_STRIDE(i, count) {
    const auto value = static_cast<std::int64_t>(indices[i]);
    if (ignoring && value == ignore_index) continue;
    if (value < 0 || value >= limit) {
      flag_bad_position(slot, i);
      continue;
    }
    ++own;
  }
  for (int offset = 16; offset > 0; offset /= 2) own += __shfl_down_sync(0xffffffffu, own, offset);
  if (threadIdx.x % 32 == 0 && own > 0) atomicAdd(counted, own);
}

// The scan's count of the positions that are not ignore_index, on the device (the kernels that
// divide by it read it there: no host round trip).
struct IndexScan {
  Tensor words;
  unsigned long long* counted() const { return reinterpret_cast<unsigned long long*>(words.raw_data()); }
};

// Queues the scan of `indices` (i32 or i64; `what` names them in a dtype error) and its device
// check: a bad value becomes the error `describe` writes at the backend's next report (the step's
// end; at once under plain ordering), named after `op`. Nothing waits.
IndexScan launch_index_scan(CudaBackend& cuda, const Tensor& indices, const char* what, const char* op,
                            DeviceErrorFlags::Describe describe, std::int64_t limit, bool ignoring,
                            std::int64_t ignore_index) {
  const cudaStream_t stream = cuda.stream();
  IndexScan scan{cuda.empty({1}, DType::I64)};
  PARTRAIN_CUDA_CHECK(cudaMemsetAsync(scan.counted(), 0, sizeof(unsigned long long), stream));
  const std::int64_t count = indices.numel();
  dispatch_index(indices.dtype(), what, [&](auto tag) {
    using Index = decltype(tag);
    if (count == 0) return;
    IndexCheckSlot* slot = cuda.device_errors().reserve(op, std::move(describe));
    scan_indices_kernel<Index><<<blocks_for(count), kThreadsPerBlock, 0, stream>>>(
        device_data<Index>(indices), count, limit, ignoring, ignore_index, slot, scan.counted());
    PARTRAIN_CUDA_CHECK_LAUNCH();
    cuda.device_errors().record_bad_value(slot, indices);
  });
  return scan;
}

// ---------------- VocabParallelEmbedding ----------------
// The rank's vocabulary rows are [first, first + rows); queues the check of every index against
// [0, vocabulary) (rows · t less the vocabulary padding) and returns first.
std::int64_t embedding_first_row(const KernelContext& context, const Tensor& table, const Tensor& indices,
                                 const char* op) {
  TensorParallelGroup& group = group_of(context);
  CudaBackend& cuda = cuda_of(context);
  const std::int64_t rows = table.dim(0);
  const std::int64_t vocabulary =
      kernels::vocabulary_part(context.attributes, rows, group.rank(), group.size(), "VocabParallelEmbedding").vocabulary;
  const Shape shape = indices.shape();
  (void)launch_index_scan(
      cuda, indices, "VocabParallelEmbedding indices", op,
      [shape, vocabulary](std::int64_t index, std::int64_t position) {
        std::ostringstream message;
        message << "VocabParallelEmbedding index " << index << " at position "
                << kernels::position_string(position, shape) << " is out of range [0, " << vocabulary << ")";
        return message.str();
      },
      vocabulary, false, 0);
  return rows * group.rank();
}

// out[p, h] = table[indices[p] − first, h] for the rank's rows, 0 elsewhere.
template <typename T, typename Index>
__global__ void vocab_embedding_kernel(const T* __restrict__ table, const Index* __restrict__ indices,
                                       T* __restrict__ out, std::int64_t positions, std::int64_t hidden,
                                       std::int64_t first, std::int64_t rows) {
  PARTRAIN_GRID_STRIDE(i, positions * hidden) {
    const std::int64_t p = i / hidden;
    const std::int64_t h = i - p * hidden;
    const std::int64_t row = static_cast<std::int64_t>(indices[p]) - first;
    out[i] = row >= 0 && row < rows ? table[row * hidden + h] : from_float<T>(0.f);
  }
}

// dtable[indices[p] − first, h] += dy[p, h] for the rank's rows, fp32 atomics.
template <typename T, typename Index>
__global__ void vocab_embedding_backward_kernel(const T* __restrict__ dy, const Index* __restrict__ indices,
                                                float* __restrict__ dtable, std::int64_t positions,
                                                std::int64_t hidden, std::int64_t first, std::int64_t rows) {
  PARTRAIN_GRID_STRIDE(i, positions * hidden) {
    const std::int64_t p = i / hidden;
    const std::int64_t h = i - p * hidden;
    const std::int64_t row = static_cast<std::int64_t>(indices[p]) - first;
    if (row >= 0 && row < rows) atomicAdd(dtable + row * hidden + h, to_float(dy[i]));
  }
}

void embedding_forward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out) {
  const Tensor& table = in[0];
  const Tensor& indices = in[1];
  const Tensor& y = out[0];
  PARTRAIN_CHECK(table.rank() == 2 && y.dtype() == table.dtype() && y.numel() == indices.numel() * table.dim(1),
                 "VocabParallelEmbedding kernel got weight "
                     << shape_string(table.shape()) << " " << dtype_name(table.dtype()) << ", indices "
                     << shape_string(indices.shape()) << ", output " << shape_string(y.shape()) << " "
                     << dtype_name(y.dtype()));
  const std::int64_t first = embedding_first_row(context, table, indices, "VocabParallelEmbedding forward");
  const std::int64_t positions = indices.numel(), hidden = table.dim(1);
  if (positions * hidden == 0) return;
  const cudaStream_t stream = cuda_of(context).stream();
  dispatch_floating(table.dtype(), "VocabParallelEmbedding", [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(indices.dtype(), "VocabParallelEmbedding indices", [&](auto index_tag) {
      using Index = decltype(index_tag);
      vocab_embedding_kernel<T, Index><<<blocks_for(positions * hidden), kThreadsPerBlock, 0, stream>>>(
          device_data<T>(table), device_data<Index>(indices), device_data<T>(y), positions, hidden, first,
          table.dim(0));
      PARTRAIN_CUDA_CHECK_LAUNCH();
    });
  });
}

void embedding_backward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor>,
                        std::span<const Tensor> dout, std::span<const Tensor> din) {
  const Tensor& dtable = din[0];
  if (!dtable.defined()) return;
  const Tensor& indices = in[1];
  const Tensor& dy = dout[0];
  PARTRAIN_CHECK(dtable.rank() == 2 && dy.numel() == indices.numel() * dtable.dim(1),
                 "VocabParallelEmbedding backward got weight gradient "
                     << shape_string(dtable.shape()) << ", indices " << shape_string(indices.shape())
                     << ", output gradient " << shape_string(dy.shape()));
  CudaBackend& cuda = cuda_of(context);
  const cudaStream_t stream = cuda.stream();
  const std::int64_t first = embedding_first_row(context, in[0], indices, "VocabParallelEmbedding backward");
  const std::int64_t positions = indices.numel(), rows = dtable.dim(0), hidden = dtable.dim(1);
  // fp32 accumulation: into the gradient itself, or into an f32 copy rounded to bf16 once at the
  // end (bf16 atomics would round after every addition; the CPU adds in fp32 too).
  Tensor accumulator = dtable;
  if (dtable.dtype() != DType::F32) {
    PARTRAIN_CHECK(dtable.dtype() == DType::BF16, "VocabParallelEmbedding backward: CUDA kernels take f32 or bf16, got "
                                                      << dtype_name(dtable.dtype()));
    accumulator = cuda.empty(dtable.shape(), DType::F32);
  }
  cuda.fill_zero(accumulator);
  if (positions * hidden > 0) {
    dispatch_floating(dy.dtype(), "VocabParallelEmbedding backward", [&](auto tag) {
      using T = decltype(tag);
      dispatch_index(indices.dtype(), "VocabParallelEmbedding indices", [&](auto index_tag) {
        using Index = decltype(index_tag);
        vocab_embedding_backward_kernel<T, Index><<<blocks_for(positions * hidden), kThreadsPerBlock, 0, stream>>>(
            device_data<T>(dy), device_data<Index>(indices), device_data<float>(accumulator), positions, hidden, first,
            rows);
        PARTRAIN_CUDA_CHECK_LAUNCH();
      });
    });
  }
  if (accumulator.raw_data() != dtable.raw_data()) cuda.convert(dtable, accumulator);
}

// ---------------- VocabParallelCrossEntropy ----------------
struct CrossEntropyRows {
  std::int64_t classes = 0;  // the rank's classes
  std::int64_t real = 0;     // of those, the first `real` are not vocabulary padding (the rest take no part)
  std::int64_t rows = 0;
  std::int64_t first = 0;    // the rank's first class
  std::int64_t ignore_index = -100;
  IndexScan scan;  // on the device: the rows whose label is not ignore_index
};

// The rank's geometry; queues the check and the count of the labels (nothing waits). A label
// outside [0, C) that is not ignore_index becomes the CPU's error at the backend's next report.
CrossEntropyRows cross_entropy_rows(const KernelContext& context, const Tensor& logits, const Tensor& labels,
                                    const char* op) {
  TensorParallelGroup& group = group_of(context);
  CudaBackend& cuda = cuda_of(context);
  PARTRAIN_CHECK(logits.rank() >= 1, "VocabParallelCrossEntropy logits must have a class dimension");
  CrossEntropyRows dims;
  dims.classes = logits.dim(-1);
  dims.rows = labels.numel();
  PARTRAIN_CHECK(logits.numel() == dims.rows * dims.classes,
                 "VocabParallelCrossEntropy kernel got logits " << shape_string(logits.shape()) << " and labels "
                                                                << shape_string(labels.shape()));
  const kernels::VocabularyPart part =
      kernels::vocabulary_part(context.attributes, dims.classes, group.rank(), group.size(), "VocabParallelCrossEntropy");
  dims.first = part.first;
  dims.real = part.real;
  dims.ignore_index = context.attributes.get_int("ignore_index", -100);
  const std::int64_t all_classes = part.vocabulary;
  const Shape shape = labels.shape();
  dims.scan = launch_index_scan(
      cuda, labels, "VocabParallelCrossEntropy labels", op,
      [shape, all_classes](std::int64_t label, std::int64_t position) {
        std::ostringstream message;
        message << "VocabParallelCrossEntropy label " << label << " at position "
                << kernels::position_string(position, shape) << " is outside [0, " << all_classes
                << ") and is not ignore_index";
        return message.str();
      },
      all_classes, true, dims.ignore_index);
  return dims;
}

// Per row of the rank's logits: maximum[r] = max_j z[r, j] over its first `real` classes (the rest
// are vocabulary padding; −inf for none), target[r] = z[r, label − first] when the label is one of
// the rank's classes, else 0.
template <typename T, typename L, bool kWarp>
__global__ void __launch_bounds__(kWarp ? kThreadsPerBlock : kRowBlockThreads)
    local_max_target_kernel(const T* __restrict__ logits, const L* __restrict__ labels, float* __restrict__ maximum,
                            float* __restrict__ target, std::int64_t rows, std::int64_t classes, std::int64_t real,
                            std::int64_t first) {
  __shared__ float shared[32];
  using R = Rows<kWarp>;
  const int lane = R::lane(), width = R::width();
  for (std::int64_t row = R::first(); row < rows; row += R::step()) {
    const T* zr = logits + row * classes;
    float max = -INFINITY;
    for (std::int64_t j = lane; j < real; j += width) max = fmaxf(max, to_float(zr[j]));
    max = R::max(max, shared);
    if (lane == 0) {
      maximum[row] = max;
      const std::int64_t label = static_cast<std::int64_t>(labels[row]) - first;
      target[row] = label >= 0 && label < real ? to_float(zr[label]) : 0.f;
    }
  }
}

// sum[r] = Σ_j exp(z[r, j] − maximum[r]) over the rank's first `real` classes (maximum: the group's).
template <typename T, bool kWarp>
__global__ void __launch_bounds__(kWarp ? kThreadsPerBlock : kRowBlockThreads)
    local_sum_kernel(const T* __restrict__ logits, const float* __restrict__ maximum, float* __restrict__ sum,
                     std::int64_t rows, std::int64_t classes, std::int64_t real) {
  __shared__ float shared[32];
  using R = Rows<kWarp>;
  const int lane = R::lane(), width = R::width();
  for (std::int64_t row = R::first(); row < rows; row += R::step()) {
    const T* zr = logits + row * classes;
    const float max = maximum[row];
    float total = 0.f;
    for (std::int64_t j = lane; j < real; j += width) total += expf(to_float(zr[j]) - max);
    total = R::sum(total, shared);
    if (lane == 0) sum[row] = total;
  }
}

// One block, from the group's statistics: log_sum_exp[r] = log Σ + max (0 for ignored rows) and
// *loss = Σ over counted rows of (log_sum_exp − target) / counted, in double and a fixed order.
template <typename L>
__global__ void __launch_bounds__(1024)
    cross_entropy_finish_kernel(const L* __restrict__ labels, const float* __restrict__ maximum,
                                const float* __restrict__ sum, const float* __restrict__ target,
                                float* __restrict__ log_sum_exp, float* __restrict__ loss, std::int64_t rows,
                                std::int64_t ignore_index, const unsigned long long* __restrict__ counted_rows) {
  const double counted = static_cast<double>(*counted_rows);
  __shared__ double shared[32];
  double total = 0;
  for (std::int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    if (static_cast<std::int64_t>(labels[r]) == ignore_index) {
      log_sum_exp[r] = 0.f;
      continue;
    }
    const double value = log(static_cast<double>(sum[r])) + static_cast<double>(maximum[r]);
    log_sum_exp[r] = static_cast<float>(value);
    total += value - static_cast<double>(target[r]);
  }
  total = block_sum(total, shared);
  if (threadIdx.x == 0) *loss = counted > 0 ? static_cast<float>(total / counted) : 0.f;
}

constexpr int kFinishThreads = 1024;

void vocab_cross_entropy_forward(const KernelContext& context, std::span<const Tensor> in,
                                 std::span<const Tensor> out) {
  const Tensor& logits = in[0];
  const Tensor& labels = in[1];
  PARTRAIN_CHECK(out[0].dtype() == DType::F32 && out[0].numel() == 1 && out[1].dtype() == DType::F32 &&
                     out[1].numel() == labels.numel(),
                 "VocabParallelCrossEntropy outputs must be an f32 loss and f32 log_sum_exp of the labels' shape");
  CudaBackend& cuda = cuda_of(context);
  const cudaStream_t stream = cuda.stream();
  const CrossEntropyRows dims = cross_entropy_rows(context, logits, labels, "VocabParallelCrossEntropy forward");
  const std::int64_t rows = dims.rows, classes = dims.classes;
  // [0] row maxima, [1] sums of exponentials, [2] target logits: [1] and [2] are summed over the
  // group in one all-reduce.
  const Tensor statistics = cuda.empty({3, rows}, DType::F32);
  const Tensor maximum = statistics.slice_rows(0, 1), sum_and_target = statistics.slice_rows(1, 3);
  float* pm = device_data<float>(statistics);
  float* ps = pm + rows;
  float* pt = pm + 2 * rows;
  const RowLaunch launch = row_launch(rows, classes);
  dispatch_floating(logits.dtype(), "VocabParallelCrossEntropy", [&](auto logits_tag) {
    using T = decltype(logits_tag);
    dispatch_index(labels.dtype(), "VocabParallelCrossEntropy labels", [&](auto label_tag) {
      using L = decltype(label_tag);
      if (rows > 0) {
        dispatch_rows(launch, [&](auto warp) {
          local_max_target_kernel<T, L, decltype(warp)::value><<<launch.blocks, launch.threads, 0, stream>>>(
              device_data<T>(logits), device_data<L>(labels), pm, pt, rows, classes, dims.real, dims.first);
          PARTRAIN_CUDA_CHECK_LAUNCH();
        });
      }
      all_reduce_over_group(context, maximum, Reduction::Max);
      if (rows > 0) {
        dispatch_rows(launch, [&](auto warp) {
          local_sum_kernel<T, decltype(warp)::value><<<launch.blocks, launch.threads, 0, stream>>>(
              device_data<T>(logits), pm, ps, rows, classes, dims.real);
          PARTRAIN_CUDA_CHECK_LAUNCH();
        });
      }
      all_reduce_over_group(context, sum_and_target, Reduction::Sum);
      cross_entropy_finish_kernel<L><<<1, kFinishThreads, 0, stream>>>(device_data<L>(labels), pm, ps, pt,
                                                                       device_data<float>(out[1]),
                                                                       device_data<float>(out[0]), rows,
                                                                       dims.ignore_index, dims.scan.counted());
      PARTRAIN_CUDA_CHECK_LAUNCH();
    });
  });
}

// dlogits[r, j] = exp(z[r, j] − log_sum_exp[r])·scale, minus scale at the label's class when it is
// one of the rank's; 0 on ignored rows and in the vocabulary padding (j ≥ real). scale = dloss /
// counted (0 when nothing is counted); the loss gradient is the f32 scalar (bf16 accepted:
// loss_grad_is_bf16).
template <typename T, typename L>
__global__ void vocab_cross_entropy_backward_kernel(const T* __restrict__ logits, const L* __restrict__ labels,
                                                    const float* __restrict__ log_sum_exp, const void* loss_grad,
                                                    bool loss_grad_is_bf16, const unsigned long long* counted_rows,
                                                    T* __restrict__ dlogits, std::int64_t rows, std::int64_t classes,
                                                    std::int64_t real, std::int64_t first, std::int64_t ignore_index) {
  const float dloss = loss_grad_is_bf16 ? to_float(*static_cast<const __nv_bfloat16*>(loss_grad))
                                        : *static_cast<const float*>(loss_grad);
  const double counted = static_cast<double>(*counted_rows);
  const float scale = counted > 0 ? static_cast<float>(double(dloss) / counted) : 0.f;
  PARTRAIN_GRID_STRIDE(i, rows * classes) {
    const std::int64_t r = i / classes;
    const std::int64_t j = i - r * classes;
    const std::int64_t label = static_cast<std::int64_t>(labels[r]);
    float value = 0.f;
    if (label != ignore_index && j < real) {
      value = expf(to_float(logits[i]) - log_sum_exp[r]) * scale;
      if (label - first == j) value -= scale;
    }
    dlogits[i] = from_float<T>(value);
  }
}

void vocab_cross_entropy_backward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out,
                                  std::span<const Tensor> dout, std::span<const Tensor> din) {
  CudaBackend& cuda = cuda_of(context);
  const cudaStream_t stream = cuda.stream();
  if (din[1].defined()) cuda.fill_zero(din[1]);  // labels have no gradient
  if (!din[0].defined()) return;
  const Tensor& logits = in[0];
  const Tensor& labels = in[1];
  const CrossEntropyRows dims = cross_entropy_rows(context, logits, labels, "VocabParallelCrossEntropy backward");
  const Tensor& loss_grad = dout[0];
  PARTRAIN_CHECK((loss_grad.dtype() == DType::F32 || loss_grad.dtype() == DType::BF16) && loss_grad.numel() == 1,
                 "VocabParallelCrossEntropy backward: the loss gradient must be an f32 scalar, got "
                     << dtype_name(loss_grad.dtype()) << shape_string(loss_grad.shape()));
  const bool loss_grad_is_bf16 = loss_grad.dtype() == DType::BF16;
  const std::int64_t total = dims.rows * dims.classes;
  if (total == 0) return;
  dispatch_floating(logits.dtype(), "VocabParallelCrossEntropy backward", [&](auto logits_tag) {
    using T = decltype(logits_tag);
    dispatch_index(labels.dtype(), "VocabParallelCrossEntropy labels", [&](auto label_tag) {
      using L = decltype(label_tag);
      vocab_cross_entropy_backward_kernel<T, L><<<blocks_for(total), kThreadsPerBlock, 0, stream>>>(
          device_data<T>(logits), device_data<L>(labels), device_data<float>(out[1]), loss_grad.raw_data(),
          loss_grad_is_bf16, dims.scan.counted(), device_data<T>(din[0]), dims.rows, dims.classes, dims.real, dims.first,
          dims.ignore_index);
      PARTRAIN_CUDA_CHECK_LAUNCH();
    });
  });
}

#undef PARTRAIN_GRID_STRIDE

}  // namespace

void register_cuda_tensor_parallel_kernels(Backend& backend) {
  backend.set_kernels(OpType::TensorParallelCopy, {copy_forward, copy_backward});
  backend.set_kernels(OpType::TensorParallelAllReduce, {all_reduce_forward, all_reduce_backward});
  backend.set_kernels(OpType::VocabParallelEmbedding, {embedding_forward, embedding_backward});
  backend.set_kernels(OpType::VocabParallelCrossEntropy, {vocab_cross_entropy_forward, vocab_cross_entropy_backward});
  backend.set_kernels(OpType::SequenceParallelAllGather, {sequence_all_gather_forward, sequence_all_gather_backward});
  backend.set_kernels(OpType::SequenceParallelReduceScatter,
                      {sequence_reduce_scatter_forward, sequence_reduce_scatter_backward});
  backend.set_kernels(OpType::SequenceParallelScatter, {sequence_scatter_forward, sequence_scatter_backward});
  backend.set_kernels(OpType::SequenceParallelGather, {sequence_gather_forward, sequence_gather_backward});
}

}  // namespace partrain::cuda
