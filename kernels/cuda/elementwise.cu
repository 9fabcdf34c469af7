// CUDA kernels of the elementwise ops (schemas and semantics: src/graph/ops/elementwise.cpp;
// reference: kernels/cpu/elementwise.cpp; overview: kernels/cuda/elementwise.cuh).
#include "kernels/cuda/elementwise.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/rng.h"
#include "kernels/common/op_geometry.h"
#include "kernels/cuda/cuda_backend.cuh"
#include "kernels/cuda/cuda_common.cuh"

namespace partrain::cuda {

namespace {

// ---------------- broadcast layouts ----------------
constexpr int kMaxDims = 8;

// A coalesced view of the output shape with one stride vector per operand (0 where the operand is
// broadcast): size-1 dimensions are dropped and neighbours that are contiguous in every operand
// are merged, so [B, S, H] + [H] becomes [B·S, H] with strides (0, 1).
struct Layout {
  std::vector<std::int64_t> shape;
  std::vector<std::vector<std::int64_t>> strides;  // [operand][dimension]
};

// Per-operand strides come from kernels::broadcast_strides (numpy broadcasting, as on the CPU).
using kernels::broadcast_strides;

Layout coalesce(const Shape& output_shape, const std::vector<std::vector<std::int64_t>>& strides) {
  Layout layout;
  layout.strides.resize(strides.size());
  for (std::size_t d = 0; d < output_shape.size(); ++d) {
    const std::int64_t size = output_shape[d];
    if (size == 1) continue;
    bool merge = !layout.shape.empty();
    for (std::size_t k = 0; merge && k < strides.size(); ++k) merge = layout.strides[k].back() == strides[k][d] * size;
    if (merge) {
      layout.shape.back() *= size;
      for (std::size_t k = 0; k < strides.size(); ++k) layout.strides[k].back() = strides[k][d];
    } else {
      layout.shape.push_back(size);
      for (std::size_t k = 0; k < strides.size(); ++k) layout.strides[k].push_back(strides[k][d]);
    }
  }
  PARTRAIN_CHECK(layout.shape.size() <= kMaxDims,
                 "broadcast of output shape " << shape_string(output_shape) << " needs " << layout.shape.size()
                                              << " dimensions after merging; CUDA kernels take at most " << kMaxDims);
  return layout;
}

// Output shape and the strides of two operands, passed by value to the kernels.
struct BinaryIndex {
  int rank = 0;
  std::int64_t shape[kMaxDims] = {};
  std::int64_t stride_a[kMaxDims] = {};
  std::int64_t stride_b[kMaxDims] = {};
};

BinaryIndex binary_index(const Shape& output_shape, const Shape& a_shape, const Shape& b_shape) {
  const Layout layout =
      coalesce(output_shape, {broadcast_strides(a_shape, output_shape), broadcast_strides(b_shape, output_shape)});
  BinaryIndex index;
  index.rank = static_cast<int>(layout.shape.size());
  for (int d = 0; d < index.rank; ++d) {
    index.shape[d] = layout.shape[d];
    index.stride_a[d] = layout.strides[0][d];
    index.stride_b[d] = layout.strides[1][d];
  }
  return index;
}

// Grid-stride loop bounds.
__device__ inline std::int64_t global_thread() { return std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline std::int64_t grid_threads() { return std::int64_t(gridDim.x) * blockDim.x; }

// ---------------- Add, Sub, Mul forward ----------------
struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct SubOp {
  __device__ float operator()(float a, float b) const { return a - b; }
};
struct MulOp {
  __device__ float operator()(float a, float b) const { return a * b; }
};
// sign · a · b: the gradient dy · other of Mul (sign 1), used with the broadcast of `other`.
struct ScaledMulOp {
  float sign;
  __device__ float operator()(float a, float b) const { return sign * (a * b); }
};

template <typename T, typename Op>
__global__ void binary_same_shape_kernel(const T* a, const T* b, T* y, std::int64_t n, Op op) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads())
    y[i] = from_float<T>(op(to_float(a[i]), to_float(b[i])));
}

template <typename T, typename Op>
__global__ void binary_broadcast_kernel(const T* a, const T* b, T* y, std::int64_t n, BinaryIndex index, Op op) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    std::int64_t rest = i, offset_a = 0, offset_b = 0;
    for (int d = index.rank - 1; d >= 0; --d) {
      const std::int64_t coordinate = rest % index.shape[d];
      rest /= index.shape[d];
      offset_a += coordinate * index.stride_a[d];
      offset_b += coordinate * index.stride_b[d];
    }
    y[i] = from_float<T>(op(to_float(a[offset_a]), to_float(b[offset_b])));
  }
}

