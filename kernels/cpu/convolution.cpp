// CPU kernels of the convolution ops (schemas and semantics: src/graph/ops/convolution.cpp).
// Conv2d is im2col over a chunk of samples at once (in parallel over the samples) and one sgemm
// (oneDNN, over every thread) per (chunk, group), so late stages with small feature maps make one
// GEMM of the batch rather than one GEMV-like product per sample. 1 x 1 feature maps are one GEMM
// over their single live tap (kernels/cpu/single_tap_convolution.h); where oneDNN serves a shape and
// pass (kernels/cpu/onednn_convolution.h: built with it, AVX2, stride 1) its primitives run instead.

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/common/op_geometry.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/onednn_convolution.h"
#include "kernels/cpu/single_tap_convolution.h"

namespace partrain {

namespace {
using cpu::kParallelThreshold;

// Positions p in [0, count) with 0 <= p * stride + offset < size form the range [lo, hi).
void valid_range(std::int64_t offset, std::int64_t stride, std::int64_t size, std::int64_t count, std::int64_t& lo,
                 std::int64_t& hi) {
  lo = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  hi = offset >= size ? 0 : (size - 1 - offset) / stride + 1;
  hi = std::min(hi, count);
  lo = std::min(lo, hi);
}

// ---------------- Conv2d ----------------
using kernels::conv_geometry;
using kernels::ConvGeometry;

// col[(c * kh + ki) * kw + kj, oh * OW + ow] = x[c, oh*sh - ph + ki*dh, ow*sw - pw + kj*dw] (0 outside),
// rows `ld` floats apart (one sample's block of the chunk's column matrix). `x` points at the
// group's first channel of one sample.
void im2col(const ConvGeometry& g, const float* x, float* col, std::int64_t ld) {
  const std::int64_t oh_count = g.out_height, ow_count = g.out_width;
  for (std::int64_t c = 0; c < g.group_channels(); ++c) {
    const float* plane = x + c * g.plane();
    for (std::int64_t ki = 0; ki < g.kernel_h; ++ki) {
      const std::int64_t h_offset = ki * g.dilation_h - g.pad_h;
      std::int64_t oh_lo, oh_hi;
      valid_range(h_offset, g.stride_h, g.height, oh_count, oh_lo, oh_hi);
      for (std::int64_t kj = 0; kj < g.kernel_w; ++kj) {
        const std::int64_t w_offset = kj * g.dilation_w - g.pad_w;
        std::int64_t ow_lo, ow_hi;
        valid_range(w_offset, g.stride_w, g.width, ow_count, ow_lo, ow_hi);
        float* row = col + ((c * g.kernel_h + ki) * g.kernel_w + kj) * ld;
        std::fill(row, row + oh_lo * ow_count, 0.f);
        for (std::int64_t oh = oh_lo; oh < oh_hi; ++oh) {
          float* out = row + oh * ow_count;
          const float* in = plane + (oh * g.stride_h + h_offset) * g.width + w_offset;
          std::fill(out, out + ow_lo, 0.f);
          if (g.stride_w == 1)
            std::memcpy(out + ow_lo, in + ow_lo, static_cast<std::size_t>(ow_hi - ow_lo) * sizeof(float));
          else
            for (std::int64_t ow = ow_lo; ow < ow_hi; ++ow) out[ow] = in[ow * g.stride_w];
          std::fill(out + ow_hi, out + ow_count, 0.f);
        }
        std::fill(row + oh_hi * ow_count, row + oh_count * ow_count, 0.f);
      }
    }
  }
}

// The adjoint of im2col (same `ld`): x[c, ih, iw] += col[...] for every column entry that reads it.
// `x` must be zeroed by the caller.
void col2im(const ConvGeometry& g, const float* col, std::int64_t ld, float* x) {
  const std::int64_t oh_count = g.out_height, ow_count = g.out_width;
  for (std::int64_t c = 0; c < g.group_channels(); ++c) {
    float* plane = x + c * g.plane();
    for (std::int64_t ki = 0; ki < g.kernel_h; ++ki) {
      const std::int64_t h_offset = ki * g.dilation_h - g.pad_h;
      std::int64_t oh_lo, oh_hi;
      valid_range(h_offset, g.stride_h, g.height, oh_count, oh_lo, oh_hi);
      for (std::int64_t kj = 0; kj < g.kernel_w; ++kj) {
        const std::int64_t w_offset = kj * g.dilation_w - g.pad_w;
        std::int64_t ow_lo, ow_hi;
        valid_range(w_offset, g.stride_w, g.width, ow_count, ow_lo, ow_hi);
        const float* row = col + ((c * g.kernel_h + ki) * g.kernel_w + kj) * ld;
        for (std::int64_t oh = oh_lo; oh < oh_hi; ++oh) {
          const float* in = row + oh * ow_count;
          float* out = plane + (oh * g.stride_h + h_offset) * g.width + w_offset;
          for (std::int64_t ow = ow_lo; ow < ow_hi; ++ow) out[ow * g.stride_w] += in[ow];
        }
      }
    }
  }
}

// Row-major C[m, n] = op(A) op(B) + beta * C; a call outside a parallel region uses every thread.
void sgemm(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
           std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  cpu::sgemm_strided(transpose_a, transpose_b, m, n, k, 1.f, a, lda, b, ldb, beta, c, ldc);
}

// The column matrix of a chunk of samples holds at most this many floats (at least one sample):
// small feature maps (late ResNet stages) put many samples into one GEMM, whose weight matrix is
// then read once per chunk rather than once per sample; large ones stay within a bounded workspace.
constexpr std::int64_t kChunkFloats = std::int64_t{1} << 23;

std::int64_t chunk_samples(const ConvGeometry& g) {
  const std::int64_t per_sample = std::max<std::int64_t>(1, g.col_rows() * g.col_cols());
  return std::clamp<std::int64_t>(kChunkFloats / per_sample, 1, std::max<std::int64_t>(1, g.batch));
}

// Copies `rows` blocks of `width` floats for each of `count` samples between a per-sample layout
// (sample s, row r at per_sample + (s * sample_stride + r) * width) and a chunk layout (row r,
// sample s at chunk + r * count * width + s * width), in the direction `to_chunk` says.
void regroup(const float* source, float* target, std::int64_t count, std::int64_t rows, std::int64_t width,
             std::int64_t sample_stride, bool to_chunk) {
#pragma omp parallel for collapse(2) schedule(static) if (count * rows * width > kParallelThreshold)
  for (std::int64_t s = 0; s < count; ++s)
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t per_sample = (s * sample_stride + r) * width, chunk = r * count * width + s * width;
      if (to_chunk) std::memcpy(target + chunk, source + per_sample, static_cast<std::size_t>(width) * sizeof(float));
      else std::memcpy(target + per_sample, source + chunk, static_cast<std::size_t>(width) * sizeof(float));
    }
}

// Per chunk of samples and group: columns [K, count * OH*OW] (im2col of each sample, in parallel);
// one GEMM y_chunk [O/groups, count * OH*OW] = weight[g] [O/groups, K] * columns over every thread;
// scattered to y[n, g] (+ bias).
void conv2d_forward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  const Tensor& x = inputs[0];
  const Tensor& weight = inputs[1];
  const Tensor& y = outputs[0];
  const ConvGeometry g = conv_geometry(context.attributes, x, weight, y);
  const float* px = x.data<float>();
  const float* pw = weight.data<float>();
  const float* pb = inputs.size() > 2 && inputs[2].defined() ? inputs[2].data<float>() : nullptr;
  float* py = y.data<float>();
  std::int64_t tap_h = 0, tap_w = 0;
  if (cpu::single_tap(g, tap_h, tap_w)) {
    cpu::single_tap_convolution_forward(g, tap_h, tap_w, px, pw, pb, py);
    return;
  }
  if (cpu::onednn_convolution_available(g, pb != nullptr, cpu::ConvolutionPass::Forward)) {
    cpu::onednn_convolution_forward(g, px, pw, pb, py);
    return;
  }
  const std::int64_t rows = g.col_rows(), cols = g.col_cols();
  const std::int64_t group_out = g.group_out_channels();
  const std::int64_t chunk = chunk_samples(g);
  // The chunk's columns and its GEMM output, from the caching allocator (counted in peak memory).
  Tensor workspace = Tensor::empty({chunk * cols * (rows + group_out)});
  float* columns = workspace.data<float>();
  float* product = columns + rows * chunk * cols;
  for (std::int64_t first = 0; first < g.batch; first += chunk) {
    const std::int64_t count = std::min(chunk, g.batch - first);
    const std::int64_t ld = count * cols;
    for (std::int64_t group = 0; group < g.groups; ++group) {
      const float* xg = px + (first * g.channels + group * g.group_channels()) * g.plane();
#pragma omp parallel for schedule(static) if (count > 1 && count * rows * cols > kParallelThreshold)
      for (std::int64_t s = 0; s < count; ++s) im2col(g, xg + s * g.channels * g.plane(), columns + s * cols, ld);
      sgemm(false, false, group_out, ld, rows, pw + group * group_out * rows, rows, columns, ld, 0.f, product, ld);
      float* yg = py + (first * g.out_channels + group * group_out) * cols;
      regroup(product, yg, count, group_out, cols, g.out_channels, false);
      if (pb) {
#pragma omp parallel for collapse(2) schedule(static) if (count * group_out * cols > kParallelThreshold)
        for (std::int64_t s = 0; s < count; ++s)
          for (std::int64_t o = 0; o < group_out; ++o) {
            const float bias = pb[group * group_out + o];
            float* out = yg + (s * g.out_channels + o) * cols;
            for (std::int64_t p = 0; p < cols; ++p) out[p] += bias;
          }
      }
    }
  }
}

