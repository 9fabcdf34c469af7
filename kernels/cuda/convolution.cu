// CUDA kernels of the convolution ops (schemas: src/graph/ops/convolution.cpp; reference semantics
// and checks: kernels/cpu/convolution.cpp). Overview in convolution.cuh.
#include "kernels/cuda/convolution.cuh"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/common/op_geometry.h"
#include "kernels/cuda/cuda_common.cuh"

namespace partrain::cuda {

namespace {

#define PARTRAIN_GRID_STRIDE(i, n)                                                                  \
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

// ---------------- element-wise helpers ----------------
template <typename T>
__global__ void to_f32_kernel(float* __restrict__ out, const T* __restrict__ in, std::int64_t count) {
  PARTRAIN_GRID_STRIDE(i, count) out[i] = to_float(in[i]);
}

template <typename T>
__global__ void from_f32_kernel(T* __restrict__ out, const float* __restrict__ in, std::int64_t count) {
  PARTRAIN_GRID_STRIDE(i, count) out[i] = from_float<T>(in[i]);
}

// An f32 copy of a bf16 device tensor in scratch memory.
Tensor f32_copy(const CudaBackend& cuda, const Tensor& tensor) {
  Tensor copy = cuda.scratch(static_cast<std::size_t>(std::max<std::int64_t>(tensor.numel(), 1)) * sizeof(float));
  if (tensor.numel() > 0) {
    to_f32_kernel<__nv_bfloat16><<<blocks_for(tensor.numel()), kThreadsPerBlock, 0, cuda.stream()>>>(
        static_cast<float*>(copy.raw_data()), device_data<__nv_bfloat16>(tensor), tensor.numel());
    PARTRAIN_CUDA_CHECK_LAUNCH();
  }
  return copy;
}

// An uninitialised f32 scratch buffer of `count` floats.
Tensor f32_scratch(const CudaBackend& cuda, std::int64_t count) {
  return cuda.scratch(static_cast<std::size_t>(std::max<std::int64_t>(count, 1)) * sizeof(float));
}

// bf16 tensor = round(f32 buffer), element by element.
void round_into(const CudaBackend& cuda, const Tensor& destination, const float* source) {
  if (destination.numel() == 0) return;
  from_f32_kernel<__nv_bfloat16><<<blocks_for(destination.numel()), kThreadsPerBlock, 0, cuda.stream()>>>(
      device_data<__nv_bfloat16>(destination), source, destination.numel());
  PARTRAIN_CUDA_CHECK_LAUNCH();
}

// out[r] = (sum over k < length of in[r * length + k]) / divisor, one warp per row, fp32 sums.
template <typename In, typename Out>
__global__ void row_sum_kernel(const In* __restrict__ in, Out* __restrict__ out, std::int64_t rows, std::int64_t length,
                               float divisor) {
  const int lane = threadIdx.x % 32;
  const std::int64_t warps_per_block = blockDim.x / 32;
  for (std::int64_t row = blockIdx.x * warps_per_block + threadIdx.x / 32; row < rows;
       row += static_cast<std::int64_t>(gridDim.x) * warps_per_block) {
    const In* values = in + row * length;
    float sum = 0.f;
    for (std::int64_t k = lane; k < length; k += 32) sum += to_float(values[k]);
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) out[row] = from_float<Out>(sum / divisor);
  }
}

template <typename In, typename Out>
void launch_row_sum(cudaStream_t stream, const In* in, Out* out, std::int64_t rows, std::int64_t length, float divisor) {
  if (rows == 0) return;
  constexpr int kWarpsPerBlock = kThreadsPerBlock / 32;
  const std::int64_t blocks = std::min<std::int64_t>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock, 65535 * 8);
  row_sum_kernel<In, Out><<<static_cast<unsigned int>(blocks), kThreadsPerBlock, 0, stream>>>(in, out, rows, length,
                                                                                              divisor);
  PARTRAIN_CUDA_CHECK_LAUNCH();
}

// ---------------- Conv2d ----------------
using kernels::ConvGeometry;

// kernels::conv_geometry with the CUDA kernels' extra checks: ranks first, output channels
// divisible by the groups, device tensors of one dtype.
ConvGeometry conv_geometry(const Attributes& attributes, const Tensor& x, const Tensor& w, const Tensor& y) {
  PARTRAIN_CHECK(x.rank() == 4 && w.rank() == 4 && y.rank() == 4,
                 "Conv2d kernel got input " << shape_string(x.shape()) << ", weight " << shape_string(w.shape())
                                            << ", output " << shape_string(y.shape()));
  const ConvGeometry g = kernels::conv_geometry(attributes, x, w, y);
  PARTRAIN_CHECK(g.out_channels % g.groups == 0,
                 "Conv2d kernel got input " << shape_string(x.shape()) << ", weight " << shape_string(w.shape())
                                            << ", output " << shape_string(y.shape()) << ", groups " << g.groups);
  PARTRAIN_CHECK(!x.device().is_cpu() && !w.device().is_cpu() && !y.device().is_cpu(),
                 "Conv2d CUDA kernel given a host tensor");
  PARTRAIN_CHECK(x.dtype() == w.dtype() && y.dtype() == x.dtype(),
                 "Conv2d kernel: input " << dtype_name(x.dtype()) << ", weight " << dtype_name(w.dtype()) << ", output "
                                         << dtype_name(y.dtype()) << " must share one dtype");
  return g;
}