// y[output_shape] = op(a broadcast, b broadcast) on `stream`.
template <typename T, typename Op>
void launch_binary(const Tensor& a, const Tensor& b, const Tensor& y, Op op, cudaStream_t stream) {
  const std::int64_t n = y.numel();
  if (n == 0) return;
  const T* pa = device_data<T>(a);
  const T* pb = device_data<T>(b);
  T* py = device_data<T>(y);
  if (a.shape() == y.shape() && b.shape() == y.shape()) {
    binary_same_shape_kernel<T><<<blocks_for(n), kThreadsPerBlock, 0, stream>>>(pa, pb, py, n, op);
  } else {
    const BinaryIndex index = binary_index(y.shape(), a.shape(), b.shape());
    binary_broadcast_kernel<T><<<blocks_for(n), kThreadsPerBlock, 0, stream>>>(pa, pb, py, n, index, op);
  }
  PARTRAIN_CUDA_CHECK_LAUNCH();
}

template <typename Op>
void binary_forward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                    Op op, const char* what) {
  dispatch_floating(outputs[0].dtype(), what, [&](auto tag) {
    using T = decltype(tag);
    launch_binary<T>(inputs[0], inputs[1], outputs[0], op, cuda_of(context).stream());
  });
}

void add_forward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out) {
  binary_forward(context, in, out, AddOp{}, "Add");
}
void sub_forward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out) {
  binary_forward(context, in, out, SubOp{}, "Sub");
}
void mul_forward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out) {
  binary_forward(context, in, out, MulOp{}, "Mul");
}

// ---------------- gradients of broadcast operands ----------------
// gradient = sign · Σ over the broadcast dimensions of dy (· other, broadcast, when given).
// Deterministic: every sum has a fixed order that depends only on the shapes.

template <typename T>
__global__ void scale_copy_kernel(const T* x, T* y, std::int64_t n, float factor) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) y[i] = from_float<T>(factor * to_float(x[i]));
}

// Column sums of dy viewed as [rows, cols] (only leading dimensions broadcast). Phase 1: block
// (32 columns × 8 row lanes) sums rows [chunk·chunk_rows, +chunk_rows) of 32 columns into
// partial[chunk, column]; phase 2 adds the chunks in order.
constexpr int kColumnTile = 32;
constexpr int kRowLanes = 8;

template <typename T, bool kWeighted>
__global__ void column_partial_kernel(const T* dy, const T* weight, float* partial, std::int64_t rows,
                                      std::int64_t cols, std::int64_t chunk_rows, std::int64_t weight_row_stride,
                                      std::int64_t weight_col_stride) {
  __shared__ float tile[kRowLanes][kColumnTile + 1];
  const std::int64_t column = std::int64_t(blockIdx.x) * kColumnTile + threadIdx.x;
  const std::int64_t chunk = blockIdx.y;
  const std::int64_t begin = chunk * chunk_rows;
  const std::int64_t end = begin + chunk_rows < rows ? begin + chunk_rows : rows;
  float sum = 0.f;
  if (column < cols) {
    for (std::int64_t r = begin + threadIdx.y; r < end; r += kRowLanes) {
      float value = to_float(dy[r * cols + column]);
      if constexpr (kWeighted) value *= to_float(weight[r * weight_row_stride + column * weight_col_stride]);
      sum += value;
    }
  }
  tile[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && column < cols) {
    float total = 0.f;
    for (int lane = 0; lane < kRowLanes; ++lane) total += tile[lane][threadIdx.x];
    partial[chunk * cols + column] = total;
  }
}

template <typename T>
__global__ void column_finish_kernel(const float* partial, T* gradient, std::int64_t cols, std::int64_t chunks,
                                     float sign) {
  for (std::int64_t column = global_thread(); column < cols; column += grid_threads()) {
    float total = 0.f;
    for (std::int64_t chunk = 0; chunk < chunks; ++chunk) total += partial[chunk * cols + column];
    gradient[column] = from_float<T>(sign * total);
  }
}

// General case: the dimensions of the coalesced output split into kept ones (the gradient's) and
// reduced ones; one warp per gradient element, lanes stride over the reduced index space.
struct ReduceIndex {
  int kept_rank = 0, reduced_rank = 0;
  std::int64_t kept_size[kMaxDims] = {}, kept_dy[kMaxDims] = {}, kept_weight[kMaxDims] = {};
  std::int64_t reduced_size[kMaxDims] = {}, reduced_dy[kMaxDims] = {}, reduced_weight[kMaxDims] = {};
};

