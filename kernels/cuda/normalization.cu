// CUDA kernels of the normalization ops (schemas and semantics: src/graph/ops/normalization.cpp;
// reference: kernels/cpu/normalization.cpp; overview: kernels/cuda/normalization.cuh).
#include "kernels/cuda/normalization.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdio>
#include <mutex>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/cuda_backend.cuh"
#include "kernels/cuda/cuda_common.cuh"

namespace partrain::cuda {

namespace {

// The CPU kernels read eps as a float attribute (then widen it): the same value here.
float attribute_eps(const KernelContext& context) {
  return static_cast<float>(context.attributes.get_float("eps", 1e-5));
}

__device__ inline std::int64_t global_thread() { return std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline std::int64_t grid_threads() { return std::int64_t(gridDim.x) * blockDim.x; }

// Threads of the one-block-per-row / per-channel kernels (at most; __launch_bounds__ below).
constexpr int kMaxRowThreads = 512;

// About four elements per thread, a multiple of 32 in [32, kMaxRowThreads].
int row_threads(std::int64_t length) {
  const std::int64_t wanted = ((length + 3) / 4 + 31) / 32 * 32;
  return static_cast<int>(std::clamp<std::int64_t>(wanted, 32, kMaxRowThreads));
}

unsigned int row_blocks(std::int64_t rows) {
  return static_cast<unsigned int>(std::clamp<std::int64_t>(rows, 1, std::int64_t(1) << 20));
}

template <typename S, typename D>
__global__ void convert_kernel(const S* source, D* destination, std::int64_t n) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads())
    destination[i] = from_float<D>(to_float(source[i]));
}

template <typename S, typename D>
void convert(const S* source, D* destination, std::int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  convert_kernel<S, D><<<blocks_for(n), kThreadsPerBlock, 0, stream>>>(source, destination, n);
  PARTRAIN_CUDA_CHECK_LAUNCH();
}

// ---------------- LayerNorm ----------------
// Mean and rstd = 1 / sqrt(biased variance + eps) of one row (two passes), in every thread. The
// first pass sums x − x[0]: small terms keep the fp32 sum accurate when |mean| ≫ std.
template <typename T>
__device__ void row_statistics(const T* xr, std::int64_t hidden, float eps, float* shared, float& mean, float& rstd) {
  const float shift = to_float(xr[0]);
  float sum = 0.f;
  for (std::int64_t h = threadIdx.x; h < hidden; h += blockDim.x) sum += to_float(xr[h]) - shift;
  mean = shift + block_sum(sum, shared) / static_cast<float>(hidden);
  float squares = 0.f;
  for (std::int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
    const float d = to_float(xr[h]) - mean;
    squares += d * d;
  }
  const float variance = block_sum(squares, shared) / static_cast<float>(hidden);
  rstd = 1.f / sqrtf(variance + eps);
}

template <typename T>
__global__ void __launch_bounds__(kMaxRowThreads)
    layer_norm_forward_kernel(const T* x, const T* weight, const T* bias, T* y, std::int64_t rows, std::int64_t hidden,
                              float eps) {
  __shared__ float shared[32];
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * hidden;
    T* yr = y + row * hidden;
    float mean, rstd;
    row_statistics(xr, hidden, eps, shared, mean, rstd);
    for (std::int64_t h = threadIdx.x; h < hidden; h += blockDim.x)
      yr[h] = from_float<T>((to_float(xr[h]) - mean) * rstd * to_float(weight[h]) + to_float(bias[h]));
  }
}