// Per chunk and group, with dy_chunk [O/groups, count * OH*OW] gathered from dy:
// dweight[g] += dy_chunk columns^T (one GEMM over every thread); column_grads = weight[g]^T dy_chunk,
// then col2im per sample (in parallel) into dx. dbias[o] = sum over n, oh, ow of dy[n, o].
void conv2d_backward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                     std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  const Tensor& x = inputs[0];
  const Tensor& weight = inputs[1];
  const ConvGeometry g = conv_geometry(context.attributes, x, weight, outputs[0]);
  const Tensor& dx = input_grads[0];
  const Tensor& dweight = input_grads[1];
  const Tensor dbias = input_grads.size() > 2 ? input_grads[2] : Tensor();
  const float* px = x.data<float>();
  const float* pw = weight.data<float>();
  const float* dy = output_grads[0].data<float>();
  const std::int64_t rows = g.col_rows(), cols = g.col_cols();
  const std::int64_t group_out = g.group_out_channels();
  const std::int64_t sample_out = g.out_channels * cols;

  if (dbias.defined()) {
    float* db = dbias.data<float>();
#pragma omp parallel for schedule(static) if (g.batch * sample_out > kParallelThreshold)
    for (std::int64_t o = 0; o < g.out_channels; ++o) {
      double sum = 0;
      for (std::int64_t n = 0; n < g.batch; ++n) {
        const float* row = dy + n * sample_out + o * cols;
        for (std::int64_t p = 0; p < cols; ++p) sum += row[p];
      }
      db[o] = static_cast<float>(sum);
    }
  }
  if (!dx.defined() && !dweight.defined()) return;
  std::int64_t tap_h = 0, tap_w = 0;
  if (cpu::single_tap(g, tap_h, tap_w)) {
    cpu::single_tap_convolution_backward(g, tap_h, tap_w, px, pw, dy, dx.defined() ? dx.data<float>() : nullptr,
                                         dweight.defined() ? dweight.data<float>() : nullptr);
    return;
  }
  // oneDNN for the passes it has direct kernels for; the im2col loop below for the others.
  Tensor dx_left = dx, dweight_left = dweight;
  if (dx.defined() && cpu::onednn_convolution_available(g, false, cpu::ConvolutionPass::BackwardData)) {
    cpu::onednn_convolution_backward_data(g, pw, dy, dx.data<float>());
    dx_left = Tensor();
  }
  if (dweight.defined() && cpu::onednn_convolution_available(g, false, cpu::ConvolutionPass::BackwardWeights)) {
    cpu::onednn_convolution_backward_weights(g, px, dy, dweight.data<float>(), nullptr);
    dweight_left = Tensor();
  }
  if (!dx_left.defined() && !dweight_left.defined()) return;

  const std::int64_t chunk = chunk_samples(g);
  // Workspace: dy_chunk, and the chunk's columns (for dweight) and column gradients (for dx).
  const std::int64_t column_floats = rows * chunk * cols;
  Tensor workspace = Tensor::empty(
      {group_out * chunk * cols + (dweight_left.defined() ? column_floats : 0) + (dx_left.defined() ? column_floats : 0)});
  float* dy_chunk = workspace.data<float>();
  float* columns = dy_chunk + group_out * chunk * cols;
  float* column_grads = columns + (dweight_left.defined() ? column_floats : 0);
  float* dw = dweight_left.defined() ? dweight_left.data<float>() : nullptr;
  float* pdx = dx_left.defined() ? dx_left.data<float>() : nullptr;
  for (std::int64_t first = 0; first < g.batch; first += chunk) {
    const std::int64_t count = std::min(chunk, g.batch - first);
    const std::int64_t ld = count * cols;
    for (std::int64_t group = 0; group < g.groups; ++group) {
      regroup(dy + (first * g.out_channels + group * group_out) * cols, dy_chunk, count, group_out, cols,
              g.out_channels, true);
      const std::int64_t input_offset = (first * g.channels + group * g.group_channels()) * g.plane();
      const std::int64_t sample_in = g.channels * g.plane();
      if (dw) {
#pragma omp parallel for schedule(static) if (count > 1 && count * rows * cols > kParallelThreshold)
        for (std::int64_t s = 0; s < count; ++s) im2col(g, px + input_offset + s * sample_in, columns + s * cols, ld);
        sgemm(false, true, group_out, rows, ld, dy_chunk, ld, columns, ld, first == 0 ? 0.f : 1.f,
              dw + group * group_out * rows, rows);
      }
      if (pdx) {
        sgemm(true, false, rows, ld, group_out, pw + group * group_out * rows, rows, dy_chunk, ld, 0.f, column_grads,
              ld);
#pragma omp parallel for schedule(static) if (count > 1 && count * rows * cols > kParallelThreshold)
        for (std::int64_t s = 0; s < count; ++s) {
          float* dxg = pdx + input_offset + s * sample_in;
          std::fill(dxg, dxg + g.group_channels() * g.plane(), 0.f);
          col2im(g, column_grads + s * cols, ld, dxg);
        }
      }
    }
  }
  if (dw && g.batch == 0) std::fill(dw, dw + g.out_channels * rows, 0.f);
}