// A dimension as a cuDNN int.
int cudnn_int(std::int64_t value, const char* what) {
  PARTRAIN_CHECK(value >= 0 && value <= std::numeric_limits<int>::max(),
                 "Conv2d: " << what << " " << value << " does not fit cuDNN's int");
  return static_cast<int>(value);
}

cudnnDataType_t cudnn_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return CUDNN_DATA_FLOAT;
    case DType::BF16: return CUDNN_DATA_BFLOAT16;
    default: PARTRAIN_FAIL("Conv2d: CUDA kernels take f32 or bf16, got " << dtype_name(dtype));
  }
}

// fp32: FMA kernels only (TF32 tensor cores would round the inputs to 10-bit mantissas, far from
// the fp32 CPU reference). bf16: tensor cores (fp32 accumulation).
cudnnMathType_t preferred_math(DType dtype) { return dtype == DType::F32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH; }

// RAII cuDNN descriptors (a failed constructor still destroys the ones already made).
struct TensorDescriptor {
  cudnnTensorDescriptor_t handle = nullptr;
  TensorDescriptor() { PARTRAIN_CUDNN_CHECK(cudnnCreateTensorDescriptor(&handle)); }
  ~TensorDescriptor() { cudnnDestroyTensorDescriptor(handle); }
  TensorDescriptor(const TensorDescriptor&) = delete;
  TensorDescriptor& operator=(const TensorDescriptor&) = delete;
};
struct FilterDescriptor {
  cudnnFilterDescriptor_t handle = nullptr;
  FilterDescriptor() { PARTRAIN_CUDNN_CHECK(cudnnCreateFilterDescriptor(&handle)); }
  ~FilterDescriptor() { cudnnDestroyFilterDescriptor(handle); }
  FilterDescriptor(const FilterDescriptor&) = delete;
  FilterDescriptor& operator=(const FilterDescriptor&) = delete;
};
struct ConvolutionDescriptor {
  cudnnConvolutionDescriptor_t handle = nullptr;
  ConvolutionDescriptor() { PARTRAIN_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&handle)); }
  ~ConvolutionDescriptor() { cudnnDestroyConvolutionDescriptor(handle); }
  ConvolutionDescriptor(const ConvolutionDescriptor&) = delete;
  ConvolutionDescriptor& operator=(const ConvolutionDescriptor&) = delete;
};

// x [N, C, H, W], w [O, C/groups, kh, kw], y [N, O, OH, OW] (dense NCHW), cross-correlation (as
// PyTorch and the CPU im2col), fp32 compute, the geometry's padding/stride/dilation/groups.
struct ConvDescriptors {
  TensorDescriptor x, y;
  FilterDescriptor w;
  ConvolutionDescriptor conv;

  ConvDescriptors(const ConvGeometry& g, DType dtype) {
    const cudnnDataType_t type = cudnn_type(dtype);
    PARTRAIN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x.handle, CUDNN_TENSOR_NCHW, type, cudnn_int(g.batch, "batch"),
                                                    cudnn_int(g.channels, "channels"), cudnn_int(g.height, "height"),
                                                    cudnn_int(g.width, "width")));
    PARTRAIN_CUDNN_CHECK(cudnnSetTensor4dDescriptor(
        y.handle, CUDNN_TENSOR_NCHW, type, cudnn_int(g.batch, "batch"), cudnn_int(g.out_channels, "output channels"),
        cudnn_int(g.out_height, "output height"), cudnn_int(g.out_width, "output width")));
    PARTRAIN_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w.handle, type, CUDNN_TENSOR_NCHW,
                                                    cudnn_int(g.out_channels, "output channels"),
                                                    cudnn_int(g.channels / g.groups, "channels per group"),
                                                    cudnn_int(g.kernel_h, "kernel height"),
                                                    cudnn_int(g.kernel_w, "kernel width")));
    PARTRAIN_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
        conv.handle, cudnn_int(g.pad_h, "padding"), cudnn_int(g.pad_w, "padding"), cudnn_int(g.stride_h, "stride"),
        cudnn_int(g.stride_w, "stride"), cudnn_int(g.dilation_h, "dilation"), cudnn_int(g.dilation_w, "dilation"),
        CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    PARTRAIN_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv.handle, cudnn_int(g.groups, "groups")));
    PARTRAIN_CUDNN_CHECK(cudnnSetConvolutionMathType(conv.handle, preferred_math(dtype)));
    // cuDNN's output size must be the schema's (same formula; guards against a geometry mix-up).
    int n = 0, c = 0, h = 0, wd = 0;
    PARTRAIN_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(conv.handle, x.handle, w.handle, &n, &c, &h, &wd));
    PARTRAIN_CHECK(n == g.batch && c == g.out_channels && h == g.out_height && wd == g.out_width,
                   "Conv2d: cuDNN computes output [" << n << ", " << c << ", " << h << ", " << wd << "], the schema ["
                                                     << g.batch << ", " << g.out_channels << ", " << g.out_height
                                                     << ", " << g.out_width << "]");
  }
};