// Per row: mean and rstd (saved to mean_out / rstd_out when given, for the parameter gradients) and,
// when dx is given, dx = rstd·(g − mean(g) − x̂·mean(g·x̂)) with g = dy·weight.
template <typename T>
__global__ void __launch_bounds__(kMaxRowThreads)
    layer_norm_backward_rows_kernel(const T* x, const T* weight, const T* dy, T* dx, float* mean_out, float* rstd_out,
                                    std::int64_t rows, std::int64_t hidden, float eps) {
  __shared__ float shared[32];
  for (std::int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * hidden;
    const T* dyr = dy + row * hidden;
    float mean, rstd;
    row_statistics(xr, hidden, eps, shared, mean, rstd);
    if (threadIdx.x == 0 && mean_out != nullptr) {
      mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
    if (dx == nullptr) continue;
    float sum_g = 0.f, sum_g_xhat = 0.f;
    for (std::int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
      const float g = to_float(dyr[h]) * to_float(weight[h]);
      sum_g += g;
      sum_g_xhat += g * ((to_float(xr[h]) - mean) * rstd);
    }
    const float mean_g = block_sum(sum_g, shared) / static_cast<float>(hidden);
    const float mean_g_xhat = block_sum(sum_g_xhat, shared) / static_cast<float>(hidden);
    T* dxr = dx + row * hidden;
    for (std::int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
      const float xhat = (to_float(xr[h]) - mean) * rstd;
      dxr[h] = from_float<T>(rstd * (to_float(dyr[h]) * to_float(weight[h]) - mean_g - xhat * mean_g_xhat));
    }
  }
}

// Column sums of dy·x̂ and dy over rows [chunk·chunk_rows, +chunk_rows): block (32 columns × 8 row
// lanes), combined in a fixed order into partial_{weight,bias}[chunk, column].
constexpr int kColumnTile = 32;
constexpr int kRowLanes = 8;

template <typename T>
__global__ void layer_norm_parameter_partial_kernel(const T* x, const T* dy, const float* mean, const float* rstd,
                                                    float* partial_weight, float* partial_bias, std::int64_t rows,
                                                    std::int64_t hidden, std::int64_t chunk_rows) {
  __shared__ float tile_weight[kRowLanes][kColumnTile + 1];
  __shared__ float tile_bias[kRowLanes][kColumnTile + 1];
  const std::int64_t column = std::int64_t(blockIdx.x) * kColumnTile + threadIdx.x;
  const std::int64_t chunk = blockIdx.y;
  const std::int64_t begin = chunk * chunk_rows;
  const std::int64_t end = begin + chunk_rows < rows ? begin + chunk_rows : rows;
  float sum_weight = 0.f, sum_bias = 0.f;
  if (column < hidden) {
    for (std::int64_t r = begin + threadIdx.y; r < end; r += kRowLanes) {
      const float d = to_float(dy[r * hidden + column]);
      sum_weight += d * ((to_float(x[r * hidden + column]) - mean[r]) * rstd[r]);
      sum_bias += d;
    }
  }
  tile_weight[threadIdx.y][threadIdx.x] = sum_weight;
  tile_bias[threadIdx.y][threadIdx.x] = sum_bias;
  __syncthreads();
  if (threadIdx.y == 0 && column < hidden) {
    float total_weight = 0.f, total_bias = 0.f;
    for (int lane = 0; lane < kRowLanes; ++lane) {
      total_weight += tile_weight[lane][threadIdx.x];
      total_bias += tile_bias[lane][threadIdx.x];
    }
    partial_weight[chunk * hidden + column] = total_weight;
    partial_bias[chunk * hidden + column] = total_bias;
  }
}

template <typename T>
__global__ void layer_norm_parameter_finish_kernel(const float* partial_weight, const float* partial_bias, T* dweight,
                                                   T* dbias, std::int64_t hidden, std::int64_t chunks) {
  for (std::int64_t column = global_thread(); column < hidden; column += grid_threads()) {
    float total_weight = 0.f, total_bias = 0.f;
    for (std::int64_t chunk = 0; chunk < chunks; ++chunk) {
      total_weight += partial_weight[chunk * hidden + column];
      total_bias += partial_bias[chunk * hidden + column];
    }
    if (dweight != nullptr) dweight[column] = from_float<T>(total_weight);
    if (dbias != nullptr) dbias[column] = from_float<T>(total_bias);
  }
}

void layer_norm_forward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  const Tensor& x = inputs[0];
  const std::int64_t hidden = x.dim(-1);
  const std::int64_t rows = hidden > 0 ? x.numel() / hidden : 0;
  if (rows == 0) return;
  const float eps = attribute_eps(context);
  dispatch_floating(x.dtype(), "LayerNorm", [&](auto tag) {
    using T = decltype(tag);
    layer_norm_forward_kernel<T><<<row_blocks(rows), row_threads(hidden), 0, cuda_of(context).stream()>>>(
        device_data<T>(x), device_data<T>(inputs[1]), device_data<T>(inputs[2]), device_data<T>(outputs[0]), rows,
        hidden, eps);
    PARTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void layer_norm_backward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor>,
                         std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  CudaBackend& backend = cuda_of(context);
  const cudaStream_t stream = backend.stream();
  const Tensor& x = inputs[0];
  const std::int64_t hidden = x.dim(-1);
  const std::int64_t rows = hidden > 0 ? x.numel() / hidden : 0;
  const float eps = attribute_eps(context);
  const Tensor& dx = input_grads[0];
  const Tensor& dweight = input_grads[1];
  const Tensor& dbias = input_grads[2];
  const bool parameters = dweight.defined() || dbias.defined();
  dispatch_floating(x.dtype(), "LayerNorm backward", [&](auto tag) {
    using T = decltype(tag);
    if (rows == 0) {  // empty sums
      for (const Tensor& gradient : {dweight, dbias})
        if (gradient.defined()) PARTRAIN_CUDA_CHECK(cudaMemsetAsync(gradient.raw_data(), 0, gradient.nbytes(), stream));
      return;
    }
    if (!dx.defined() && !parameters) return;
    const Tensor statistics = parameters ? backend.empty({2 * rows}, DType::F32) : Tensor();
    float* mean = parameters ? device_data<float>(statistics) : nullptr;
    float* rstd = parameters ? mean + rows : nullptr;
    const T* px = device_data<T>(x);
    const T* dy = device_data<T>(output_grads[0]);
    layer_norm_backward_rows_kernel<T><<<row_blocks(rows), row_threads(hidden), 0, stream>>>(
        px, device_data<T>(inputs[1]), dy, dx.defined() ? device_data<T>(dx) : nullptr, mean, rstd, rows, hidden, eps);
    PARTRAIN_CUDA_CHECK_LAUNCH();
    if (!parameters) return;
    // Fixed chunking (from the shape alone): at least 32 rows per chunk, about 1024 blocks.
    const std::int64_t column_blocks = (hidden + kColumnTile - 1) / kColumnTile;
    const std::int64_t max_chunks = std::max<std::int64_t>(1, std::min<std::int64_t>(1024, 1024 / column_blocks));
    const std::int64_t wanted = std::min(max_chunks, (rows + 31) / 32);
    const std::int64_t chunk_rows = (rows + wanted - 1) / wanted;
    const std::int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
    const Tensor partial = backend.empty({2 * chunks * hidden}, DType::F32);
    float* partial_weight = device_data<float>(partial);
    float* partial_bias = partial_weight + chunks * hidden;
    const dim3 grid(static_cast<unsigned int>(column_blocks), static_cast<unsigned int>(chunks));
    layer_norm_parameter_partial_kernel<T><<<grid, dim3(kColumnTile, kRowLanes), 0, stream>>>(
        px, dy, mean, rstd, partial_weight, partial_bias, rows, hidden, chunk_rows);
    PARTRAIN_CUDA_CHECK_LAUNCH();
    layer_norm_parameter_finish_kernel<T><<<blocks_for(hidden), kThreadsPerBlock, 0, stream>>>(
        partial_weight, partial_bias, dweight.defined() ? device_data<T>(dweight) : nullptr,
        dbias.defined() ? device_data<T>(dbias) : nullptr, hidden, chunks);
    PARTRAIN_CUDA_CHECK_LAUNCH();
  });
}

// ---------------- BatchNorm2d ----------------
// x [N, C, H, W]: channel c of sample n is the contiguous block x + (n·C + c)·plane.
struct BatchNormShape {
  std::int64_t batch, channels, plane;
  std::int64_t count() const { return batch * plane; }  // elements per channel
};

BatchNormShape batch_norm_shape(const Tensor& x) { return {x.dim(0), x.dim(1), x.dim(2) * x.dim(3)}; }

// Offset of element k (of batch·plane) of channel c.
__device__ inline std::int64_t channel_offset(std::int64_t k, std::int64_t c, std::int64_t channels,
                                              std::int64_t plane) {
  return ((k / plane) * channels + c) * plane + k % plane;
}

// Batch mean and biased variance of channel c (two passes), in every thread of the block. The
// first pass sums x − (the channel's first element), as row_statistics.
template <typename T>
__device__ void channel_moments(const T* x, std::int64_t batch, std::int64_t channels, std::int64_t plane,
                                std::int64_t c, float* shared, float& mean, float& variance) {
  const std::int64_t count = batch * plane;
  const float shift = count > 0 ? to_float(x[channel_offset(0, c, channels, plane)]) : 0.f;
  float sum = 0.f;
  for (std::int64_t k = threadIdx.x; k < count; k += blockDim.x)
    sum += to_float(x[channel_offset(k, c, channels, plane)]) - shift;
  sum = block_sum(sum, shared);
  mean = count > 0 ? shift + sum / static_cast<float>(count) : 0.f;
  float squares = 0.f;
  for (std::int64_t k = threadIdx.x; k < count; k += blockDim.x) {
    const float d = to_float(x[channel_offset(k, c, channels, plane)]) - mean;
    squares += d * d;
  }
  squares = block_sum(squares, shared);
  variance = count > 0 ? squares / static_cast<float>(count) : 0.f;
}

// Per channel (one block each): the statistics to normalise with (the batch's in training, the
// running ones otherwise), the in-place running-stat update in training (unbiased variance; the
// biased one, 0, with a single element), and the affine coefficients y = x·scale + shift.
template <typename T>
__global__ void __launch_bounds__(kMaxRowThreads)
    batch_norm_coefficients_kernel(const T* x, const T* weight, const T* bias, float* running_mean, float* running_var,
                                   float* scale, float* shift, std::int64_t batch, std::int64_t channels,
                                   std::int64_t plane, double eps, double momentum, bool training) {
  __shared__ float shared[32];
  for (std::int64_t c = blockIdx.x; c < channels; c += gridDim.x) {
    float mean, variance;
    if (training) {
      channel_moments(x, batch, channels, plane, c, shared, mean, variance);
    } else {
      mean = running_mean[c];
      variance = running_var[c];
    }
    if (threadIdx.x != 0) continue;
    if (training) {
      const double count = static_cast<double>(batch * plane);
      const double unbiased = count > 1 ? double(variance) * count / (count - 1) : double(variance);
      running_mean[c] = static_cast<float>((1 - momentum) * running_mean[c] + momentum * mean);
      running_var[c] = static_cast<float>((1 - momentum) * running_var[c] + momentum * unbiased);
    }
    const float channel_scale = static_cast<float>(double(to_float(weight[c])) / sqrt(double(variance) + eps));
    scale[c] = channel_scale;
    shift[c] = static_cast<float>(double(to_float(bias[c])) - double(mean) * channel_scale);
  }
}

template <typename T>
__global__ void batch_norm_apply_kernel(const T* x, const float* scale, const float* shift, T* y, std::int64_t n,
                                        std::int64_t channels, std::int64_t plane) {
  for (std::int64_t i = global_thread(); i < n; i += grid_threads()) {
    const std::int64_t c = (i / plane) % channels;
    y[i] = from_float<T>(to_float(x[i]) * scale[c] + shift[c]);
  }
}

// Per channel (one block each): dweight = Σ dy·x̂, dbias = Σ dy and dx — in training
// weight·rstd·(dy − mean(dy) − x̂·mean(dy·x̂)) with the batch statistics recomputed from x, in
// evaluation weight·rstd·dy with the running statistics.
template <typename T>
__global__ void __launch_bounds__(kMaxRowThreads)
    batch_norm_backward_kernel(const T* x, const T* weight, const float* running_mean, const float* running_var,
                               const T* dy, T* dx, T* dweight, T* dbias, std::int64_t batch, std::int64_t channels,
                               std::int64_t plane, double eps, bool training) {
  __shared__ float shared[32];
  const std::int64_t count = batch * plane;
  for (std::int64_t c = blockIdx.x; c < channels; c += gridDim.x) {
    float mean, variance;
    if (training) {
      channel_moments(x, batch, channels, plane, c, shared, mean, variance);
    } else {
      mean = running_mean[c];
      variance = running_var[c];
    }
    const double rstd = 1.0 / sqrt(double(variance) + eps);
    const float frstd = static_cast<float>(rstd);
    float sum_dy = 0.f, sum_dy_xhat = 0.f;
    for (std::int64_t k = threadIdx.x; k < count; k += blockDim.x) {
      const std::int64_t offset = channel_offset(k, c, channels, plane);
      const float d = to_float(dy[offset]);
      sum_dy += d;
      sum_dy_xhat += d * ((to_float(x[offset]) - mean) * frstd);
    }
    sum_dy = block_sum(sum_dy, shared);
    sum_dy_xhat = block_sum(sum_dy_xhat, shared);
    if (threadIdx.x == 0) {
      if (dweight != nullptr) dweight[c] = from_float<T>(sum_dy_xhat);
      if (dbias != nullptr) dbias[c] = from_float<T>(sum_dy);
    }
    if (dx == nullptr) continue;
    const float scale = static_cast<float>(double(to_float(weight[c])) * rstd);
    if (training) {
      const float mean_dy = sum_dy / static_cast<float>(count);
      const float mean_dy_xhat = sum_dy_xhat / static_cast<float>(count);
      for (std::int64_t k = threadIdx.x; k < count; k += blockDim.x) {
        const std::int64_t offset = channel_offset(k, c, channels, plane);
        const float xhat = (to_float(x[offset]) - mean) * frstd;
        dx[offset] = from_float<T>(scale * (to_float(dy[offset]) - mean_dy - xhat * mean_dy_xhat));
      }
    } else {
      for (std::int64_t k = threadIdx.x; k < count; k += blockDim.x) {
        const std::int64_t offset = channel_offset(k, c, channels, plane);
        dx[offset] = from_float<T>(scale * to_float(dy[offset]));
      }
    }
  }
}

// ---- cuDNN (training, more than one element per channel) ----
template <typename T>
constexpr cudnnDataType_t cudnn_type();
template <>
constexpr cudnnDataType_t cudnn_type<float>() {
  return CUDNN_DATA_FLOAT;
}
template <>
constexpr cudnnDataType_t cudnn_type<__nv_bfloat16>() {
  return CUDNN_DATA_BFLOAT16;
}

// A cuDNN tensor descriptor for the duration of one call.
class TensorDescriptor {
 public:
  TensorDescriptor(cudnnDataType_t type, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) {
    PARTRAIN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&descriptor_));
    const cudnnStatus_t status =
        cudnnSetTensor4dDescriptor(descriptor_, CUDNN_TENSOR_NCHW, type, static_cast<int>(n), static_cast<int>(c),
                                   static_cast<int>(h), static_cast<int>(w));
    if (status != CUDNN_STATUS_SUCCESS) {
      cudnnDestroyTensorDescriptor(descriptor_);
      PARTRAIN_CUDNN_CHECK(status);
    }
  }
  ~TensorDescriptor() { cudnnDestroyTensorDescriptor(descriptor_); }
  TensorDescriptor(const TensorDescriptor&) = delete;
  TensorDescriptor& operator=(const TensorDescriptor&) = delete;
  cudnnTensorDescriptor_t get() const { return descriptor_; }

 private:
  cudnnTensorDescriptor_t descriptor_ = nullptr;
};

