// CPU kernels of the normalization ops (schemas and semantics: src/graph/ops/normalization.cpp).
// Statistics are accumulated in double. Reductions across rows use a fixed chunking (independent of
// the thread count), so results do not depend on OMP_NUM_THREADS.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"

namespace partrain {

namespace {
using cpu::kParallelThreshold;

float attribute_eps(const KernelContext& context) {
  return static_cast<float>(context.attributes.get_float("eps", 1e-5));
}

// Zeroes a gradient that the op does not produce (non-differentiable inputs), if one was asked for.
void zero_if_defined(const Tensor& gradient) {
  if (gradient.defined()) gradient.zero();
}

// Mean and 1 / sqrt(biased variance + eps) of `count` floats (two passes in double).
struct Moments {
  double mean = 0;
  double variance = 0;  // biased
};

Moments row_moments(const float* x, std::int64_t count) {
  double sum = 0;
  for (std::int64_t i = 0; i < count; ++i) sum += x[i];
  const double mean = sum / static_cast<double>(count);
  double squares = 0;
  for (std::int64_t i = 0; i < count; ++i) {
    const double d = x[i] - mean;
    squares += d * d;
  }
  return {mean, squares / static_cast<double>(count)};
}

// ---------------- LayerNorm ----------------
void layer_norm_forward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  const Tensor& x = inputs[0];
  const std::int64_t hidden = x.dim(-1);
  const std::int64_t rows = hidden > 0 ? x.numel() / hidden : 0;
  const double eps = attribute_eps(context);
  const float* px = x.data<float>();
  const float* weight = inputs[1].data<float>();
  const float* bias = inputs[2].data<float>();
  float* py = outputs[0].data<float>();
#pragma omp parallel for schedule(static) if (x.numel() > kParallelThreshold)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = px + r * hidden;
    float* yr = py + r * hidden;
    const Moments moments = row_moments(xr, hidden);
    const float mean = static_cast<float>(moments.mean);
    const float rstd = static_cast<float>(1.0 / std::sqrt(moments.variance + eps));
    for (std::int64_t h = 0; h < hidden; ++h) yr[h] = (xr[h] - mean) * rstd * weight[h] + bias[h];
  }
}

void layer_norm_backward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor>,
                         std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  const Tensor& x = inputs[0];
  const std::int64_t hidden = x.dim(-1);
  const std::int64_t rows = hidden > 0 ? x.numel() / hidden : 0;
  const double eps = attribute_eps(context);
  const float* px = x.data<float>();
  const float* weight = inputs[1].data<float>();
  const float* dy = output_grads[0].data<float>();
  const bool parallel = x.numel() > kParallelThreshold;

  // Per-row statistics, recomputed from x.
  std::vector<float> mean(rows), rstd(rows);