enum class ConvPass : std::int64_t { Forward = 0, BackwardData = 1, BackwardFilter = 2 };

const char* pass_name(ConvPass pass) {
  switch (pass) {
    case ConvPass::Forward: return "forward";
    case ConvPass::BackwardData: return "backward data";
    default: return "backward filter";
  }
}

// One algorithm of one pass for one shape, with the math type and workspace it runs with.
struct ConvAlgorithm {
  int algo = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  std::size_t workspace = 0;
};

// Algorithms needing more workspace than this are skipped (a fallback with less always exists:
// implicit GEMM needs none or little).
constexpr std::size_t kMaxWorkspaceBytes = std::size_t{1} << 30;

using ConvKey = std::array<std::int64_t, 18>;

ConvKey conv_key(ConvPass pass, int device, DType dtype, const ConvGeometry& g) {
  return {static_cast<std::int64_t>(pass), device, static_cast<std::int64_t>(dtype), g.batch, g.channels, g.height,
          g.width, g.out_channels, g.kernel_h, g.kernel_w, g.stride_h, g.stride_w, g.pad_h, g.pad_w, g.dilation_h,
          g.dilation_w, g.groups, g.out_height};
}

// Process-wide cache of each shape's candidate algorithms, best first (the heuristics query costs
// host time; shapes repeat every step). An algorithm refused at run time is dropped from its list,
// so the next step starts with the next one. Guarded by a mutex: backends of several GPUs may run
// in threads.
std::mutex& cache_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::map<ConvKey, std::vector<ConvAlgorithm>>& algorithm_cache() {
  static std::map<ConvKey, std::vector<ConvAlgorithm>> cache;
  return cache;
}

// The algorithms in the heuristics' order (best predicted first) that cuDNN reports usable, whose
// workspace can be queried and is at most kMaxWorkspaceBytes; then implicit GEMM (algorithm 0 of
// every pass) as the last resort. fp32: results labelled with tensor-op math come after the others
// and everything runs with CUDNN_FMA_MATH (no TF32, as the CPU); bf16: the algorithm's own math.
template <typename Perf, typename WorkspaceQuery>
std::vector<ConvAlgorithm> usable_algorithms(const std::vector<Perf>& results, int count, DType dtype,
                                             cudnnConvolutionDescriptor_t conv, WorkspaceQuery&& workspace_query) {
  std::vector<ConvAlgorithm> usable;
  const auto add = [&](int algo, cudnnMathType_t math) {
    for (const ConvAlgorithm& known : usable)
      if (known.algo == algo && known.math == math) return;
    if (cudnnSetConvolutionMathType(conv, math) != CUDNN_STATUS_SUCCESS) return;
    std::size_t bytes = 0;
    if (workspace_query(algo, &bytes) != CUDNN_STATUS_SUCCESS || bytes > kMaxWorkspaceBytes) return;
    usable.push_back({algo, math, bytes});
  };
  for (int round = 0; round < 2; ++round)
    for (int i = 0; i < count; ++i) {
      const Perf& result = results[i];
      if (result.status != CUDNN_STATUS_SUCCESS) continue;
      const bool tensor_op =
          result.mathType == CUDNN_TENSOR_OP_MATH || result.mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
      if (dtype == DType::F32 && round == 0 && tensor_op) continue;
      if ((dtype != DType::F32 || !tensor_op) && round == 1) continue;  // each result once
      add(static_cast<int>(result.algo), dtype == DType::F32 ? CUDNN_FMA_MATH : result.mathType);
    }
  add(0, dtype == DType::F32 ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH);  // implicit GEMM
  return usable;
}

std::vector<ConvAlgorithm> search_algorithms(cudnnHandle_t handle, ConvPass pass, DType dtype,
                                             const ConvDescriptors& d) {
  int max_count = 0, returned = 0;
  switch (pass) {
    case ConvPass::Forward: {
      PARTRAIN_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(handle, &max_count));
      std::vector<cudnnConvolutionFwdAlgoPerf_t> results(static_cast<std::size_t>(std::max(max_count, 1)));
      if (cudnnGetConvolutionForwardAlgorithm_v7(handle, d.x.handle, d.w.handle, d.conv.handle, d.y.handle, max_count,
                                                 &returned, results.data()) != CUDNN_STATUS_SUCCESS)
        returned = 0;
      return usable_algorithms(results, returned, dtype, d.conv.handle, [&](int algo, std::size_t* bytes) {
        return cudnnGetConvolutionForwardWorkspaceSize(handle, d.x.handle, d.w.handle, d.conv.handle, d.y.handle,
                                                       static_cast<cudnnConvolutionFwdAlgo_t>(algo), bytes);
      });
    }
    case ConvPass::BackwardData: {
      PARTRAIN_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(handle, &max_count));
      std::vector<cudnnConvolutionBwdDataAlgoPerf_t> results(static_cast<std::size_t>(std::max(max_count, 1)));
      if (cudnnGetConvolutionBackwardDataAlgorithm_v7(handle, d.w.handle, d.y.handle, d.conv.handle, d.x.handle,
                                                      max_count, &returned, results.data()) != CUDNN_STATUS_SUCCESS)
        returned = 0;
      return usable_algorithms(results, returned, dtype, d.conv.handle, [&](int algo, std::size_t* bytes) {
        return cudnnGetConvolutionBackwardDataWorkspaceSize(handle, d.w.handle, d.y.handle, d.conv.handle, d.x.handle,
                                                            static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), bytes);
      });
    }
    default: {
      PARTRAIN_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(handle, &max_count));
      std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> results(static_cast<std::size_t>(std::max(max_count, 1)));
      if (cudnnGetConvolutionBackwardFilterAlgorithm_v7(handle, d.x.handle, d.y.handle, d.conv.handle, d.w.handle,
                                                        max_count, &returned, results.data()) != CUDNN_STATUS_SUCCESS)
        returned = 0;
      return usable_algorithms(results, returned, dtype, d.conv.handle, [&](int algo, std::size_t* bytes) {
        return cudnnGetConvolutionBackwardFilterWorkspaceSize(handle, d.x.handle, d.y.handle, d.conv.handle,
                                                              d.w.handle,
                                                              static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), bytes);
      });
    }
  }
}

