#include "kernels/cuda/optimizer.cuh"

#include "kernels/cuda/cuda_common.cuh"

namespace partrain::cuda {

namespace {
__global__ void adamw_kernel(float* __restrict__ value, const float* __restrict__ gradient, float* __restrict__ m,
                             float* __restrict__ v, std::int64_t n, AdamWUpdate u) {
  for (std::int64_t k = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; k < n; k += std::int64_t(gridDim.x) * blockDim.x) {
    const float g = gradient[k] * u.grad_scale;
    float p = value[k] * u.keep;
    const float m_k = m[k] + u.one_minus_beta1 * (g - m[k]);
    const float v_k = v[k] * u.beta2 + u.one_minus_beta2 * g * g;
    m[k] = m_k;
    v[k] = v_k;
    // Same operation order as the CPU loop; sqrtf is correctly rounded on the GPU as std::sqrt.
    const float denom = sqrtf(v_k) / u.bias_correction2_sqrt + u.eps;
    value[k] = p - u.step_size * m_k / denom;
  }
}

__global__ void sgd_kernel(float* __restrict__ value, const float* __restrict__ gradient, float* __restrict__ buffer,
                           std::int64_t n, SgdUpdate u) {
  for (std::int64_t k = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; k < n; k += std::int64_t(gridDim.x) * blockDim.x) {
    float d = gradient[k] * u.grad_scale;
    if (u.decay != 0.0f) d += u.decay * value[k];
    if (buffer) {
      buffer[k] = u.first ? d : buffer[k] * u.momentum + d;
      d = buffer[k];
    }
    value[k] -= u.rate * d;
  }
}

template <typename To, typename From>
__global__ void convert_kernel(To* __restrict__ out, const From* __restrict__ in, std::int64_t n) {
  for (std::int64_t k = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; k < n; k += std::int64_t(gridDim.x) * blockDim.x)
    out[k] = from_float<To>(to_float(in[k]));
}

template <typename A, typename V>
__global__ void accumulate_kernel(A* __restrict__ accumulator, const V* __restrict__ value, std::int64_t n) {
  for (std::int64_t k = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; k < n; k += std::int64_t(gridDim.x) * blockDim.x)
    accumulator[k] = from_float<A>(to_float(accumulator[k]) + to_float(value[k]));
}

template <typename T>
__global__ void scale_kernel(T* __restrict__ data, std::int64_t n, float factor) {
  for (std::int64_t k = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; k < n; k += std::int64_t(gridDim.x) * blockDim.x)
    data[k] = from_float<T>(to_float(data[k]) * factor);
}

// Per-block double partial sums, then one atomicAdd per block (double atomics exist on sm_60+).
template <typename T>
__global__ void sum_of_squares_kernel(const T* __restrict__ data, std::int64_t n, double weight,
                                      double* __restrict__ total) {
  __shared__ double partial[kThreadsPerBlock];
  double sum = 0;
  for (std::int64_t k = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; k < n; k += std::int64_t(gridDim.x) * blockDim.x) {
    const double x = to_float(data[k]);
    sum += x * x;
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(total, weight * partial[0]);
}

void check_same(const Tensor& a, const Tensor& b, const char* what) {
  PARTRAIN_CHECK(a.numel() == b.numel(), what << ": " << shape_string(a.shape()) << " and " << shape_string(b.shape()));
  PARTRAIN_CHECK(!a.device().is_cpu() && a.device() == b.device(), what << ": tensors on " << a.device().to_string()
                                                                         << " and " << b.device().to_string());
}
}  // namespace

void launch_adamw_update(cudaStream_t stream, const Tensor& parameter, const Tensor& gradient, const Tensor& exp_avg,
                         const Tensor& exp_avg_sq, const AdamWUpdate& update) {
  for (const Tensor* t : {&gradient, &exp_avg, &exp_avg_sq}) check_same(parameter, *t, "adamw_update");
  const std::int64_t n = parameter.numel();
  adamw_kernel<<<blocks_for(n), kThreadsPerBlock, 0, stream>>>(device_data<float>(parameter), device_data<float>(gradient),
                                                              device_data<float>(exp_avg), device_data<float>(exp_avg_sq), n,
                                                              update);
  PARTRAIN_CUDA_CHECK_LAUNCH();
}

void launch_sgd_update(cudaStream_t stream, const Tensor& parameter, const Tensor& gradient,
                       const Tensor& momentum_buffer, const SgdUpdate& update) {
  check_same(parameter, gradient, "sgd_update");
  if (momentum_buffer.defined()) check_same(parameter, momentum_buffer, "sgd_update");
  const std::int64_t n = parameter.numel();
  sgd_kernel<<<blocks_for(n), kThreadsPerBlock, 0, stream>>>(
      device_data<float>(parameter), device_data<float>(gradient),
      momentum_buffer.defined() ? device_data<float>(momentum_buffer) : nullptr, n, update);
  PARTRAIN_CUDA_CHECK_LAUNCH();
}

void launch_convert(cudaStream_t stream, const Tensor& destination, const Tensor& source) {
  check_same(destination, source, "convert");
  const std::int64_t n = source.numel();
  dispatch_any_floating(destination.dtype(), "convert", [&](auto to) {
    using To = decltype(to);
    dispatch_any_floating(source.dtype(), "convert", [&](auto from) {
      using From = decltype(from);
      convert_kernel<To, From><<<blocks_for(n), kThreadsPerBlock, 0, stream>>>(device_data<To>(destination),
                                                                              device_data<From>(source), n);
    });
  });
  PARTRAIN_CUDA_CHECK_LAUNCH();
}

void launch_accumulate(cudaStream_t stream, const Tensor& accumulator, const Tensor& value) {
  check_same(accumulator, value, "accumulate");
  const std::int64_t n = value.numel();
  dispatch_any_floating(accumulator.dtype(), "accumulate", [&](auto a) {
    using A = decltype(a);
    dispatch_any_floating(value.dtype(), "accumulate", [&](auto v) {
      using V = decltype(v);
      accumulate_kernel<A, V><<<blocks_for(n), kThreadsPerBlock, 0, stream>>>(device_data<A>(accumulator),
                                                                             device_data<V>(value), n);
    });
  });
  PARTRAIN_CUDA_CHECK_LAUNCH();
}

void launch_scale(cudaStream_t stream, const Tensor& tensor, float factor) {
  const std::int64_t n = tensor.numel();
  dispatch_any_floating(tensor.dtype(), "scale", [&](auto tag) {
    using T = decltype(tag);
    scale_kernel<T><<<blocks_for(n), kThreadsPerBlock, 0, stream>>>(device_data<T>(tensor), n, factor);
  });
  PARTRAIN_CUDA_CHECK_LAUNCH();
}

double sum_of_squares(cudaStream_t stream, std::span<const Tensor> tensors, std::span<const double> weights,
                      Tensor scratch_of_one_double) {
  PARTRAIN_CHECK(tensors.size() == weights.size(), "sum_of_squares: " << tensors.size() << " tensors, " << weights.size()
                                                                      << " weights");
  double* total = static_cast<double*>(scratch_of_one_double.raw_data());
  PARTRAIN_CUDA_CHECK(cudaMemsetAsync(total, 0, sizeof(double), stream));
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& tensor = tensors[i];
    const std::int64_t n = tensor.defined() ? tensor.numel() : 0;
    if (n == 0) continue;
    const unsigned int blocks = std::min(blocks_for(n), 1024u);  // few atomics; the grid-stride loop covers the rest
    dispatch_any_floating(tensor.dtype(), "sum_of_squares", [&](auto tag) {
      using T = decltype(tag);
      sum_of_squares_kernel<T><<<blocks, kThreadsPerBlock, 0, stream>>>(device_data<T>(tensor), n, weights[i], total);
    });
    PARTRAIN_CUDA_CHECK_LAUNCH();
  }
  double result = 0;
  PARTRAIN_CUDA_CHECK(cudaMemcpyAsync(&result, total, sizeof(double), cudaMemcpyDeviceToHost, stream));
  PARTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream));  // the caller needs the value on the host
  return result;
}

}  // namespace partrain::cuda