// ---------------- MaxPool2d ----------------
using kernels::pool_geometry;
using kernels::PoolGeometry;

// Index (in the plane) of the first maximum of window (oh, ow), padded positions excluded; a NaN
// wins over numbers (it propagates as in PyTorch).
std::int64_t window_argmax(const PoolGeometry& g, const float* plane, std::int64_t oh, std::int64_t ow) {
  const std::int64_t h0 = oh * g.stride_h - g.pad_h, w0 = ow * g.stride_w - g.pad_w;
  const std::int64_t ki_lo = std::max<std::int64_t>(0, -h0), ki_hi = std::min(g.kernel_h, g.height - h0);
  const std::int64_t kj_lo = std::max<std::int64_t>(0, -w0), kj_hi = std::min(g.kernel_w, g.width - w0);
  std::int64_t best = -1;
  float best_value = 0;
  for (std::int64_t ki = ki_lo; ki < ki_hi; ++ki)
    for (std::int64_t kj = kj_lo; kj < kj_hi; ++kj) {
      const std::int64_t index = (h0 + ki) * g.width + w0 + kj;
      const float value = plane[index];
      if (best < 0 || value > best_value || (std::isnan(value) && !std::isnan(best_value))) {
        best = index;
        best_value = value;
      }
    }
  return best;  // never -1: the schema keeps padding <= kernel / 2, so every window holds an input
}

