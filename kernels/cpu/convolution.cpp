// CPU kernels of the convolution ops (schemas and semantics: src/graph/ops/convolution.cpp).
// Conv2d is im2col + OpenBLAS sgemm per (sample, group), parallel over the batch with OpenMP (the
// GEMMs themselves run single-threaded: OPENBLAS_NUM_THREADS=1, the OpenMP loops own the cores).
// 1x1 stride-1 unpadded convolutions use the input as its own column matrix.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/common/op_geometry.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"

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

// Threads for a loop over `items` independent items of `work` elements in all.
int loop_threads(std::int64_t items, std::int64_t work) {
  if (items <= 1 || work <= kParallelThreshold) return 1;
  return static_cast<int>(std::min<std::int64_t>(omp_get_max_threads(), items));
}

// ---------------- Conv2d ----------------
using kernels::conv_geometry;
using kernels::ConvGeometry;

// col[(c * kh + ki) * kw + kj, oh * OW + ow] = x[c, oh*sh - ph + ki*dh, ow*sw - pw + kj*dw] (0 outside).
// `x` points at the group's first channel of one sample.
void im2col(const ConvGeometry& g, const float* x, float* col) {
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
        float* row = col + ((c * g.kernel_h + ki) * g.kernel_w + kj) * g.col_cols();
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

// The adjoint of im2col: x[c, ih, iw] += col[...] for every column entry that reads it. `x` must be
// zeroed by the caller.
void col2im(const ConvGeometry& g, const float* col, float* x) {
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
        const float* row = col + ((c * g.kernel_h + ki) * g.kernel_w + kj) * g.col_cols();
        for (std::int64_t oh = oh_lo; oh < oh_hi; ++oh) {
          const float* in = row + oh * ow_count;
          float* out = plane + (oh * g.stride_h + h_offset) * g.width + w_offset;
          for (std::int64_t ow = ow_lo; ow < ow_hi; ++ow) out[ow * g.stride_w] += in[ow];
        }
      }
    }
  }
}

// Row-major C[m, n] = alpha * op(A) op(B) + beta * C.
void sgemm(bool transpose_a, bool transpose_b, std::int64_t m, std::int64_t n, std::int64_t k, const float* a,
           std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), 1.f, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

// y[n, g] [O/groups, OH*OW] = weight[g] [O/groups, K] * columns(x[n, g]) [K, OH*OW] (+ bias).
void conv2d_forward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  const Tensor& x = inputs[0];
  const Tensor& weight = inputs[1];
  const Tensor& y = outputs[0];
  const ConvGeometry g = conv_geometry(context.attributes, x, weight, y);
  const float* px = x.data<float>();
  const float* pw = weight.data<float>();
  const float* pb = inputs.size() > 2 && inputs[2].defined() ? inputs[2].data<float>() : nullptr;
  float* py = y.data<float>();
  const std::int64_t rows = g.col_rows(), cols = g.col_cols();
  const std::int64_t group_out = g.group_out_channels();
  const bool direct = g.direct_columns();
  const int threads = loop_threads(g.batch, g.batch * g.out_channels * cols * rows);
  Tensor workspace;  // one column matrix per thread, from the caching allocator (counts in peak memory)
  if (!direct) workspace = Tensor::empty({threads, rows * cols});
  float* columns_base = direct ? nullptr : workspace.data<float>();
#pragma omp parallel num_threads(threads)
  {
    float* columns = direct ? nullptr : columns_base + static_cast<std::int64_t>(omp_get_thread_num()) * rows * cols;
#pragma omp for schedule(static)
    for (std::int64_t n = 0; n < g.batch; ++n) {
      for (std::int64_t group = 0; group < g.groups; ++group) {
        const float* xg = px + (n * g.channels + group * g.group_channels()) * g.plane();
        const float* b = xg;
        if (!direct) {
          im2col(g, xg, columns);
          b = columns;
        }
        float* yg = py + (n * g.out_channels + group * group_out) * cols;
        sgemm(false, false, group_out, cols, rows, pw + group * group_out * rows, rows, b, cols, 0.f, yg, cols);
        if (pb)
          for (std::int64_t o = 0; o < group_out; ++o) {
            const float bias = pb[group * group_out + o];
            float* out = yg + o * cols;
            for (std::int64_t p = 0; p < cols; ++p) out[p] += bias;
          }
      }
    }
  }
}

