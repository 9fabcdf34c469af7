#pragma once
// Device-side helpers shared by the CUDA kernels: element types, launch sizes, dtype dispatch.
//
// Precision: float tensors are f32 or bf16 (core/dtype.h). Kernels are templates over the storage
// type T (float or __nv_bfloat16), load with to_float(), compute in fp32 and round once with
// from_float<T>() on store: "bf16 storage, fp32 compute", which is also what the CPU backend
// emulates for bf16 tensors, so CUDA bf16 results are compared against it element by element.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/cuda/cuda_check.cuh"

namespace partrain::cuda {

__host__ __device__ inline float to_float(float value) { return value; }
__host__ __device__ inline float to_float(__nv_bfloat16 value) { return __bfloat162float(value); }
__host__ __device__ inline float to_float(__half value) { return __half2float(value); }

template <typename T> __host__ __device__ inline T from_float(float value);
template <> __host__ __device__ inline float from_float<float>(float value) { return value; }
template <> __host__ __device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float value) {
  return __float2bfloat16_rn(value);  // round to nearest even, as BFloat16(float) on the host
}
template <> __host__ __device__ inline __half from_float<__half>(float value) {
  return __float2half_rn(value);  // round to nearest even, as Float16(float) on the host
}

/// Threads per block of the element-wise kernels.
inline constexpr int kThreadsPerBlock = 256;

/// Blocks for a grid-stride loop over `count` elements (capped; the loop covers the rest).
inline unsigned int blocks_for(std::int64_t count, int threads = kThreadsPerBlock) {
  const std::int64_t blocks = (count + threads - 1) / threads;
  return static_cast<unsigned int>(blocks < 1 ? 1 : (blocks > 65535 * 8 ? 65535 * 8 : blocks));
}

/// Device pointer of a float tensor as its storage type T (float or __nv_bfloat16). Throws
/// partrain::Error when the tensor is not on a CUDA device or its dtype does not match T.
template <typename T> T* device_data(const Tensor& tensor);
template <> inline float* device_data<float>(const Tensor& tensor) {
  PARTRAIN_CHECK(!tensor.device().is_cpu(), "CUDA kernel given a host tensor");
  return tensor.data<float>();
}
template <> inline __nv_bfloat16* device_data<__nv_bfloat16>(const Tensor& tensor) {
  PARTRAIN_CHECK(!tensor.device().is_cpu(), "CUDA kernel given a host tensor");
  return reinterpret_cast<__nv_bfloat16*>(tensor.data<BFloat16>());
}
template <> inline __half* device_data<__half>(const Tensor& tensor) {
  PARTRAIN_CHECK(!tensor.device().is_cpu(), "CUDA kernel given a host tensor");
  return reinterpret_cast<__half*>(tensor.data<Float16>());
}
template <> inline std::int32_t* device_data<std::int32_t>(const Tensor& tensor) {
  PARTRAIN_CHECK(!tensor.device().is_cpu(), "CUDA kernel given a host tensor");
  return tensor.data<std::int32_t>();
}
template <> inline std::int64_t* device_data<std::int64_t>(const Tensor& tensor) {
  PARTRAIN_CHECK(!tensor.device().is_cpu(), "CUDA kernel given a host tensor");
  return tensor.data<std::int64_t>();
}

/// Calls `function(T{})` with T = float for f32 and __nv_bfloat16 for bf16; throws
/// partrain::Error naming `what` for any other dtype.
template <typename Function>
void dispatch_floating(DType dtype, const char* what, Function&& function) {
  switch (dtype) {
    case DType::F32: function(float{}); return;
    case DType::BF16: function(__nv_bfloat16{}); return;
    default: PARTRAIN_FAIL(what << ": CUDA kernels take f32 or bf16, got " << dtype_name(dtype));
  }
}

/// dispatch_floating with f16 as well (T = __half): for the kernels that take every float dtype —
/// conversion, accumulation, scaling, sums of squares. The op kernels take f32 and bf16 only; f16 ops
/// run on widened fp32 copies (Backend::supports_f16 is false), as on the CPU.
template <typename Function>
void dispatch_any_floating(DType dtype, const char* what, Function&& function) {
  if (dtype == DType::F16) return function(__half{});
  dispatch_floating(dtype, what, std::forward<Function>(function));
}

/// Block-wide sum of one float or double per thread (any blockDim.x that is a multiple of 32, up to
/// 1024), in a fixed order for a given launch. Every thread gets the result. `shared` must hold 32
/// values of the type.
template <typename Value>
__device__ inline Value block_sum(Value value, Value* shared) {
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // `shared` may still be read by a previous call
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  const int warps = (blockDim.x + 31) / 32;
  value = lane < warps ? shared[lane] : Value(0);
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

/// Block-wide maximum, as block_sum.
__device__ inline float block_max(float value, float* shared) {
  for (int offset = 16; offset > 0; offset /= 2) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  const int warps = (blockDim.x + 31) / 32;
  value = lane < warps ? shared[lane] : -INFINITY;
  for (int offset = 16; offset > 0; offset /= 2) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

}  // namespace partrain::cuda