#pragma omp parallel for schedule(static) if (parallel)
  for (std::int64_t r = 0; r < rows; ++r) {
    const Moments moments = row_moments(px + r * hidden, hidden);
    mean[r] = static_cast<float>(moments.mean);
    rstd[r] = static_cast<float>(1.0 / std::sqrt(moments.variance + eps));
  }

  // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * weight.
  if (input_grads[0].defined()) {
    float* dx = input_grads[0].data<float>();
#pragma omp parallel for schedule(static) if (parallel)
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* xr = px + r * hidden;
      const float* dyr = dy + r * hidden;
      double sum_g = 0, sum_g_xhat = 0;
      for (std::int64_t h = 0; h < hidden; ++h) {
        const double g = double(dyr[h]) * weight[h];
        sum_g += g;
        sum_g_xhat += g * (double(xr[h]) - mean[r]) * rstd[r];
      }
      const float mean_g = static_cast<float>(sum_g / static_cast<double>(hidden));
      const float mean_g_xhat = static_cast<float>(sum_g_xhat / static_cast<double>(hidden));
      float* dxr = dx + r * hidden;
      for (std::int64_t h = 0; h < hidden; ++h) {
        const float xhat = (xr[h] - mean[r]) * rstd[r];
        dxr[h] = rstd[r] * (dyr[h] * weight[h] - mean_g - xhat * mean_g_xhat);
      }
    }
  }

  // dweight = sum over rows of dy * xhat, dbias = sum over rows of dy: column sums over fixed row
  // chunks (partials in double), combined in chunk order.
  const Tensor& dweight = input_grads[1];
  const Tensor& dbias = input_grads[2];
  if (!dweight.defined() && !dbias.defined()) return;
  constexpr std::int64_t kMaxChunks = 64;
  const std::int64_t min_rows = std::max<std::int64_t>(1, kParallelThreshold / std::max<std::int64_t>(hidden, 1));
  const std::int64_t chunk_rows = std::max(min_rows, (rows + kMaxChunks - 1) / kMaxChunks);
  const std::int64_t chunks = rows > 0 ? (rows + chunk_rows - 1) / chunk_rows : 0;
  std::vector<double> partial_weight(static_cast<std::size_t>(chunks * hidden), 0.0);
  std::vector<double> partial_bias(static_cast<std::size_t>(chunks * hidden), 0.0);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (std::int64_t chunk = 0; chunk < chunks; ++chunk) {
    double* pw = partial_weight.data() + chunk * hidden;
    double* pb = partial_bias.data() + chunk * hidden;
    const std::int64_t end = std::min(rows, (chunk + 1) * chunk_rows);
    for (std::int64_t r = chunk * chunk_rows; r < end; ++r) {
      const float* xr = px + r * hidden;
      const float* dyr = dy + r * hidden;
      for (std::int64_t h = 0; h < hidden; ++h) {
        pw[h] += double(dyr[h]) * ((xr[h] - mean[r]) * rstd[r]);
        pb[h] += dyr[h];
      }
    }
  }
  float* pdw = dweight.defined() ? dweight.data<float>() : nullptr;
  float* pdb = dbias.defined() ? dbias.data<float>() : nullptr;
  for (std::int64_t h = 0; h < hidden; ++h) {
    double sum_w = 0, sum_b = 0;
    for (std::int64_t chunk = 0; chunk < chunks; ++chunk) {
      sum_w += partial_weight[chunk * hidden + h];
      sum_b += partial_bias[chunk * hidden + h];
    }
    if (pdw) pdw[h] = static_cast<float>(sum_w);
    if (pdb) pdb[h] = static_cast<float>(sum_b);
  }
}

// ---------------- BatchNorm2d ----------------
// x [N, C, H, W]: channel c of sample n is the contiguous block x + (n * C + c) * HW.
struct BatchNormShape {
  std::int64_t batch, channels, plane;
  std::int64_t count() const { return batch * plane; }  // elements per channel
};

BatchNormShape batch_norm_shape(const Tensor& x) { return {x.dim(0), x.dim(1), x.dim(2) * x.dim(3)}; }

// Batch mean and biased variance of channel c (two passes in double).
Moments channel_moments(const float* x, const BatchNormShape& s, std::int64_t c) {
  double sum = 0;
  for (std::int64_t n = 0; n < s.batch; ++n) {
    const float* block = x + (n * s.channels + c) * s.plane;
    for (std::int64_t i = 0; i < s.plane; ++i) sum += block[i];
  }
  const double mean = s.count() > 0 ? sum / static_cast<double>(s.count()) : 0.0;
  double squares = 0;
  for (std::int64_t n = 0; n < s.batch; ++n) {
    const float* block = x + (n * s.channels + c) * s.plane;
    for (std::int64_t i = 0; i < s.plane; ++i) {
      const double d = block[i] - mean;
      squares += d * d;
    }
  }
  return {mean, s.count() > 0 ? squares / static_cast<double>(s.count()) : 0.0};
}

// The statistics channel c is normalised with: the batch's (training) or the running ones (evaluation).
Moments channel_statistics(const float* x, const BatchNormShape& s, std::int64_t c, bool training,
                           const float* running_mean, const float* running_var) {
  if (training) return channel_moments(x, s, c);
  return Moments{running_mean[c], running_var[c]};
}

void batch_norm_forward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  const Tensor& x = inputs[0];
  const BatchNormShape s = batch_norm_shape(x);
  const double eps = attribute_eps(context);
  const double momentum = context.attributes.get_float("momentum", 0.1);
  const float* px = x.data<float>();
  const float* weight = inputs[1].data<float>();
  const float* bias = inputs[2].data<float>();
  float* running_mean = inputs[3].data<float>();
  float* running_var = inputs[4].data<float>();
  float* py = outputs[0].data<float>();
  const bool training = context.training;
