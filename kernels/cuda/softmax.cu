// CUDA kernels of the softmax ops (schemas and semantics: src/graph/ops/softmax.cpp; reference:
// kernels/cpu/softmax.cpp; overview: kernels/cuda/softmax.cuh).
#include "kernels/cuda/softmax.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/common/op_geometry.h"
#include "kernels/cuda/cuda_backend.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/device_errors.cuh"
#include "kernels/cuda/rows.cuh"

namespace partrain::cuda {

namespace {

// ---------------- Softmax ----------------
constexpr int kMaxMaskDims = 8;

// Where the additive mask's element of x's flat index lies (numpy broadcasting of the mask to x).
struct MaskIndex {
  int rank = 0;
  std::int64_t shape[kMaxMaskDims] = {};    // x's shape
  std::int64_t strides[kMaxMaskDims] = {};  // the mask's strides aligned to x (0 where broadcast)
  std::int64_t column_stride = 0;           // strides[rank - 1]
};

__device__ inline std::int64_t mask_offset(const MaskIndex& index, std::int64_t flat) {
  std::int64_t offset = 0;
  for (int d = index.rank - 1; d >= 0; --d) {
    offset += (flat % index.shape[d]) * index.strides[d];
    flat /= index.shape[d];
  }
  return offset;
}

MaskIndex mask_index(const Shape& mask_shape, const Shape& x_shape) {
  PARTRAIN_CHECK(x_shape.size() <= kMaxMaskDims, "masked Softmax on CUDA takes inputs of rank <= "
                                                     << kMaxMaskDims << ", got " << shape_string(x_shape));
  PARTRAIN_CHECK(mask_shape.size() <= x_shape.size(), "Softmax mask " << shape_string(mask_shape)
                                                                      << " has a higher rank than the input "
                                                                      << shape_string(x_shape));
  MaskIndex index;
  index.rank = static_cast<int>(x_shape.size());
  const std::vector<std::int64_t> strides = kernels::broadcast_strides(mask_shape, x_shape);
  for (std::size_t d = 0; d < x_shape.size(); ++d) {
    index.shape[d] = x_shape[d];
    index.strides[d] = strides[d];
  }
  index.column_stride = index.rank > 0 ? index.strides[index.rank - 1] : 0;
  return index;
}

// y = softmax(x + mask) over rows of `length`; causal (queries > 0): row r sees columns
// [0, r % queries + length - queries + 1); rows with nothing visible (max = -inf) give zeros.
template <typename T, typename M, bool kWarp>
__global__ void __launch_bounds__(kWarp ? kThreadsPerBlock : kRowBlockThreads)
    softmax_forward_kernel(const T* x, const M* mask, MaskIndex index, T* y, std::int64_t rows, std::int64_t length,
                           std::int64_t queries) {
  __shared__ float shared[32];
  using R = Rows<kWarp>;
  const int lane = R::lane(), width = R::width();
  for (std::int64_t row = R::first(); row < rows; row += R::step()) {
    const T* xr = x + row * length;
    T* yr = y + row * length;
    std::int64_t visible = length;
    if (queries > 0) {
      visible = row % queries + (length - queries) + 1;
      visible = visible < 0 ? 0 : (visible > length ? length : visible);
    }
    const M* mr = mask != nullptr ? mask + mask_offset(index, row * length) : nullptr;
    const std::int64_t column_stride = index.column_stride;
    auto logit = [&](std::int64_t j) {
      float value = to_float(xr[j]);
      if (mr != nullptr) value += to_float(mr[j * column_stride]);
      return value;
    };
    float max = -INFINITY;
    for (std::int64_t j = lane; j < visible; j += width) max = fmaxf(max, logit(j));
    max = R::max(max, shared);
    if (max == -INFINITY) {  // every element hidden
      for (std::int64_t j = lane; j < length; j += width) yr[j] = from_float<T>(0.f);
      continue;
    }
    float sum = 0.f;
    for (std::int64_t j = lane; j < visible; j += width) sum += expf(logit(j) - max);
    sum = R::sum(sum, shared);
    const float inverse = 1.f / sum;
    for (std::int64_t j = lane; j < length; j += width)
      yr[j] = from_float<T>(j < visible ? expf(logit(j) - max) * inverse : 0.f);
  }
}

// dx = y · (dy − Σ dy·y) per row.
template <typename T, bool kWarp>
__global__ void __launch_bounds__(kWarp ? kThreadsPerBlock : kRowBlockThreads)
    softmax_backward_kernel(const T* y, const T* dy, T* dx, std::int64_t rows, std::int64_t length) {
  __shared__ float shared[32];
  using R = Rows<kWarp>;
  const int lane = R::lane(), width = R::width();
  for (std::int64_t row = R::first(); row < rows; row += R::step()) {
    const T* yr = y + row * length;
    const T* dyr = dy + row * length;
    T* dxr = dx + row * length;
    float dot = 0.f;
    for (std::int64_t j = lane; j < length; j += width) dot += to_float(dyr[j]) * to_float(yr[j]);
    dot = R::sum(dot, shared);
    for (std::int64_t j = lane; j < length; j += width)
      dxr[j] = from_float<T>(to_float(yr[j]) * (to_float(dyr[j]) - dot));
  }
}

void softmax_forward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  const Tensor& x = inputs[0];
  const Tensor& y = outputs[0];
  const cudaStream_t stream = cuda_of(context).stream();
  const std::int64_t length = x.dim(-1);
  const std::int64_t rows = length > 0 ? x.numel() / length : 0;
  if (rows == 0) return;
  const bool causal = context.attributes.get_int("causal", 0) != 0;
  const std::int64_t queries = causal ? x.dim(-2) : 0;  // S of [..., S, T]
  if (causal && queries == 0) return;                   // no rows
  const bool masked = inputs.size() > 1 && inputs[1].defined();
  const MaskIndex index = masked ? mask_index(inputs[1].shape(), x.shape()) : MaskIndex{};
  const RowLaunch launch = row_launch(rows, length);
  dispatch_floating(x.dtype(), "Softmax", [&](auto x_tag) {
    using T = decltype(x_tag);
    auto run = [&](auto mask_tag, const void* mask_data) {
      using M = decltype(mask_tag);
      dispatch_rows(launch, [&](auto warp) {
        softmax_forward_kernel<T, M, decltype(warp)::value><<<launch.blocks, launch.threads, 0, stream>>>(
            device_data<T>(x), static_cast<const M*>(mask_data), index, device_data<T>(y), rows, length, queries);
        PARTRAIN_CUDA_CHECK_LAUNCH();
      });
    };
    if (masked) {
      dispatch_floating(inputs[1].dtype(), "Softmax mask", [&](auto mask_tag) {
        using M = decltype(mask_tag);
        run(mask_tag, static_cast<const void*>(device_data<M>(inputs[1])));
      });
    } else {
      run(T{}, nullptr);
    }
  });
}

void softmax_backward(const KernelContext& context, std::span<const Tensor>, std::span<const Tensor> outputs,
                      std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  const cudaStream_t stream = cuda_of(context).stream();
  if (input_grads.size() > 1 && input_grads[1].defined())  // the mask has no gradient
    PARTRAIN_CUDA_CHECK(cudaMemsetAsync(input_grads[1].raw_data(), 0, input_grads[1].nbytes(), stream));
  if (!input_grads[0].defined()) return;
  const Tensor& y = outputs[0];
  const std::int64_t length = y.dim(-1);
  const std::int64_t rows = length > 0 ? y.numel() / length : 0;
  if (rows == 0) return;
  const RowLaunch launch = row_launch(rows, length);
  dispatch_floating(y.dtype(), "Softmax backward", [&](auto tag) {
    using T = decltype(tag);
    dispatch_rows(launch, [&](auto warp) {
      softmax_backward_kernel<T, decltype(warp)::value><<<launch.blocks, launch.threads, 0, stream>>>(
          device_data<T>(y), device_data<T>(output_grads[0]), device_data<T>(input_grads[0]), rows, length);
      PARTRAIN_CUDA_CHECK_LAUNCH();
    });
  });
}

// ---------------- SoftmaxCrossEntropy ----------------
// Calls function(L{}) with the label storage type (i32 or i64).
template <typename Function>
void dispatch_labels(DType dtype, Function&& function) {
  switch (dtype) {
    case DType::I32:
      function(std::int32_t{});
      return;
    case DType::I64:
      function(std::int64_t{});
      return;
    default:
      PARTRAIN_FAIL("SoftmaxCrossEntropy labels must be i32 or i64, got " << dtype_name(dtype));
  }
}

// Per-row loss log Σ exp(z) − z[label] (0 for ignored rows and for out-of-range labels, which
// label_statistics_kernel reports).
template <typename T, typename L, bool kWarp>
__global__ void __launch_bounds__(kWarp ? kThreadsPerBlock : kRowBlockThreads)
    cross_entropy_rows_kernel(const T* logits, const L* labels, float* row_loss, std::int64_t rows,
                              std::int64_t classes, std::int64_t ignore_index) {
  __shared__ float shared[32];
  using R = Rows<kWarp>;
  const int lane = R::lane(), width = R::width();
  for (std::int64_t row = R::first(); row < rows; row += R::step()) {
    const std::int64_t label = static_cast<std::int64_t>(labels[row]);
    if (label == ignore_index || label < 0 || label >= classes) {
      if (lane == 0) row_loss[row] = 0.f;
      continue;
    }
    const T* zr = logits + row * classes;
    float max = -INFINITY;
    for (std::int64_t j = lane; j < classes; j += width) max = fmaxf(max, to_float(zr[j]));
    max = R::max(max, shared);
    float sum = 0.f;
    for (std::int64_t j = lane; j < classes; j += width) sum += expf(to_float(zr[j]) - max);
    sum = R::sum(sum, shared);
    if (lane == 0) row_loss[row] = logf(sum) + max - to_float(zr[label]);
  }
}

// One block: counts the labels that are not ignore_index, flags the smallest flat index of a
// label outside [0, classes) in `bad_label` (kernels/cuda/device_errors.cuh), and with
// row_loss given writes *loss = Σ row_loss / count (0 when count = 0). Fixed summation order.
template <typename L>
__global__ void __launch_bounds__(1024)
    label_statistics_kernel(const L* labels, std::int64_t rows, std::int64_t classes, std::int64_t ignore_index,
                            const float* row_loss, double* count_out, float* loss, IndexCheckSlot* bad_label) {
  __shared__ double shared[32];
  double count = 0, total = 0;
  for (std::int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    const std::int64_t label = static_cast<std::int64_t>(labels[r]);
    if (label == ignore_index) continue;
    if (label < 0 || label >= classes) {
      flag_bad_position(bad_label, r);
      continue;
    }
    count += 1;
    if (row_loss != nullptr) total += row_loss[r];
  }
  count = block_sum(count, shared);
  total = block_sum(total, shared);
  if (threadIdx.x == 0) {
    *count_out = count;
    if (loss != nullptr) *loss = count > 0 ? static_cast<float>(total / count) : 0.f;
  }
}

// dlogits = (softmax − onehot(label)) · dloss / count; zero rows for ignored (or invalid) labels.
// The loss gradient is the f32 scalar of the loss (bf16 accepted too: loss_grad_is_bf16).
template <typename T, typename L, bool kWarp>
__global__ void __launch_bounds__(kWarp ? kThreadsPerBlock : kRowBlockThreads)
    cross_entropy_backward_kernel(const T* logits, const L* labels, const void* loss_grad, bool loss_grad_is_bf16,
                                  const double* count, T* dlogits, std::int64_t rows, std::int64_t classes,
                                  std::int64_t ignore_index) {
  __shared__ float shared[32];
  using R = Rows<kWarp>;
  const int lane = R::lane(), width = R::width();
  const double positions = *count;
  const float dloss = loss_grad_is_bf16 ? to_float(*static_cast<const __nv_bfloat16*>(loss_grad))
                                        : *static_cast<const float*>(loss_grad);
  const float scale = positions > 0 ? static_cast<float>(double(dloss) / positions) : 0.f;
  for (std::int64_t row = R::first(); row < rows; row += R::step()) {
    const std::int64_t label = static_cast<std::int64_t>(labels[row]);
    const T* zr = logits + row * classes;
    T* dzr = dlogits + row * classes;
    if (label == ignore_index || label < 0 || label >= classes) {
      for (std::int64_t j = lane; j < classes; j += width) dzr[j] = from_float<T>(0.f);
      continue;
    }
    float max = -INFINITY;
    for (std::int64_t j = lane; j < classes; j += width) max = fmaxf(max, to_float(zr[j]));
    max = R::max(max, shared);
    float sum = 0.f;
    for (std::int64_t j = lane; j < classes; j += width) sum += expf(to_float(zr[j]) - max);
    sum = R::sum(sum, shared);
    const float inverse = 1.f / sum;
    for (std::int64_t j = lane; j < classes; j += width) {
      float value = expf(to_float(zr[j]) - max) * inverse * scale;
      if (j == label) value -= scale;
      dzr[j] = from_float<T>(value);
    }
  }
}

// Device scratch of the cross-entropy kernels: the number of counted positions (a double).
struct LabelScratch {
  Tensor words;
  double* count() const { return reinterpret_cast<double*>(device_data<std::int64_t>(words)); }
};

LabelScratch make_label_scratch(CudaBackend& backend) { return LabelScratch{backend.empty({1}, DType::I64)}; }

// The device check of the labels (flagged by label_statistics_kernel): a label outside
// [0, classes) that is not ignore_index becomes the CPU backend's error at the backend's next
// report (the step's end; at once under plain ordering). Nothing waits here: the kernels give
// such rows a zero loss and gradient.
IndexCheckSlot* reserve_label_check(CudaBackend& backend, const Tensor& labels, std::int64_t classes,
                                    std::int64_t ignore_index, const char* op) {
  const Shape shape = labels.shape();
  return backend.device_errors().reserve(op, [shape, classes, ignore_index](std::int64_t label, std::int64_t position) {
    // Position as coordinates of the labels tensor, as the CPU reports it.
    std::ostringstream message;
    message << "SoftmaxCrossEntropy label " << label << " at position " << kernels::position_string(position, shape)
            << " (flat index " << position << ") is outside [0, " << classes << ") and is not ignore_index "
            << ignore_index;
    return message.str();
  });
}

constexpr int kStatisticsThreads = 1024;

void cross_entropy_forward(const KernelContext& context, std::span<const Tensor> inputs,
                           std::span<const Tensor> outputs) {
  CudaBackend& backend = cuda_of(context);
  const cudaStream_t stream = backend.stream();
  const Tensor& logits = inputs[0];
  const Tensor& labels = inputs[1];
  const kernels::CrossEntropyShape dims = kernels::cross_entropy_shape(context.attributes, logits, labels);
  const std::int64_t classes = dims.classes, rows = dims.rows, ignore_index = dims.ignore_index;
  float* loss = device_data<float>(outputs[0]);
  const LabelScratch scratch = make_label_scratch(backend);
  IndexCheckSlot* bad_label = reserve_label_check(backend, labels, classes, ignore_index, "SoftmaxCrossEntropy forward");
  const Tensor row_loss = backend.empty({std::max<std::int64_t>(rows, 1)}, DType::F32);
  const RowLaunch launch = row_launch(rows, classes);
  dispatch_floating(logits.dtype(), "SoftmaxCrossEntropy", [&](auto logits_tag) {
    using T = decltype(logits_tag);
    dispatch_labels(labels.dtype(), [&](auto label_tag) {
      using L = decltype(label_tag);
      if (rows > 0) {
        dispatch_rows(launch, [&](auto warp) {
          cross_entropy_rows_kernel<T, L, decltype(warp)::value>
              <<<launch.blocks, launch.threads, 0, stream>>>(device_data<T>(logits), device_data<L>(labels),
                                                             device_data<float>(row_loss), rows, classes, ignore_index);
          PARTRAIN_CUDA_CHECK_LAUNCH();
        });
      }
      label_statistics_kernel<L><<<1, kStatisticsThreads, 0, stream>>>(device_data<L>(labels), rows, classes,
                                                                       ignore_index, device_data<float>(row_loss),
                                                                       scratch.count(), loss, bad_label);
      PARTRAIN_CUDA_CHECK_LAUNCH();
      backend.device_errors().record_bad_value(bad_label, labels);
    });
  });
}

void cross_entropy_backward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor>,
                            std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  CudaBackend& backend = cuda_of(context);
  const cudaStream_t stream = backend.stream();
  if (input_grads[1].defined())  // labels have no gradient
    PARTRAIN_CUDA_CHECK(cudaMemsetAsync(input_grads[1].raw_data(), 0, input_grads[1].nbytes(), stream));
  if (!input_grads[0].defined()) return;
  const Tensor& logits = inputs[0];
  const Tensor& labels = inputs[1];
  const kernels::CrossEntropyShape dims = kernels::cross_entropy_shape(context.attributes, logits, labels);
  const std::int64_t classes = dims.classes, rows = dims.rows, ignore_index = dims.ignore_index;
  const bool loss_grad_is_bf16 = output_grads[0].dtype() == DType::BF16;
  const void* loss_grad = loss_grad_is_bf16 ? static_cast<const void*>(device_data<__nv_bfloat16>(output_grads[0]))
                                            : static_cast<const void*>(device_data<float>(output_grads[0]));
  const LabelScratch scratch = make_label_scratch(backend);
  IndexCheckSlot* bad_label = reserve_label_check(backend, labels, classes, ignore_index, "SoftmaxCrossEntropy backward");
  const RowLaunch launch = row_launch(rows, classes);
  dispatch_floating(logits.dtype(), "SoftmaxCrossEntropy backward", [&](auto logits_tag) {
    using T = decltype(logits_tag);
    dispatch_labels(labels.dtype(), [&](auto label_tag) {
      using L = decltype(label_tag);
      label_statistics_kernel<L><<<1, kStatisticsThreads, 0, stream>>>(
          device_data<L>(labels), rows, classes, ignore_index, nullptr, scratch.count(), nullptr, bad_label);
      PARTRAIN_CUDA_CHECK_LAUNCH();
      backend.device_errors().record_bad_value(bad_label, labels);
      if (rows == 0 || classes == 0) return;
      dispatch_rows(launch, [&](auto warp) {
        cross_entropy_backward_kernel<T, L, decltype(warp)::value><<<launch.blocks, launch.threads, 0, stream>>>(
            device_data<T>(logits), device_data<L>(labels), loss_grad, loss_grad_is_bf16, scratch.count(),
            device_data<T>(input_grads[0]), rows, classes, ignore_index);
        PARTRAIN_CUDA_CHECK_LAUNCH();
      });
    });
  });
}

}  // namespace

void register_cuda_softmax_kernels(Backend& backend) {
  backend.set_kernels(OpType::Softmax, {softmax_forward, softmax_backward});
  backend.set_kernels(OpType::SoftmaxCrossEntropy, {cross_entropy_forward, cross_entropy_backward});
}

}  // namespace partrain::cuda