// dx[n, g] = col2im(weight[g]^T dy[n, g]); dweight[g] = sum_n dy[n, g] columns(x[n, g])^T;
// dbias[o] = sum over n, oh, ow of dy[n, o].
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

  const bool direct = g.direct_columns();
  const int threads = loop_threads(g.batch, g.batch * sample_out * rows);
  const std::int64_t weight_size = g.out_channels * rows;
  // Per thread: the column matrix (for dweight) and its gradient (for dx), unless direct; and a
  // partial dweight when several threads share the batch (summed after the loop: race-free).
  const std::int64_t column_floats =
      direct ? 0 : (dweight.defined() ? rows * cols : 0) + (dx.defined() ? rows * cols : 0);
  const std::int64_t partial_floats = dweight.defined() && threads > 1 ? weight_size : 0;
  Tensor workspace;
  float* workspace_base = nullptr;
  if (column_floats + partial_floats > 0) {
    workspace = Tensor::zeros({threads, column_floats + partial_floats});
    workspace_base = workspace.data<float>();
  }
  float* dw = dweight.defined() ? dweight.data<float>() : nullptr;
  if (dw && threads == 1) std::fill(dw, dw + weight_size, 0.f);
  float* pdx = dx.defined() ? dx.data<float>() : nullptr;

#pragma omp parallel num_threads(threads)
  {
    float* mine = workspace_base ? workspace_base + static_cast<std::int64_t>(omp_get_thread_num()) *
                                                        (column_floats + partial_floats)
                                 : nullptr;
    float* columns = nullptr;
    float* column_grads = nullptr;
    if (!direct) {
      if (dw) {
        columns = mine;
        mine += rows * cols;
      }
      if (pdx) {
        column_grads = mine;
        mine += rows * cols;
      }
    }
    float* dw_mine = partial_floats > 0 ? mine : dw;
#pragma omp for schedule(static)
    for (std::int64_t n = 0; n < g.batch; ++n) {
      for (std::int64_t group = 0; group < g.groups; ++group) {
        const float* dyg = dy + n * sample_out + group * group_out * cols;
        const std::int64_t input_offset = (n * g.channels + group * g.group_channels()) * g.plane();
        if (dw) {
          const float* b = px + input_offset;
          if (!direct) {
            im2col(g, b, columns);
            b = columns;
          }
          sgemm(false, true, group_out, rows, cols, dyg, cols, b, cols, 1.f, dw_mine + group * group_out * rows, rows);
        }
        if (pdx) {
          float* dxg = pdx + input_offset;
          const float* wg = pw + group * group_out * rows;
          if (direct) {
            sgemm(true, false, rows, cols, group_out, wg, rows, dyg, cols, 0.f, dxg, cols);
          } else {
            sgemm(true, false, rows, cols, group_out, wg, rows, dyg, cols, 0.f, column_grads, cols);
            std::fill(dxg, dxg + g.group_channels() * g.plane(), 0.f);
            col2im(g, column_grads, dxg);
          }
        }
      }
    }
  }
  if (partial_floats > 0) {
    const std::int64_t stride = column_floats + partial_floats;
    const float* partials = workspace_base + column_floats;
#pragma omp parallel for schedule(static) if (weight_size > kParallelThreshold)
    for (std::int64_t i = 0; i < weight_size; ++i) {
      float sum = 0;
      for (int t = 0; t < threads; ++t) sum += partials[t * stride + i];
      dw[i] = sum;
    }
  }
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