template <typename T, bool kWeighted>
__global__ void reduce_general_kernel(const T* dy, const T* weight, T* gradient, std::int64_t gradient_size,
                                      std::int64_t reduced_count, ReduceIndex index, float sign) {
  const int lane = threadIdx.x % 32;
  const std::int64_t warps = grid_threads() / 32;
  for (std::int64_t j = global_thread() / 32; j < gradient_size; j += warps) {
    std::int64_t rest = j, dy_base = 0, weight_base = 0;
    for (int d = index.kept_rank - 1; d >= 0; --d) {
      const std::int64_t coordinate = rest % index.kept_size[d];
      rest /= index.kept_size[d];
      dy_base += coordinate * index.kept_dy[d];
      weight_base += coordinate * index.kept_weight[d];
    }
    float sum = 0.f;
    for (std::int64_t k = lane; k < reduced_count; k += 32) {
      std::int64_t inner = k, dy_offset = dy_base, weight_offset = weight_base;
      for (int d = index.reduced_rank - 1; d >= 0; --d) {
        const std::int64_t coordinate = inner % index.reduced_size[d];
        inner /= index.reduced_size[d];
        dy_offset += coordinate * index.reduced_dy[d];
        weight_offset += coordinate * index.reduced_weight[d];
      }
      float value = to_float(dy[dy_offset]);
      if constexpr (kWeighted) value *= to_float(weight[weight_offset]);
      sum += value;
    }
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) gradient[j] = from_float<T>(sign * sum);
  }
}