void maxpool2d_forward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  const PoolGeometry g = pool_geometry(context.attributes, inputs[0], outputs[0]);
  const float* x = inputs[0].data<float>();
  float* y = outputs[0].data<float>();
  const std::int64_t in_plane = g.height * g.width, out_plane = g.out_height * g.out_width;
#pragma omp parallel for schedule(static) if (g.planes * out_plane * g.kernel_h * g.kernel_w > kParallelThreshold)
  for (std::int64_t p = 0; p < g.planes; ++p) {
    const float* plane = x + p * in_plane;
    float* out = y + p * out_plane;
    for (std::int64_t oh = 0; oh < g.out_height; ++oh)
      for (std::int64_t ow = 0; ow < g.out_width; ++ow)
        out[oh * g.out_width + ow] = plane[window_argmax(g, plane, oh, ow)];
  }
}

// Recomputes each window's argmax and routes the output gradient there; planes are independent,
// so parallelising over them is race-free.
void maxpool2d_backward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                        std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  if (!input_grads[0].defined()) return;
  const PoolGeometry g = pool_geometry(context.attributes, inputs[0], outputs[0]);
  const float* x = inputs[0].data<float>();
  const float* dy = output_grads[0].data<float>();
  float* dx = input_grads[0].data<float>();
  const std::int64_t in_plane = g.height * g.width, out_plane = g.out_height * g.out_width;