#pragma omp parallel for schedule(static) if (x.numel() > kParallelThreshold)
  for (std::int64_t c = 0; c < s.channels; ++c) {
    const Moments moments = channel_statistics(px, s, c, training, running_mean, running_var);
    const double mean = moments.mean, variance = moments.variance;
    if (training) {
      // PyTorch: the running variance takes the unbiased batch variance. With a single element
      // per channel (where PyTorch refuses to train) the biased one (0) is used instead.
      const double count = static_cast<double>(s.count());
      const double unbiased = count > 1 ? variance * count / (count - 1) : variance;
      running_mean[c] = static_cast<float>((1 - momentum) * running_mean[c] + momentum * mean);
      running_var[c] = static_cast<float>((1 - momentum) * running_var[c] + momentum * unbiased);
    }
    const float scale = static_cast<float>(weight[c] / std::sqrt(variance + eps));
    const float shift = static_cast<float>(bias[c] - mean * scale);
    for (std::int64_t n = 0; n < s.batch; ++n) {
      const std::int64_t offset = (n * s.channels + c) * s.plane;
      for (std::int64_t i = 0; i < s.plane; ++i) py[offset + i] = px[offset + i] * scale + shift;
    }
  }
}

void batch_norm_backward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor>,
                         std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  const Tensor& x = inputs[0];
  const BatchNormShape s = batch_norm_shape(x);
  const double eps = attribute_eps(context);
  const float* px = x.data<float>();
  const float* weight = inputs[1].data<float>();
  const float* running_mean = inputs[3].data<float>();
  const float* running_var = inputs[4].data<float>();
  const float* dy = output_grads[0].data<float>();
  float* dx = input_grads[0].defined() ? input_grads[0].data<float>() : nullptr;
  float* dweight = input_grads[1].defined() ? input_grads[1].data<float>() : nullptr;
  float* dbias = input_grads[2].defined() ? input_grads[2].data<float>() : nullptr;
  const bool training = context.training;
#pragma omp parallel for schedule(static) if (x.numel() > kParallelThreshold)
  for (std::int64_t c = 0; c < s.channels; ++c) {
    const Moments moments = channel_statistics(px, s, c, training, running_mean, running_var);
    const double mean = moments.mean, variance = moments.variance;
    const double rstd = 1.0 / std::sqrt(variance + eps);
    double sum_dy = 0, sum_dy_xhat = 0;
    for (std::int64_t n = 0; n < s.batch; ++n) {
      const std::int64_t offset = (n * s.channels + c) * s.plane;
      for (std::int64_t i = 0; i < s.plane; ++i) {
        sum_dy += dy[offset + i];
        sum_dy_xhat += double(dy[offset + i]) * ((px[offset + i] - mean) * rstd);
      }
    }
    if (dweight) dweight[c] = static_cast<float>(sum_dy_xhat);
    if (dbias) dbias[c] = static_cast<float>(sum_dy);
    if (!dx) continue;
    const float scale = static_cast<float>(weight[c] * rstd);
    if (training) {
      // dx = weight * rstd * (dy - mean(dy) - xhat * mean(dy * xhat))
      const double count = static_cast<double>(s.count());
      const float mean_dy = static_cast<float>(sum_dy / count);
      const float mean_dy_xhat = static_cast<float>(sum_dy_xhat / count);
      const float fmean = static_cast<float>(mean);
      const float frstd = static_cast<float>(rstd);
      for (std::int64_t n = 0; n < s.batch; ++n) {
        const std::int64_t offset = (n * s.channels + c) * s.plane;
        for (std::int64_t i = 0; i < s.plane; ++i) {
          const float xhat = (px[offset + i] - fmean) * frstd;
          dx[offset + i] = scale * (dy[offset + i] - mean_dy - xhat * mean_dy_xhat);
        }
      }
    } else {
      for (std::int64_t n = 0; n < s.batch; ++n) {
        const std::int64_t offset = (n * s.channels + c) * s.plane;
        for (std::int64_t i = 0; i < s.plane; ++i) dx[offset + i] = scale * dy[offset + i];
      }
    }
  }
  zero_if_defined(input_grads[3]);
  zero_if_defined(input_grads[4]);
}
}  // namespace

void register_cpu_normalization_kernels(Backend& backend) {
  backend.set_kernels(OpType::LayerNorm, {layer_norm_forward, layer_norm_backward});
  backend.set_kernels(OpType::BatchNorm2d, {batch_norm_forward, batch_norm_backward});
}

}  // namespace partrain