// gradient (the shape of a broadcast operand) = sign · Σ_broadcast dy · other, where `other` (the
// other operand of Mul, or undefined) is broadcast to dy's shape. Overwrites `gradient`.
template <typename T>
void reduce_to_operand(const KernelContext& context, const Tensor& gradient, const Tensor& output_grad,
                       const Tensor& other, float sign) {
  CudaBackend& backend = cuda_of(context);
  const cudaStream_t stream = backend.stream();
  const Shape& output_shape = output_grad.shape();
  const std::int64_t n = output_grad.numel();
  const std::int64_t m = gradient.numel();
  T* grad = device_data<T>(gradient);
  if (m == 0) return;
  if (n == 0) {  // an empty broadcast dimension: the sum is empty
    PARTRAIN_CUDA_CHECK(cudaMemsetAsync(grad, 0, gradient.nbytes(), stream));
    return;
  }
  const T* dy = device_data<T>(output_grad);
  const bool weighted = other.defined();
  const T* weight = weighted ? device_data<T>(other) : nullptr;

  if (m == n) {  // no dimension is reduced: same layout as dy (up to size-1 dimensions)
    if (weighted) {
      const BinaryIndex index = binary_index(output_shape, output_shape, other.shape());
      binary_broadcast_kernel<T>
          <<<blocks_for(n), kThreadsPerBlock, 0, stream>>>(dy, weight, grad, n, index, ScaledMulOp{sign});
    } else {
      scale_copy_kernel<T><<<blocks_for(n), kThreadsPerBlock, 0, stream>>>(dy, grad, n, sign);
    }
    PARTRAIN_CUDA_CHECK_LAUNCH();
    return;
  }

  std::vector<std::vector<std::int64_t>> strides = {contiguous_strides(output_shape),
                                                    broadcast_strides(gradient.shape(), output_shape)};
  strides.push_back(weighted ? broadcast_strides(other.shape(), output_shape)
                             : std::vector<std::int64_t>(output_shape.size(), 0));
  const Layout layout = coalesce(output_shape, strides);
  const std::vector<std::int64_t>& dy_strides = layout.strides[0];
  const std::vector<std::int64_t>& grad_strides = layout.strides[1];
  const std::vector<std::int64_t>& weight_strides = layout.strides[2];
  const std::size_t rank = layout.shape.size();

  // Only leading dimensions reduced: [rows, cols] column sums (cols = 1 when everything is).
  const bool leading_only =
      (rank == 1 && grad_strides[0] == 0) || (rank == 2 && grad_strides[0] == 0 && grad_strides[1] != 0);
  if (leading_only) {
    const std::int64_t rows = layout.shape[0];
    const std::int64_t cols = rank == 2 ? layout.shape[1] : 1;
    const std::int64_t column_blocks = (cols + kColumnTile - 1) / kColumnTile;
    // Enough blocks to fill the GPU, at least 64 rows per chunk; fixed by the shape alone.
    const std::int64_t max_chunks = std::max<std::int64_t>(1, std::min<std::int64_t>(1024, 2048 / column_blocks));
    const std::int64_t wanted = std::min(max_chunks, (rows + 63) / 64);
    const std::int64_t chunk_rows = (rows + wanted - 1) / wanted;
    const std::int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
    const Tensor partial = backend.empty({chunks * cols}, DType::F32);
    float* partial_data = device_data<float>(partial);
    const std::int64_t weight_row = weight_strides[0];
    const std::int64_t weight_col = rank == 2 ? weight_strides[1] : 0;
    const dim3 grid(static_cast<unsigned int>(column_blocks), static_cast<unsigned int>(chunks));
    const dim3 block(kColumnTile, kRowLanes);
    if (weighted)
      column_partial_kernel<T, true>
          <<<grid, block, 0, stream>>>(dy, weight, partial_data, rows, cols, chunk_rows, weight_row, weight_col);
    else
      column_partial_kernel<T, false>
          <<<grid, block, 0, stream>>>(dy, weight, partial_data, rows, cols, chunk_rows, weight_row, weight_col);
    PARTRAIN_CUDA_CHECK_LAUNCH();
    column_finish_kernel<T><<<blocks_for(cols), kThreadsPerBlock, 0, stream>>>(partial_data, grad, cols, chunks, sign);
    PARTRAIN_CUDA_CHECK_LAUNCH();
    return;
  }

  ReduceIndex index;
  for (std::size_t d = 0; d < rank; ++d) {
    if (grad_strides[d] != 0) {
      index.kept_size[index.kept_rank] = layout.shape[d];
      index.kept_dy[index.kept_rank] = dy_strides[d];
      index.kept_weight[index.kept_rank] = weight_strides[d];
      ++index.kept_rank;
    } else {
      index.reduced_size[index.reduced_rank] = layout.shape[d];
      index.reduced_dy[index.reduced_rank] = dy_strides[d];
      index.reduced_weight[index.reduced_rank] = weight_strides[d];
      ++index.reduced_rank;
    }
  }
  const std::int64_t reduced_count = n / m;
  const unsigned int blocks = blocks_for(m * 32);
  if (weighted)
    reduce_general_kernel<T, true>
        <<<blocks, kThreadsPerBlock, 0, stream>>>(dy, weight, grad, m, reduced_count, index, sign);
  else
    reduce_general_kernel<T, false>
        <<<blocks, kThreadsPerBlock, 0, stream>>>(dy, weight, grad, m, reduced_count, index, sign);
  PARTRAIN_CUDA_CHECK_LAUNCH();
}

// da = Σ dy (· b), db = sign_b · Σ dy (· a): Add (sign 1, unweighted), Sub (sign -1), Mul (weighted).
void binary_backward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> output_grads,
                     std::span<const Tensor> input_grads, bool weighted, float sign_b, const char* what) {
  dispatch_floating(output_grads[0].dtype(), what, [&](auto tag) {
    using T = decltype(tag);
    if (input_grads[0].defined())
      reduce_to_operand<T>(context, input_grads[0], output_grads[0], weighted ? inputs[1] : Tensor(), 1.f);
    if (input_grads[1].defined())
      reduce_to_operand<T>(context, input_grads[1], output_grads[0], weighted ? inputs[0] : Tensor(), sign_b);
  });
}

void add_backward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor>,
                  std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  binary_backward(context, inputs, output_grads, input_grads, false, 1.f, "Add backward");
}
void sub_backward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor>,
                  std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  binary_backward(context, inputs, output_grads, input_grads, false, -1.f, "Sub backward");
}
void mul_backward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor>,
                  std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  binary_backward(context, inputs, output_grads, input_grads, true, 1.f, "Mul backward");
}

// ---------------- unary ops: y = f(x), dx = dy · f'(x, y) ----------------
template <typename T, typename Function>
__global__ void unary_forward_kernel(const T* x, T* y, std::int64_t n, Function function) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) y[i] = from_float<T>(function(to_float(x[i])));
}