// The cached candidates of `pass` for this shape (searched on first use).
std::vector<ConvAlgorithm> find_algorithms(const CudaBackend& cuda, ConvPass pass, const ConvGeometry& g, DType dtype,
                                           const ConvDescriptors& d) {
  const ConvKey key = conv_key(pass, cuda.device().index, dtype, g);
  std::lock_guard<std::mutex> lock(cache_mutex());
  auto& cache = algorithm_cache();
  auto found = cache.find(key);
  if (found == cache.end()) found = cache.emplace(key, search_algorithms(cuda.cudnn(), pass, dtype, d)).first;
  return found->second;
}

// Drops `algorithm` from this shape's candidates after cuDNN refused to run it.
void drop_algorithm(const CudaBackend& cuda, ConvPass pass, const ConvGeometry& g, DType dtype,
                    const ConvAlgorithm& algorithm) {
  std::lock_guard<std::mutex> lock(cache_mutex());
  std::vector<ConvAlgorithm>& candidates = algorithm_cache()[conv_key(pass, cuda.device().index, dtype, g)];
  std::erase_if(candidates, [&](const ConvAlgorithm& c) { return c.algo == algorithm.algo && c.math == algorithm.math; });
}

// One attempt of `pass` with `algorithm`; returns cuDNN's status.
cudnnStatus_t run_algorithm(const CudaBackend& cuda, ConvPass pass, const ConvDescriptors& d,
                            const ConvAlgorithm& algorithm, const void* first, const void* second, void* out) {
  PARTRAIN_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.handle, algorithm.math));
  Tensor workspace;
  void* workspace_data = nullptr;
  if (algorithm.workspace > 0) {
    workspace = cuda.scratch(algorithm.workspace);
    workspace_data = workspace.raw_data();
  }
  const float one = 1.f, zero = 0.f;  // fp32 scaling factors for fp32 and bf16 data alike
  switch (pass) {
    case ConvPass::Forward:  // first = x, second = w, out = y
      return cudnnConvolutionForward(cuda.cudnn(), &one, d.x.handle, first, d.w.handle, second, d.conv.handle,
                                     static_cast<cudnnConvolutionFwdAlgo_t>(algorithm.algo), workspace_data,
                                     algorithm.workspace, &zero, d.y.handle, out);
    case ConvPass::BackwardData:  // first = w, second = dy, out = dx
      return cudnnConvolutionBackwardData(cuda.cudnn(), &one, d.w.handle, first, d.y.handle, second, d.conv.handle,
                                          static_cast<cudnnConvolutionBwdDataAlgo_t>(algorithm.algo), workspace_data,
                                          algorithm.workspace, &zero, d.x.handle, out);
    default:  // BackwardFilter: first = x, second = dy, out = dw
      return cudnnConvolutionBackwardFilter(cuda.cudnn(), &one, d.x.handle, first, d.y.handle, second, d.conv.handle,
                                            static_cast<cudnnConvolutionBwdFilterAlgo_t>(algorithm.algo),
                                            workspace_data, algorithm.workspace, &zero, d.w.handle, out);
  }
}

