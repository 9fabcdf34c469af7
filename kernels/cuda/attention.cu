// CUDA kernels of the attention ops (schemas and semantics: src/graph/ops/attention.cpp; reference:
// kernels/cpu/attention.cpp; overview: attention.cuh). Products go through gemm() (gemm.cuh);
// the masked softmax and its backward are own kernels, one thread block per score row.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/common/op_geometry.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/gemm.cuh"

namespace partrain::cuda {

namespace {

// Element strides of the mask over the scores [B, h, S, T] (0 along broadcast dimensions).
struct MaskStrides {
  std::int64_t batch = 0, head = 0, query = 0, key = 0;
};

// Sizes, scale and causality (kernels::AttentionShape) plus dtypes and the mask's device view.
struct AttentionDims : kernels::AttentionShape {
  DType dtype = DType::F32;  // of q, k, v, y and their gradients
  const void* mask = nullptr;
  DType mask_dtype = DType::F32;
  MaskStrides mask_strides;
};

void* device_pointer(const Tensor& tensor) {
  PARTRAIN_CHECK(!tensor.device().is_cpu(), "CUDA attention kernel given a host tensor");
  return tensor.raw_data();
}

void check_dtype(const Tensor& tensor, DType dtype, const char* what) {
  PARTRAIN_CHECK(tensor.dtype() == dtype, "Attention " << what << " has dtype " << dtype_name(tensor.dtype())
                                                       << ", expected " << dtype_name(dtype));
}

AttentionDims attention_dims(const KernelContext& context, std::span<const Tensor> inputs) {
  AttentionDims dims;
  static_cast<kernels::AttentionShape&>(dims) = kernels::attention_shape(context.attributes, inputs);
  dims.dtype = inputs[0].dtype();
  PARTRAIN_CHECK(is_floating(dims.dtype), "Attention q must be f32 or bf16, got " << dtype_name(dims.dtype));
  check_dtype(inputs[1], dims.dtype, "k");
  check_dtype(inputs[2], dims.dtype, "v");
  if (inputs.size() > 3 && inputs[3].defined()) {
    const Tensor& mask = inputs[3];
    PARTRAIN_CHECK(is_floating(mask.dtype()), "Attention mask must be f32 or bf16, got " << dtype_name(mask.dtype()));
    const Shape& shape = mask.shape();
    PARTRAIN_CHECK(shape.size() <= 4, "Attention mask " << shape_string(shape) << " has rank > 4");
    // Trailing dimensions aligned, size-1 dimensions of the mask stride 0 where the scores are larger.
    const std::vector<std::int64_t> strides =
        kernels::broadcast_strides(shape, {dims.batch, dims.heads, dims.s, dims.t});
    dims.mask = device_pointer(mask);
    dims.mask_dtype = mask.dtype();
    dims.mask_strides = {strides[0], strides[1], strides[2], strides[3]};
  }
  return dims;
}

const void* advance(const void* pointer, std::int64_t elements, DType dtype) {
  return static_cast<const char*>(pointer) + elements * static_cast<std::int64_t>(dtype_size(dtype));
}
void* advance(void* pointer, std::int64_t elements, DType dtype) {
  return static_cast<char*>(pointer) + elements * static_cast<std::int64_t>(dtype_size(dtype));
}

// A scratch buffer of `count` floats (at least one, so that empty problems get a valid pointer).
Tensor float_scratch(const CudaBackend& backend, std::int64_t count) {
  return backend.scratch(static_cast<std::size_t>(std::max<std::int64_t>(count, 1)) * sizeof(float));
}
float* floats(const Tensor& scratch) { return static_cast<float*>(scratch.raw_data()); }

// Pairs per chunk such that the per-pair scratch (`floats_per_pair`) stays within 512 MiB (at
// least one pair): bounds the S x T score buffers of long sequences.
std::int64_t pairs_per_chunk(std::int64_t pairs, std::int64_t floats_per_pair) {
  constexpr std::int64_t kBudgetFloats = (std::int64_t{512} << 20) / static_cast<std::int64_t>(sizeof(float));
  return std::max<std::int64_t>(1, std::min(pairs, kBudgetFloats / std::max<std::int64_t>(floats_per_pair, 1)));
}

// One strided-batched product over `count` pairs: c_i = alpha op(a_i) op(b_i).
void pair_product(const CudaBackend& backend, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
                  std::int64_t k, float alpha, std::int64_t count, DType ab_dtype, const void* a,
                  std::int64_t stride_a, const void* b, std::int64_t stride_b, float* c, std::int64_t stride_c) {
  GemmProblem p;
  p.trans_a = trans_a;
  p.trans_b = trans_b;
  p.m = m;
  p.n = n;
  p.k = k;
  p.batch = count;
  p.alpha = alpha;
  p.ab_dtype = ab_dtype;
  p.c_dtype = DType::F32;  // scores, probabilities and gradients before their single rounding
  p.a = a;
  p.stride_a = stride_a;
  p.b = b;
  p.stride_b = stride_b;
  p.c = c;
  p.stride_c = stride_c;
  gemm(backend, p);
}

// ---------------- kernels ----------------
// Threads per row kernel: a multiple of 32 (block_sum / block_max), about one element per thread
// for short rows, at most 512.
constexpr int kMaxRowThreads = 512;  // row_threads' ceiling; the row kernels' __launch_bounds__

int row_threads(std::int64_t t) {
  const std::int64_t threads = (t + 31) / 32 * 32;
  return static_cast<int>(std::clamp<std::int64_t>(threads, 32, kMaxRowThreads));
}
unsigned int row_blocks(std::int64_t rows) { return static_cast<unsigned int>(std::min<std::int64_t>(rows, 1 << 20)); }

// In place on scores [rows, T] (row = (pair - first_pair) * S + query): p = softmax over the
// visible keys of (score + mask), 0 for hidden keys; key j is hidden by the causal rule when
// j > i + (T - S). A row whose every visible score is -inf becomes all zeros. fp32 throughout.
template <typename M>
__global__ void __launch_bounds__(kMaxRowThreads) masked_softmax_kernel(float* scores, std::int64_t rows, std::int64_t s, std::int64_t t,
                                      std::int64_t first_pair, std::int64_t heads, bool causal, const M* mask,
                                      MaskStrides strides) {
  __shared__ float shared[32];
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const std::int64_t pair = first_pair + row / s;
    const std::int64_t query = row % s;
    float* p = scores + row * t;
    std::int64_t visible = t;
    if (causal) {
      visible = query + (t - s) + 1;
      visible = visible < 0 ? 0 : (visible > t ? t : visible);
    }
    const M* mask_row =
        mask ? mask + (pair / heads) * strides.batch + (pair % heads) * strides.head + query * strides.query : nullptr;
    float max = -INFINITY;
    for (std::int64_t j = threadIdx.x; j < visible; j += blockDim.x) {
      float x = p[j];
      if (mask_row) x += to_float(mask_row[j * strides.key]);
      p[j] = x;
      max = fmaxf(max, x);
    }
    max = block_max(max, shared);
    if (max == -INFINITY) {  // nothing visible (same value in every thread: uniform branch)
      for (std::int64_t j = threadIdx.x; j < t; j += blockDim.x) p[j] = 0.f;
      continue;
    }
    float sum = 0.f;
    for (std::int64_t j = threadIdx.x; j < visible; j += blockDim.x) {
      const float e = expf(p[j] - max);
      p[j] = e;
      sum += e;
    }
    sum = block_sum(sum, shared);
    const float inverse = 1.f / sum;
    for (std::int64_t j = threadIdx.x; j < t; j += blockDim.x) p[j] = j < visible ? p[j] * inverse : 0.f;
  }
}

// In place on grads [rows, T] (dP on entry): dS = P * (dP - sum_j dP_j P_j), row by row.
__global__ void __launch_bounds__(kMaxRowThreads) softmax_backward_kernel(const float* probabilities, float* grads, std::int64_t rows, std::int64_t t) {
  __shared__ float shared[32];
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* p = probabilities + row * t;
    float* g = grads + row * t;
    float dot = 0.f;
    for (std::int64_t j = threadIdx.x; j < t; j += blockDim.x) dot += g[j] * p[j];
    dot = block_sum(dot, shared);
    for (std::int64_t j = threadIdx.x; j < t; j += blockDim.x) g[j] = p[j] * (g[j] - dot);
  }
}