// kReadsInput / kReadsOutput: whether the derivative uses x / y — exactly the op's saved tensors
// (OpSchema::saved_inputs / saved_outputs); the other pointer is null (shape-only after the forward).
template <typename T, bool kReadsInput, bool kReadsOutput, typename Derivative>
__global__ void unary_backward_kernel(const T* x, const T* y, const T* dy, T* dx, std::int64_t n,
                                      Derivative derivative) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads())
    dx[i] = from_float<T>(to_float(dy[i]) * derivative(kReadsInput ? to_float(x[i]) : 0.f,
                                                         kReadsOutput ? to_float(y[i]) : 0.f));
}

template <typename Function>
void unary_forward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                   Function function, const char* what) {
  const std::int64_t n = outputs[0].numel();
  if (n == 0) return;
  dispatch_floating(outputs[0].dtype(), what, [&](auto tag) {
    using T = decltype(tag);
    unary_forward_kernel<T><<<blocks_for(n), kThreadsPerBlock, 0, cuda_of(context).stream()>>>(
        device_data<T>(inputs[0]), device_data<T>(outputs[0]), n, function);
    PARTRAIN_CUDA_CHECK_LAUNCH();
  });
}

template <bool kReadsInput, bool kReadsOutput, typename Derivative>
void unary_backward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                    std::span<const Tensor> output_grads, std::span<const Tensor> input_grads, Derivative derivative,
                    const char* what) {
  if (!input_grads[0].defined()) return;
  const std::int64_t n = inputs[0].numel();
  if (n == 0) return;
  dispatch_floating(inputs[0].dtype(), what, [&](auto tag) {
    using T = decltype(tag);
    unary_backward_kernel<T, kReadsInput, kReadsOutput><<<blocks_for(n), kThreadsPerBlock, 0, cuda_of(context).stream()>>>(
        kReadsInput ? device_data<T>(inputs[0]) : nullptr, kReadsOutput ? device_data<T>(outputs[0]) : nullptr,
        device_data<T>(output_grads[0]), device_data<T>(input_grads[0]), n, derivative);
    PARTRAIN_CUDA_CHECK_LAUNCH();
  });
}

struct ScaleFunction {
  float value;
  __device__ float operator()(float x) const { return x * value; }
};
struct ScaleDerivative {
  float value;
  __device__ float operator()(float, float) const { return value; }
};

void scale_forward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out) {
  const float value = static_cast<float>(context.attributes.get_float("value"));
  unary_forward(context, in, out, ScaleFunction{value}, "Scale");
}
void scale_backward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out,
                    std::span<const Tensor> dout, std::span<const Tensor> din) {
  const float value = static_cast<float>(context.attributes.get_float("value"));
  unary_backward<false, false>(context, in, out, dout, din, ScaleDerivative{value}, "Scale backward");
}

struct ReluFunction {
  __device__ float operator()(float x) const { return x > 0 ? x : 0.f; }
};
struct ReluDerivative {
  __device__ float operator()(float x, float) const { return x > 0 ? 1.f : 0.f; }
};

void relu_forward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out) {
  unary_forward(context, in, out, ReluFunction{}, "Relu");
}
void relu_backward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out,
                   std::span<const Tensor> dout, std::span<const Tensor> din) {
  unary_backward<true, false>(context, in, out, dout, din, ReluDerivative{}, "Relu backward");
}

struct TanhFunction {
  __device__ float operator()(float x) const { return tanhf(x); }
};
struct TanhDerivative {  // from the stored output, as the CPU kernel
  __device__ float operator()(float, float y) const { return 1.f - y * y; }
};

void tanh_forward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out) {
  unary_forward(context, in, out, TanhFunction{}, "Tanh");
}
void tanh_backward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out,
                   std::span<const Tensor> dout, std::span<const Tensor> din) {
  unary_backward<false, true>(context, in, out, dout, din, TanhDerivative{}, "Tanh backward");
}

// GELU (Hendrycks & Gimpel 2016): exact x·Φ(x) or the tanh approximation, constants as the CPU's.
constexpr float kSqrtTwoOverPi = 0.7978845608028654f;
constexpr float kInverseSqrtTwo = 0.7071067811865476f;
constexpr float kInverseSqrtTwoPi = 0.3989422804014327f;
constexpr float kGeluCubic = 0.044715f;