// cuDNN computes the batch statistics itself and divides by count − 1 for running_var, so it is
// used only with at least two elements per channel; int dimensions and strides must fit.
bool cudnn_batch_norm_applies(const Tensor& x, const BatchNormShape& s) {
  if (s.count() < 2 || x.numel() > INT_MAX) return false;
  for (int d = 0; d < 4; ++d)
    if (x.dim(d) > INT_MAX) return false;
  return true;
}

// True when cuDNN did not run the call: then the own kernels run instead, for any refusal (a
// NOT_SUPPORTED or BAD_PARAM status, which the legacy batch-norm API gives for a data type or shape
// it does not take, or any other status of a cuDNN version that behaves differently), so a cuDNN
// refusal never fails a ResNet step. The first refusal of each call is reported once on stderr.
bool cudnn_declined(cudnnStatus_t status, const char* call) {
  if (status == CUDNN_STATUS_SUCCESS) return false;
  static std::once_flag reported;
  std::call_once(reported, [&] {
    std::fprintf(stderr, "partrain: %s returned %s; BatchNorm runs on partrain's own CUDA kernels instead\n", call,
                 cudnnGetErrorString(status));
  });
  return true;
}

// weight (T) as f32 device data: the tensor itself for f32, a converted copy for bf16 (`holder`
// keeps it alive).
template <typename T>
const float* f32_parameter(CudaBackend& backend, const Tensor& parameter, Tensor& holder) {
  if constexpr (std::is_same_v<T, float>) {
    return device_data<float>(parameter);
  } else {
    holder = backend.empty(parameter.shape(), DType::F32);
    convert(device_data<T>(parameter), device_data<float>(holder), parameter.numel(), backend.stream());
    return device_data<float>(holder);
  }
}