// Runs one cuDNN pass with tensors of `dtype` (device pointers; output overwritten, beta = 0): the
// shape's candidates in order, each refused one dropped for good (a cuDNN version may list an
// algorithm it then will not run), down to implicit GEMM. Returns false, without touching the
// output, when no candidate runs a bf16 shape (the caller falls back to fp32 copies); for fp32
// that is an error naming the shape and cuDNN's last status.
bool run_cudnn(const CudaBackend& cuda, ConvPass pass, const ConvGeometry& g, DType dtype, const void* first,
               const void* second, void* out) {
  const ConvDescriptors d(g, dtype);
  cudnnStatus_t status = CUDNN_STATUS_NOT_SUPPORTED;
  for (const ConvAlgorithm& algorithm : find_algorithms(cuda, pass, g, dtype, d)) {
    status = run_algorithm(cuda, pass, d, algorithm, first, second, out);
    if (status == CUDNN_STATUS_SUCCESS) return true;
    drop_algorithm(cuda, pass, g, dtype, algorithm);
  }
  PARTRAIN_CHECK(dtype != DType::F32, "Conv2d " << pass_name(pass) << ": cuDNN runs no fp32 algorithm for input ["
                                                << g.batch << ", " << g.channels << ", " << g.height << ", " << g.width
                                                << "], weight [" << g.out_channels << ", " << g.channels / g.groups
                                                << ", " << g.kernel_h << ", " << g.kernel_w << "], groups " << g.groups
                                                << " (last status: " << cudnnGetErrorString(status) << ")");
  // The fp32 fallback is correct but slower (no tensor cores, converted copies): say so once, so a
  // benchmark's figure can be read.
  static std::once_flag reported;
  std::call_once(reported, [&] {
    std::fprintf(stderr, "partrain: cuDNN runs no %s algorithm for Conv2d %s of input [%lld, %lld, %lld, %lld] (last "
                 "status: %s); such convolutions run in fp32 on converted copies\n", dtype_name(dtype),
                 pass_name(pass), static_cast<long long>(g.batch), static_cast<long long>(g.channels),
                 static_cast<long long>(g.height), static_cast<long long>(g.width), cudnnGetErrorString(status));
  });
  return false;
}

// y[n, o, p] += bias[o] (fp32 add, one rounding to T).
template <typename T, typename B>
__global__ void add_bias_kernel(T* __restrict__ y, const B* __restrict__ bias, std::int64_t total, std::int64_t plane,
                                std::int64_t channels) {
  PARTRAIN_GRID_STRIDE(i, total) {
    const std::int64_t o = (i / plane) % channels;
    y[i] = from_float<T>(to_float(y[i]) + to_float(bias[o]));
  }
}

template <typename T, typename B>
void launch_add_bias(cudaStream_t stream, T* y, const B* bias, const ConvGeometry& g) {
  const std::int64_t total = g.batch * g.out_channels * g.out_plane();
  if (total == 0) return;
  add_bias_kernel<T, B><<<blocks_for(total), kThreadsPerBlock, 0, stream>>>(y, bias, total, g.out_plane(),
                                                                            g.out_channels);
  PARTRAIN_CUDA_CHECK_LAUNCH();
}

// db[o] = sum over n of partial[n * channels + o] (fixed order: deterministic).
template <typename T>
__global__ void sum_over_batch_kernel(const float* __restrict__ partial, T* __restrict__ db, std::int64_t batch,
                                      std::int64_t channels) {
  PARTRAIN_GRID_STRIDE(o, channels) {
    float sum = 0.f;
    for (std::int64_t n = 0; n < batch; ++n) sum += partial[n * channels + o];
    db[o] = from_float<T>(sum);
  }
}

void conv2d_forward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  const CudaBackend& cuda = cuda_of(context);
  cudaStream_t stream = cuda.stream();
  const Tensor& x = inputs[0];
  const Tensor& weight = inputs[1];
  const Tensor& y = outputs[0];
  const Tensor bias = inputs.size() > 2 ? inputs[2] : Tensor();
  const ConvGeometry g = conv_geometry(context.attributes, x, weight, y);
  if (bias.defined())
    PARTRAIN_CHECK(bias.numel() == g.out_channels && is_floating(bias.dtype()),
                   "Conv2d kernel got bias " << shape_string(bias.shape()) << " " << dtype_name(bias.dtype()));
  if (y.numel() == 0) return;
  const DType dtype = x.dtype();
  // fp32 always runs on cuDNN (run_cudnn throws when it cannot); bf16 when cuDNN has an algorithm.
  if (run_cudnn(cuda, ConvPass::Forward, g, dtype, x.raw_data(), weight.raw_data(), y.raw_data())) {
    // bf16: the convolution result is rounded to bf16 before the bias is added, a second rounding
    // the CPU reference does not have (the two differ by at most 1 bf16 ulp).
    if (bias.defined())
      dispatch_floating(dtype, "Conv2d", [&](auto tag) {
        using T = decltype(tag);
        dispatch_floating(bias.dtype(), "Conv2d bias", [&](auto bias_tag) {
          using B = decltype(bias_tag);
          launch_add_bias(stream, device_data<T>(y), device_data<B>(bias), g);
        });
      });
    return;
  }
  // bf16 fallback: fp32 cuDNN on converted copies, bias in fp32, one rounding (the CPU's numbers).
  const Tensor x32 = f32_copy(cuda, x), w32 = f32_copy(cuda, weight);
  const Tensor y32 = f32_scratch(cuda, y.numel());
  auto* py32 = static_cast<float*>(y32.raw_data());
  run_cudnn(cuda, ConvPass::Forward, g, DType::F32, x32.raw_data(), w32.raw_data(), py32);
  if (bias.defined())
    dispatch_floating(bias.dtype(), "Conv2d bias", [&](auto bias_tag) {
      using B = decltype(bias_tag);
      launch_add_bias(stream, py32, device_data<B>(bias), g);
    });
  round_into(cuda, y, py32);
}