// p [count, S, T] = softmax(scale q k^T + mask) of pairs [first, first + count), fp32.
void probabilities(const CudaBackend& backend, const AttentionDims& dims, std::int64_t first, std::int64_t count,
                   const void* q, const void* k, float* p) {
  const std::int64_t s = dims.s, t = dims.t, d = dims.d;
  pair_product(backend, false, true, s, t, d, dims.scale, count, dims.dtype, advance(q, first * s * d, dims.dtype),
               s * d, advance(k, first * t * d, dims.dtype), t * d, p, s * t);
  const std::int64_t rows = count * s;
  if (rows == 0 || t == 0) return;
  const auto launch = [&](auto mask_tag) {
    using M = decltype(mask_tag);
    masked_softmax_kernel<M><<<row_blocks(rows), row_threads(t), 0, backend.stream()>>>(
        p, rows, s, t, first, dims.heads, dims.causal, static_cast<const M*>(dims.mask), dims.mask_strides);
    PARTRAIN_CUDA_CHECK_LAUNCH();
  };
  if (dims.mask) dispatch_floating(dims.mask_dtype, "Attention mask", launch);
  else launch(float{});
}

// An fp32 view of `count` elements of `source`: the data itself for f32, else converted into
// `buffer` (the fp32 operand of a product with P or dS).
const float* as_f32(const CudaBackend& backend, const void* source, DType dtype, std::int64_t count, float* buffer) {
  if (dtype == DType::F32) return static_cast<const float*>(source);
  convert_floats(backend, buffer, DType::F32, source, dtype, count);
  return buffer;
}