template <typename T>
bool cudnn_batch_norm_forward(CudaBackend& backend, std::span<const Tensor> inputs, const Tensor& y,
                              const BatchNormShape& s, double eps, double momentum) {
  const Tensor& x = inputs[0];
  const TensorDescriptor x_descriptor(cudnn_type<T>(), x.dim(0), x.dim(1), x.dim(2), x.dim(3));
  const TensorDescriptor parameter_descriptor(CUDNN_DATA_FLOAT, 1, s.channels, 1, 1);
  Tensor weight_holder, bias_holder;
  const float* weight = f32_parameter<T>(backend, inputs[1], weight_holder);
  const float* bias = f32_parameter<T>(backend, inputs[2], bias_holder);
  const float one = 1.f, zero = 0.f;
  const cudnnStatus_t status = cudnnBatchNormalizationForwardTraining(
      backend.cudnn(), CUDNN_BATCHNORM_SPATIAL, &one, &zero, x_descriptor.get(), device_data<T>(x), x_descriptor.get(),
      device_data<T>(y), parameter_descriptor.get(), weight, bias, momentum, device_data<float>(inputs[3]),
      device_data<float>(inputs[4]), eps, nullptr, nullptr);
  return !cudnn_declined(status, "cudnnBatchNormalizationForwardTraining");
}