// dx = conv^T(w, dy) (cuDNN backward data), dw = corr(x, dy) (backward filter), db = sum of dy over
// n, oh, ow (own reduction). Each is computed only when its gradient is defined.
void conv2d_backward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                     std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  const CudaBackend& cuda = cuda_of(context);
  cudaStream_t stream = cuda.stream();
  const Tensor& x = inputs[0];
  const Tensor& weight = inputs[1];
  const Tensor& dy = output_grads[0];
  // The output's geometry from dy, its gradient (same shape and dtype, on the device): the backward
  // does not read the output, so training hands a shape-only stand-in for it, which has no device.
  (void)outputs;
  const ConvGeometry g = conv_geometry(context.attributes, x, weight, dy);
  const Tensor& dx = input_grads[0];
  const Tensor& dweight = input_grads[1];
  const Tensor dbias = input_grads.size() > 2 ? input_grads[2] : Tensor();
  const DType dtype = x.dtype();
  PARTRAIN_CHECK(!dy.device().is_cpu() && (!dx.defined() || !dx.device().is_cpu()) &&
                     (!dweight.defined() || !dweight.device().is_cpu()),
                 "Conv2d backward CUDA kernel given a host tensor");
  PARTRAIN_CHECK(dy.dtype() == dtype && dy.numel() == outputs[0].numel(),
                 "Conv2d backward: output gradient " << shape_string(dy.shape()) << " " << dtype_name(dy.dtype()));
  PARTRAIN_CHECK(!dx.defined() || (dx.dtype() == dtype && dx.numel() == x.numel()), "Conv2d backward: bad input gradient");
  PARTRAIN_CHECK(!dweight.defined() || (dweight.dtype() == dtype && dweight.numel() == weight.numel()),
                 "Conv2d backward: bad weight gradient");
  PARTRAIN_CHECK(!dbias.defined() || (is_floating(dbias.dtype()) && dbias.numel() == g.out_channels),
                 "Conv2d backward: bad bias gradient");

  if (dbias.defined() && g.out_channels > 0) {
    // partial[n, o] = sum over the plane (one warp per row), then a fixed-order sum over n.
    const Tensor partial = f32_scratch(cuda, g.batch * g.out_channels);
    auto* ppartial = static_cast<float*>(partial.raw_data());
    dispatch_floating(dtype, "Conv2d backward", [&](auto tag) {
      using T = decltype(tag);
      launch_row_sum<T, float>(stream, device_data<T>(dy), ppartial, g.batch * g.out_channels, g.out_plane(), 1.f);
    });
    dispatch_floating(dbias.dtype(), "Conv2d bias gradient", [&](auto tag) {
      using B = decltype(tag);
      sum_over_batch_kernel<B><<<blocks_for(g.out_channels), kThreadsPerBlock, 0, stream>>>(
          ppartial, device_data<B>(dbias), g.batch, g.out_channels);
      PARTRAIN_CUDA_CHECK_LAUNCH();
    });
  }
  if (g.batch == 0) {  // cuDNN rejects empty batches; the weight gradient of no samples is zero
    if (dweight.defined() && dweight.nbytes() > 0)
      PARTRAIN_CUDA_CHECK(cudaMemsetAsync(dweight.raw_data(), 0, dweight.nbytes(), stream));
    return;
  }
  if (dx.defined() && !run_cudnn(cuda, ConvPass::BackwardData, g, dtype, weight.raw_data(), dy.raw_data(), dx.raw_data())) {
    // bf16 fallback: fp32 on converted copies, one rounding.
    const Tensor w32 = f32_copy(cuda, weight), dy32 = f32_copy(cuda, dy);
    const Tensor dx32 = f32_scratch(cuda, dx.numel());
    run_cudnn(cuda, ConvPass::BackwardData, g, DType::F32, w32.raw_data(), dy32.raw_data(), dx32.raw_data());
    round_into(cuda, dx, static_cast<const float*>(dx32.raw_data()));
  }
  if (dweight.defined() &&
      !run_cudnn(cuda, ConvPass::BackwardFilter, g, dtype, x.raw_data(), dy.raw_data(), dweight.raw_data())) {
    const Tensor x32 = f32_copy(cuda, x), dy32 = f32_copy(cuda, dy);
    const Tensor dw32 = f32_scratch(cuda, dweight.numel());
    run_cudnn(cuda, ConvPass::BackwardFilter, g, DType::F32, x32.raw_data(), dy32.raw_data(), dw32.raw_data());
    round_into(cuda, dweight, static_cast<const float*>(dw32.raw_data()));
  }
}

// ---------------- MaxPool2d ----------------
using kernels::PoolGeometry;

// kernels::pool_geometry; the CUDA kernels also want x and y of one dtype.
PoolGeometry pool_geometry(const Attributes& attributes, const Tensor& x, const Tensor& y) {
  const PoolGeometry g = kernels::pool_geometry(attributes, x, y);
  PARTRAIN_CHECK(x.dtype() == y.dtype(),
                 "MaxPool2d kernel got input " << shape_string(x.shape()) << ", output " << shape_string(y.shape()));
  return g;
}