void attention_forward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  const CudaBackend& backend = cuda_of(context);
  const AttentionDims dims = attention_dims(context, inputs);
  check_dtype(outputs[0], dims.dtype, "y");
  const std::int64_t s = dims.s, t = dims.t, dv = dims.dv, pairs = dims.pairs();
  if (pairs == 0 || s == 0 || dv == 0) return;  // y is empty
  const void* q = device_pointer(inputs[0]);
  const void* k = device_pointer(inputs[1]);
  const void* v = device_pointer(inputs[2]);
  void* y = device_pointer(outputs[0]);
  const bool f32 = dims.dtype == DType::F32;
  // Per pair: the scores, and under bf16 the fp32 copy of v and the fp32 output.
  const std::int64_t chunk = pairs_per_chunk(pairs, s * t + (f32 ? 0 : t * dv + s * dv));
  const Tensor scores = float_scratch(backend, chunk * s * t);
  const Tensor v32 = f32 ? Tensor() : float_scratch(backend, chunk * t * dv);
  const Tensor y32 = f32 ? Tensor() : float_scratch(backend, chunk * s * dv);
  for (std::int64_t first = 0; first < pairs; first += chunk) {
    const std::int64_t count = std::min(chunk, pairs - first);
    float* p = floats(scores);
    probabilities(backend, dims, first, count, q, k, p);
    const float* v_f32 = as_f32(backend, advance(v, first * t * dv, dims.dtype), dims.dtype, count * t * dv,
                                f32 ? nullptr : floats(v32));
    void* y_chunk = advance(y, first * s * dv, dims.dtype);
    float* target = f32 ? static_cast<float*>(y_chunk) : floats(y32);
    pair_product(backend, false, false, s, dv, t, 1.f, count, DType::F32, p, s * t, v_f32, t * dv, target, s * dv);
    if (!f32) convert_floats(backend, y_chunk, dims.dtype, target, DType::F32, count * s * dv);
  }
}