// The backward recomputes the batch statistics from x (savedMean / savedInvVariance NULL), as the
// CPU kernel does. Outputs that are not needed, and bf16 parameter gradients, go through
// temporaries (cuDNN writes every output; its parameter gradients are f32).
template <typename T>
bool cudnn_batch_norm_backward(CudaBackend& backend, std::span<const Tensor> inputs, const Tensor& dy,
                               std::span<const Tensor> input_grads, const BatchNormShape& s, double eps) {
  const cudaStream_t stream = backend.stream();
  const Tensor& x = inputs[0];
  const TensorDescriptor x_descriptor(cudnn_type<T>(), x.dim(0), x.dim(1), x.dim(2), x.dim(3));
  const TensorDescriptor parameter_descriptor(CUDNN_DATA_FLOAT, 1, s.channels, 1, 1);
  Tensor weight_holder;
  const float* weight = f32_parameter<T>(backend, inputs[1], weight_holder);
  const Tensor dx = input_grads[0].defined() ? input_grads[0] : backend.empty(x.shape(), x.dtype());
  const bool direct_weight = input_grads[1].defined() && std::is_same_v<T, float>;
  const bool direct_bias = input_grads[2].defined() && std::is_same_v<T, float>;
  const Tensor dweight = direct_weight ? input_grads[1] : backend.empty({s.channels}, DType::F32);
  const Tensor dbias = direct_bias ? input_grads[2] : backend.empty({s.channels}, DType::F32);
  const float one = 1.f, zero = 0.f;
  const cudnnStatus_t status = cudnnBatchNormalizationBackward(
      backend.cudnn(), CUDNN_BATCHNORM_SPATIAL, &one, &zero, &one, &zero, x_descriptor.get(), device_data<T>(x),
      x_descriptor.get(), device_data<T>(dy), x_descriptor.get(), device_data<T>(dx), parameter_descriptor.get(),
      weight, device_data<float>(dweight), device_data<float>(dbias), eps, nullptr, nullptr);
  if (cudnn_declined(status, "cudnnBatchNormalizationBackward")) return false;
  if (input_grads[1].defined() && !direct_weight)
    convert(device_data<float>(dweight), device_data<T>(input_grads[1]), s.channels, stream);
  if (input_grads[2].defined() && !direct_bias)
    convert(device_data<float>(dbias), device_data<T>(input_grads[2]), s.channels, stream);
  return true;
}