// Index (in the plane) of the first maximum of window (oh, ow), padded positions excluded; a NaN
// wins over numbers. The CPU's window_argmax, comparing the same fp32 values (bf16 widens exactly).
template <typename T>
__device__ std::int64_t window_argmax(const PoolGeometry& g, const T* plane, std::int64_t oh, std::int64_t ow) {
  const std::int64_t h0 = oh * g.stride_h - g.pad_h, w0 = ow * g.stride_w - g.pad_w;
  const std::int64_t ki_lo = h0 < 0 ? -h0 : 0, ki_hi = g.kernel_h < g.height - h0 ? g.kernel_h : g.height - h0;
  const std::int64_t kj_lo = w0 < 0 ? -w0 : 0, kj_hi = g.kernel_w < g.width - w0 ? g.kernel_w : g.width - w0;
  std::int64_t best = -1;
  float best_value = 0.f;
  for (std::int64_t ki = ki_lo; ki < ki_hi; ++ki)
    for (std::int64_t kj = kj_lo; kj < kj_hi; ++kj) {
      const std::int64_t index = (h0 + ki) * g.width + w0 + kj;
      const float value = to_float(plane[index]);
      if (best < 0 || value > best_value || (isnan(value) && !isnan(best_value))) {
        best = index;
        best_value = value;
      }
    }
  return best;  // never -1 for schema-valid padding (<= kernel / 2)
}

template <typename T>
__global__ void maxpool_forward_kernel(const T* __restrict__ x, T* __restrict__ y, PoolGeometry g) {
  const std::int64_t in_plane = g.height * g.width, out_plane = g.out_height * g.out_width;
  PARTRAIN_GRID_STRIDE(i, g.planes * out_plane) {
    const std::int64_t p = i / out_plane, r = i % out_plane;
    const T* plane = x + p * in_plane;
    const std::int64_t best = window_argmax(g, plane, r / g.out_width, r % g.out_width);
    y[i] = best >= 0 ? plane[best] : from_float<T>(-INFINITY);
  }
}

template <typename T>
__global__ void maxpool_argmax_kernel(const T* __restrict__ x, std::int32_t* __restrict__ argmax, PoolGeometry g) {
  const std::int64_t in_plane = g.height * g.width, out_plane = g.out_height * g.out_width;
  PARTRAIN_GRID_STRIDE(i, g.planes * out_plane) {
    const std::int64_t p = i / out_plane, r = i % out_plane;
    argmax[i] = static_cast<std::int32_t>(window_argmax(g, x + p * in_plane, r / g.out_width, r % g.out_width));
  }
}

// dx[p, ih, iw] = sum of dy[p, oh, ow] over the windows whose argmax is (ih, iw), visited in
// (oh, ow) row-major order from 0: the CPU's order of additions, so fp32 results are identical.
template <typename T>
__global__ void maxpool_backward_kernel(const std::int32_t* __restrict__ argmax, const T* __restrict__ dy,
                                        T* __restrict__ dx, PoolGeometry g) {
  const std::int64_t in_plane = g.height * g.width, out_plane = g.out_height * g.out_width;
  PARTRAIN_GRID_STRIDE(i, g.planes * in_plane) {
    const std::int64_t p = i / in_plane, r = i % in_plane;
    const std::int64_t ih = r / g.width, iw = r % g.width;
    // Windows containing row ih: oh * stride - pad <= ih <= oh * stride - pad + kernel - 1.
    const std::int64_t h_low = ih + g.pad_h - g.kernel_h + 1, w_low = iw + g.pad_w - g.kernel_w + 1;
    const std::int64_t oh_lo = h_low <= 0 ? 0 : (h_low + g.stride_h - 1) / g.stride_h;
    const std::int64_t ow_lo = w_low <= 0 ? 0 : (w_low + g.stride_w - 1) / g.stride_w;
    const std::int64_t oh_last = (ih + g.pad_h) / g.stride_h, ow_last = (iw + g.pad_w) / g.stride_w;
    const std::int64_t oh_hi = oh_last < g.out_height - 1 ? oh_last : g.out_height - 1;
    const std::int64_t ow_hi = ow_last < g.out_width - 1 ? ow_last : g.out_width - 1;
    const std::int32_t* chosen = argmax + p * out_plane;
    const T* grad = dy + p * out_plane;
    float sum = 0.f;
    for (std::int64_t oh = oh_lo; oh <= oh_hi; ++oh)
      for (std::int64_t ow = ow_lo; ow <= ow_hi; ++ow) {
        const std::int64_t o = oh * g.out_width + ow;
        if (chosen[o] == r) sum += to_float(grad[o]);
      }
    dx[i] = from_float<T>(sum);
  }
}

void maxpool2d_forward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  const PoolGeometry g = pool_geometry(context.attributes, inputs[0], outputs[0]);
  const std::int64_t total = g.planes * g.out_height * g.out_width;
  if (total == 0) return;
  cudaStream_t stream = cuda_of(context).stream();
  dispatch_floating(inputs[0].dtype(), "MaxPool2d", [&](auto tag) {
    using T = decltype(tag);
    maxpool_forward_kernel<T><<<blocks_for(total), kThreadsPerBlock, 0, stream>>>(device_data<T>(inputs[0]),
                                                                                  device_data<T>(outputs[0]), g);
    PARTRAIN_CUDA_CHECK_LAUNCH();
  });
}