struct GeluErf {
  __device__ float operator()(float x) const { return 0.5f * x * (1.f + erff(x * kInverseSqrtTwo)); }
};
struct GeluErfDerivative {
  __device__ float operator()(float x, float) const {
    return 0.5f * (1.f + erff(x * kInverseSqrtTwo)) + x * kInverseSqrtTwoPi * expf(-0.5f * x * x);
  }
};
struct GeluTanh {
  __device__ float operator()(float x) const {
    return 0.5f * x * (1.f + tanhf(kSqrtTwoOverPi * (x + kGeluCubic * x * x * x)));
  }
};
struct GeluTanhDerivative {
  __device__ float operator()(float x, float) const {
    const float t = tanhf(kSqrtTwoOverPi * (x + kGeluCubic * x * x * x));
    return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * kSqrtTwoOverPi * (1.f + 3.f * kGeluCubic * x * x);
  }
};

bool gelu_uses_tanh(const KernelContext& context) {
  return context.attributes.get_string("approximate", "none") == "tanh";
}

void gelu_forward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out) {
  if (gelu_uses_tanh(context))
    unary_forward(context, in, out, GeluTanh{}, "Gelu");
  else
    unary_forward(context, in, out, GeluErf{}, "Gelu");
}
void gelu_backward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out,
                   std::span<const Tensor> dout, std::span<const Tensor> din) {
  if (gelu_uses_tanh(context))
    unary_backward<true, false>(context, in, out, dout, din, GeluTanhDerivative{}, "Gelu backward");
  else
    unary_backward<true, false>(context, in, out, dout, din, GeluErfDerivative{}, "Gelu backward");
}

// ---------------- Dropout (counter-based masks, regenerated in backward) ----------------
// Element i belongs to sample i / per_sample (dimension 0 is the batch) and is element
// i % per_sample of it: the CPU kernel's indexing, so the masks are bit-identical.
template <typename T>
__global__ void dropout_kernel(const T* x, T* y, std::int64_t n, std::int64_t per_sample, float p, float keep_scale,
                               RandomContext random, std::uint64_t first_element) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    const auto sample = static_cast<std::uint32_t>(i / per_sample);
    const float u = random_uniform(random, sample, first_element + static_cast<std::uint64_t>(i % per_sample));
    y[i] = from_float<T>(to_float(x[i]) * (u >= p ? keep_scale : 0.f));
  }
}

// destination = source · mask / (1 - p) in training, source otherwise (forward: x → y; backward:
// dy → dx with the same mask, which depends only on the counter).
void apply_dropout(const KernelContext& context, const Tensor& source, const Tensor& destination, const Tensor& x,
                   const char* what) {
  const cudaStream_t stream = cuda_of(context).stream();
  const std::int64_t n = source.numel();
  if (n == 0) return;
  const double p_attribute = context.attributes.get_float("p");
  if (!context.training || p_attribute == 0) {
    PARTRAIN_CHECK(source.dtype() == destination.dtype(), what << ": dtypes differ");
    PARTRAIN_CUDA_CHECK(
        cudaMemcpyAsync(destination.raw_data(), source.raw_data(), source.nbytes(), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  const float p = static_cast<float>(p_attribute);
  const float keep_scale = 1.f / (1.f - p);
  const std::int64_t per_sample = x.rank() > 0 && x.dim(0) > 0 ? n / x.dim(0) : n;
  const std::uint64_t first_element = kernels::dropout_first_element(context, per_sample);  // tensor-parallel part
  dispatch_floating(source.dtype(), what, [&](auto tag) {
    using T = decltype(tag);
    dropout_kernel<T><<<blocks_for(n), kThreadsPerBlock, 0, stream>>>(
        device_data<T>(source), device_data<T>(destination), n, per_sample, p, keep_scale, context.random, first_element);
    PARTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void dropout_forward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out) {
  apply_dropout(context, in[0], out[0], in[0], "Dropout");
}
void dropout_backward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor>,
                      std::span<const Tensor> dout, std::span<const Tensor> din) {
  if (!din[0].defined()) return;
  apply_dropout(context, dout[0], din[0], in[0], "Dropout backward");
}

}  // namespace

void register_cuda_elementwise_kernels(Backend& backend) {
  backend.set_kernels(OpType::Add, {add_forward, add_backward});
  backend.set_kernels(OpType::Sub, {sub_forward, sub_backward});
  backend.set_kernels(OpType::Mul, {mul_forward, mul_backward});
  backend.set_kernels(OpType::Scale, {scale_forward, scale_backward});
  backend.set_kernels(OpType::Relu, {relu_forward, relu_backward});
  backend.set_kernels(OpType::Tanh, {tanh_forward, tanh_backward});
  backend.set_kernels(OpType::Gelu, {gelu_forward, gelu_backward});
  backend.set_kernels(OpType::Dropout, {dropout_forward, dropout_backward});
}

}  // namespace partrain::cuda