void check_running_statistics(std::span<const Tensor> inputs) {
  for (int i : {3, 4})
    PARTRAIN_CHECK(inputs[i].dtype() == DType::F32, "BatchNorm2d " << (i == 3 ? "running_mean" : "running_var")
                                                                   << " must be f32, got "
                                                                   << dtype_name(inputs[i].dtype()));
}

void batch_norm_forward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  CudaBackend& backend = cuda_of(context);
  const cudaStream_t stream = backend.stream();
  const Tensor& x = inputs[0];
  const Tensor& y = outputs[0];
  check_running_statistics(inputs);
  const BatchNormShape s = batch_norm_shape(x);
  if (s.channels == 0) return;
  const double eps = attribute_eps(context);
  const double momentum = context.attributes.get_float("momentum", 0.1);
  const bool training = context.training;
  dispatch_floating(x.dtype(), "BatchNorm2d", [&](auto tag) {
    using T = decltype(tag);
    if (training && cudnn_batch_norm_applies(x, s) && cudnn_batch_norm_forward<T>(backend, inputs, y, s, eps, momentum))
      return;
    const Tensor coefficients = backend.empty({2 * s.channels}, DType::F32);
    float* scale = device_data<float>(coefficients);
    float* shift = scale + s.channels;
    batch_norm_coefficients_kernel<T><<<row_blocks(s.channels), training ? kMaxRowThreads : 32, 0, stream>>>(
        device_data<T>(x), device_data<T>(inputs[1]), device_data<T>(inputs[2]), device_data<float>(inputs[3]),
        device_data<float>(inputs[4]), scale, shift, s.batch, s.channels, s.plane, eps, momentum, training);
    PARTRAIN_CUDA_CHECK_LAUNCH();
    const std::int64_t n = x.numel();
    if (n == 0) return;
    batch_norm_apply_kernel<T><<<blocks_for(n), kThreadsPerBlock, 0, stream>>>(
        device_data<T>(x), scale, shift, device_data<T>(y), n, s.channels, s.plane);
    PARTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void batch_norm_backward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor>,
                         std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  CudaBackend& backend = cuda_of(context);
  const cudaStream_t stream = backend.stream();
  const Tensor& x = inputs[0];
  check_running_statistics(inputs);
  const BatchNormShape s = batch_norm_shape(x);
  const double eps = attribute_eps(context);
  const bool training = context.training;
  // Running statistics get no gradient.
  for (int i : {3, 4})
    if (input_grads[i].defined())
      PARTRAIN_CUDA_CHECK(cudaMemsetAsync(input_grads[i].raw_data(), 0, input_grads[i].nbytes(), stream));
  if (s.channels == 0 || (!input_grads[0].defined() && !input_grads[1].defined() && !input_grads[2].defined())) return;
  dispatch_floating(x.dtype(), "BatchNorm2d backward", [&](auto tag) {
    using T = decltype(tag);
    if (training && cudnn_batch_norm_applies(x, s) &&
        cudnn_batch_norm_backward<T>(backend, inputs, output_grads[0], input_grads, s, eps))
      return;
    auto optional = [](const Tensor& tensor) { return tensor.defined() ? device_data<T>(tensor) : nullptr; };
    batch_norm_backward_kernel<T><<<row_blocks(s.channels), kMaxRowThreads, 0, stream>>>(
        device_data<T>(x), device_data<T>(inputs[1]), device_data<float>(inputs[3]), device_data<float>(inputs[4]),
        device_data<T>(output_grads[0]), optional(input_grads[0]), optional(input_grads[1]), optional(input_grads[2]),
        s.batch, s.channels, s.plane, eps, training);
    PARTRAIN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void register_cuda_normalization_kernels(Backend& backend) {
  backend.set_kernels(OpType::LayerNorm, {layer_norm_forward, layer_norm_backward});
  backend.set_kernels(OpType::BatchNorm2d, {batch_norm_forward, batch_norm_backward});
}

}  // namespace partrain::cuda