// Recomputes every window's argmax into scratch (the forward keeps no indices), then gathers.
void maxpool2d_backward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                        std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  const Tensor& dx = input_grads[0];
  if (!dx.defined()) return;
  const CudaBackend& cuda = cuda_of(context);
  cudaStream_t stream = cuda.stream();
  const PoolGeometry g = pool_geometry(context.attributes, inputs[0], outputs[0]);
  PARTRAIN_CHECK(dx.dtype() == inputs[0].dtype() && dx.numel() == inputs[0].numel() &&
                     output_grads[0].dtype() == inputs[0].dtype() && output_grads[0].numel() == outputs[0].numel(),
                 "MaxPool2d backward: gradients do not match the forward tensors");
  PARTRAIN_CHECK(g.height * g.width <= std::numeric_limits<std::int32_t>::max(),
                 "MaxPool2d backward: planes of " << g.height * g.width << " elements exceed int32 indices");
  const std::int64_t out_total = g.planes * g.out_height * g.out_width, in_total = g.planes * g.height * g.width;
  if (in_total == 0) return;
  const Tensor argmax = cuda.scratch(static_cast<std::size_t>(std::max<std::int64_t>(out_total, 1)) * sizeof(std::int32_t));
  auto* pargmax = static_cast<std::int32_t*>(argmax.raw_data());
  dispatch_floating(inputs[0].dtype(), "MaxPool2d backward", [&](auto tag) {
    using T = decltype(tag);
    if (out_total > 0) {
      maxpool_argmax_kernel<T><<<blocks_for(out_total), kThreadsPerBlock, 0, stream>>>(device_data<T>(inputs[0]),
                                                                                       pargmax, g);
      PARTRAIN_CUDA_CHECK_LAUNCH();
    }
    maxpool_backward_kernel<T><<<blocks_for(in_total), kThreadsPerBlock, 0, stream>>>(
        pargmax, device_data<T>(output_grads[0]), device_data<T>(dx), g);
    PARTRAIN_CUDA_CHECK_LAUNCH();
  });
}

// ---------------- GlobalAvgPool ----------------
void global_avg_pool_forward(const KernelContext& context, std::span<const Tensor> inputs,
                             std::span<const Tensor> outputs) {
  const Tensor& x = inputs[0];
  const Tensor& y = outputs[0];
  PARTRAIN_CHECK(x.rank() == 4 && y.numel() == x.dim(0) * x.dim(1) && y.dtype() == x.dtype(),
                 "GlobalAvgPool kernel got input " << shape_string(x.shape()) << ", output " << shape_string(y.shape()));
  const std::int64_t planes = x.dim(0) * x.dim(1), plane = x.dim(2) * x.dim(3);
  cudaStream_t stream = cuda_of(context).stream();
  dispatch_floating(x.dtype(), "GlobalAvgPool", [&](auto tag) {
    using T = decltype(tag);
    launch_row_sum<T, T>(stream, device_data<T>(x), device_data<T>(y), planes, plane, static_cast<float>(plane));
  });
}

template <typename T>
__global__ void global_avg_pool_backward_kernel(const T* __restrict__ dy, T* __restrict__ dx, std::int64_t total,
                                                std::int64_t plane, float scale) {
  PARTRAIN_GRID_STRIDE(i, total) dx[i] = from_float<T>(to_float(dy[i / plane]) * scale);
}

void global_avg_pool_backward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor>,
                              std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  const Tensor& dx = input_grads[0];
  if (!dx.defined()) return;
  const Tensor& x = inputs[0];
  PARTRAIN_CHECK(dx.numel() == x.numel() && dx.dtype() == x.dtype() && output_grads[0].dtype() == x.dtype() &&
                     output_grads[0].numel() == x.dim(0) * x.dim(1),
                 "GlobalAvgPool backward: gradients do not match the forward tensors");
  const std::int64_t plane = x.dim(2) * x.dim(3), total = x.numel();
  if (total == 0) return;
  const float scale = 1.f / static_cast<float>(plane);  // as the CPU: dy * (1 / plane) in fp32
  cudaStream_t stream = cuda_of(context).stream();
  dispatch_floating(x.dtype(), "GlobalAvgPool backward", [&](auto tag) {
    using T = decltype(tag);
    global_avg_pool_backward_kernel<T><<<blocks_for(total), kThreadsPerBlock, 0, stream>>>(
        device_data<T>(output_grads[0]), device_data<T>(dx), total, plane, scale);
    PARTRAIN_CUDA_CHECK_LAUNCH();
  });
}

#undef PARTRAIN_GRID_STRIDE

}  // namespace

void register_cuda_convolution_kernels(Backend& backend) {
  backend.set_kernels(OpType::Conv2d, {conv2d_forward, conv2d_backward});
  backend.set_kernels(OpType::MaxPool2d, {maxpool2d_forward, maxpool2d_backward});
  backend.set_kernels(OpType::GlobalAvgPool, {global_avg_pool_forward, global_avg_pool_backward});
}

}  // namespace partrain::cuda