void attention_backward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor>,
                        std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  const CudaBackend& backend = cuda_of(context);
  const AttentionDims dims = attention_dims(context, inputs);
  // The mask is a constant of the graph (schema: not differentiable); if a gradient is asked for
  // anyway it is zero.
  if (input_grads.size() > 3 && input_grads[3].defined())
    PARTRAIN_CUDA_CHECK(
        cudaMemsetAsync(device_pointer(input_grads[3]), 0, input_grads[3].nbytes(), backend.stream()));
  const bool need_dq = input_grads[0].defined();
  const bool need_dk = input_grads[1].defined();
  const bool need_dv = input_grads[2].defined();
  const bool need_ds = need_dq || need_dk;
  if (!need_dq && !need_dk && !need_dv) return;
  const std::int64_t s = dims.s, t = dims.t, d = dims.d, dvd = dims.dv, pairs = dims.pairs();
  if (pairs == 0) return;  // every gradient is empty
  check_dtype(output_grads[0], dims.dtype, "dy");
  const void* q = device_pointer(inputs[0]);
  const void* k = device_pointer(inputs[1]);
  const void* v = device_pointer(inputs[2]);
  const void* dy = device_pointer(output_grads[0]);
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  if (need_dq) {
    check_dtype(input_grads[0], dims.dtype, "dq");
    dq = device_pointer(input_grads[0]);
  }
  if (need_dk) {
    check_dtype(input_grads[1], dims.dtype, "dk");
    dk = device_pointer(input_grads[1]);
  }
  if (need_dv) {
    check_dtype(input_grads[2], dims.dtype, "dv");
    dv = device_pointer(input_grads[2]);
  }
  const bool f32 = dims.dtype == DType::F32;

  // Per pair: P, dS, and under bf16 the fp32 copies of dO (for dV), K (for dQ), Q (for dK) and one
  // fp32 result buffer reused by dV, dQ and dK (the stream orders the reuse).
  const std::int64_t dy_floats = !f32 && need_dv ? s * dvd : 0;
  const std::int64_t k_floats = !f32 && need_dq ? t * d : 0;
  const std::int64_t q_floats = !f32 && need_dk ? s * d : 0;
  const std::int64_t out_floats =
      f32 ? 0 : std::max({need_dv ? t * dvd : 0, need_dq ? s * d : 0, need_dk ? t * d : 0});
  const std::int64_t chunk =
      pairs_per_chunk(pairs, s * t * (need_ds ? 2 : 1) + dy_floats + k_floats + q_floats + out_floats);
  const Tensor p_buffer = float_scratch(backend, chunk * s * t);
  const Tensor ds_buffer = need_ds ? float_scratch(backend, chunk * s * t) : Tensor();
  const Tensor dy32 = dy_floats ? float_scratch(backend, chunk * dy_floats) : Tensor();
  const Tensor k32 = k_floats ? float_scratch(backend, chunk * k_floats) : Tensor();
  const Tensor q32 = q_floats ? float_scratch(backend, chunk * q_floats) : Tensor();
  const Tensor out32 = out_floats ? float_scratch(backend, chunk * out_floats) : Tensor();

  for (std::int64_t first = 0; first < pairs; first += chunk) {
    const std::int64_t count = std::min(chunk, pairs - first);
    float* p = floats(p_buffer);
    probabilities(backend, dims, first, count, q, k, p);
    if (need_dv) {  // dV = P^T dO
      const float* dy_f32 = as_f32(backend, advance(dy, first * s * dvd, dims.dtype), dims.dtype, count * s * dvd,
                                   dy_floats ? floats(dy32) : nullptr);
      void* dv_chunk = advance(dv, first * t * dvd, dims.dtype);
      float* target = f32 ? static_cast<float*>(dv_chunk) : floats(out32);
      pair_product(backend, true, false, t, dvd, s, 1.f, count, DType::F32, p, s * t, dy_f32, s * dvd, target, t * dvd);
      if (!f32) convert_floats(backend, dv_chunk, dims.dtype, target, DType::F32, count * t * dvd);
    }
    if (!need_ds) continue;
    // dP = dO V^T (bf16 operands taken directly, fp32 result), then dS in place.
    float* ds = floats(ds_buffer);
    pair_product(backend, false, true, s, t, dvd, 1.f, count, dims.dtype, advance(dy, first * s * dvd, dims.dtype),
                 s * dvd, advance(v, first * t * dvd, dims.dtype), t * dvd, ds, s * t);
    const std::int64_t rows = count * s;
    if (rows > 0 && t > 0) {
      softmax_backward_kernel<<<row_blocks(rows), row_threads(t), 0, backend.stream()>>>(p, ds, rows, t);
      PARTRAIN_CUDA_CHECK_LAUNCH();
    }
    if (need_dq) {  // dQ = scale dS K
      const float* k_f32 = as_f32(backend, advance(k, first * t * d, dims.dtype), dims.dtype, count * t * d,
                                  k_floats ? floats(k32) : nullptr);
      void* dq_chunk = advance(dq, first * s * d, dims.dtype);
      float* target = f32 ? static_cast<float*>(dq_chunk) : floats(out32);
      pair_product(backend, false, false, s, d, t, dims.scale, count, DType::F32, ds, s * t, k_f32, t * d, target,
                   s * d);
      if (!f32) convert_floats(backend, dq_chunk, dims.dtype, target, DType::F32, count * s * d);
    }
    if (need_dk) {  // dK = scale dS^T Q
      const float* q_f32 = as_f32(backend, advance(q, first * s * d, dims.dtype), dims.dtype, count * s * d,
                                  q_floats ? floats(q32) : nullptr);
      void* dk_chunk = advance(dk, first * t * d, dims.dtype);
      float* target = f32 ? static_cast<float*>(dk_chunk) : floats(out32);
      pair_product(backend, true, false, t, d, s, dims.scale, count, DType::F32, ds, s * t, q_f32, s * d, target,
                   t * d);
      if (!f32) convert_floats(backend, dk_chunk, dims.dtype, target, DType::F32, count * t * d);
    }
  }
}

}  // namespace

void register_cuda_attention_kernels(Backend& backend) {
  backend.set_kernels(OpType::Attention, {attention_forward, attention_backward});
}

}  // namespace partrain::cuda