#pragma omp parallel for schedule(static) if (g.planes * out_plane * g.kernel_h * g.kernel_w > kParallelThreshold)
  for (std::int64_t p = 0; p < g.planes; ++p) {
    const float* plane = x + p * in_plane;
    const float* grad_out = dy + p * out_plane;
    float* grad_in = dx + p * in_plane;
    std::fill(grad_in, grad_in + in_plane, 0.f);
    for (std::int64_t oh = 0; oh < g.out_height; ++oh)
      for (std::int64_t ow = 0; ow < g.out_width; ++ow)
        grad_in[window_argmax(g, plane, oh, ow)] += grad_out[oh * g.out_width + ow];
  }
}

// ---------------- GlobalAvgPool ----------------
void global_avg_pool_forward(const KernelContext&, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  const Tensor& x = inputs[0];
  const std::int64_t planes = x.dim(0) * x.dim(1), plane = x.dim(2) * x.dim(3);
  const float* px = x.data<float>();
  float* y = outputs[0].data<float>();
#pragma omp parallel for schedule(static) if (x.numel() > kParallelThreshold)
  for (std::int64_t p = 0; p < planes; ++p) {
    const float* in = px + p * plane;
    double sum = 0;
    for (std::int64_t i = 0; i < plane; ++i) sum += in[i];
    y[p] = static_cast<float>(sum / static_cast<double>(plane));
  }
}

void global_avg_pool_backward(const KernelContext&, std::span<const Tensor> inputs, std::span<const Tensor>,
                              std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  if (!input_grads[0].defined()) return;
  const Tensor& x = inputs[0];
  const std::int64_t planes = x.dim(0) * x.dim(1), plane = x.dim(2) * x.dim(3);
  const float* dy = output_grads[0].data<float>();
  float* dx = input_grads[0].data<float>();
  const float scale = 1.f / static_cast<float>(plane);
#pragma omp parallel for schedule(static) if (x.numel() > kParallelThreshold)
  for (std::int64_t p = 0; p < planes; ++p) std::fill(dx + p * plane, dx + (p + 1) * plane, dy[p] * scale);
}
}  // namespace

void register_cpu_convolution_kernels(Backend& backend) {
  backend.set_kernels(OpType::Conv2d, {conv2d_forward, conv2d_backward});
  backend.set_kernels(OpType::MaxPool2d, {maxpool2d_forward, maxpool2d_backward});
  backend.set_kernels(OpType::GlobalAvgPool, {global_avg_pool_forward, global_avg_pool_backward});
}

}  // namespace partrain
