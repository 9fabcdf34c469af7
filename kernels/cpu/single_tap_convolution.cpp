// Conv2d of 1 x 1 feature maps as one GEMM over the single live tap (kernels/cpu/single_tap_convolution.h).
#include "kernels/cpu/single_tap_convolution.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/cpu_common.h"

namespace partrain::cpu {

namespace {
using kernels::ConvGeometry;

// The tap index along one dimension whose input offset is 0, or -1 when none is.
std::int64_t live_tap(std::int64_t kernel, std::int64_t pad, std::int64_t dilation) {
  if (pad % dilation != 0 || pad / dilation >= kernel) return -1;
  return pad / dilation;
}

// weight[:, :, ki, kj] as a dense [O, C] matrix.
std::vector<float> tap_slice(const ConvGeometry& g, std::int64_t ki, std::int64_t kj, const float* weight) {
  const std::int64_t taps = g.kernel_h * g.kernel_w, tap = ki * g.kernel_w + kj;
  std::vector<float> slice(static_cast<std::size_t>(g.out_channels * g.channels));
  for (std::int64_t i = 0; i < g.out_channels * g.channels; ++i) slice[i] = weight[i * taps + tap];
  return slice;
}
}  // namespace

bool single_tap(const ConvGeometry& g, std::int64_t& ki, std::int64_t& kj) {
  if (g.groups != 1 || g.height != 1 || g.width != 1 || g.out_height != 1 || g.out_width != 1) return false;
  const std::int64_t row = live_tap(g.kernel_h, g.pad_h, g.dilation_h);
  const std::int64_t column = live_tap(g.kernel_w, g.pad_w, g.dilation_w);
  if (row < 0 || column < 0) return false;
  ki = row;
  kj = column;
  return true;
}

void single_tap_convolution_forward(const ConvGeometry& g, std::int64_t ki, std::int64_t kj, const float* x,
                                    const float* weight, const float* bias, float* y) {
  const std::vector<float> slice = tap_slice(g, ki, kj, weight);
  sgemm(false, true, g.batch, g.out_channels, g.channels, 1.f, x, slice.data(), 0.f, y);
  if (bias)
    for (std::int64_t n = 0; n < g.batch; ++n)
      for (std::int64_t o = 0; o < g.out_channels; ++o) y[n * g.out_channels + o] += bias[o];
}

void single_tap_convolution_backward(const ConvGeometry& g, std::int64_t ki, std::int64_t kj, const float* x,
                                     const float* weight, const float* dy, float* dx, float* dweight) {
  if (dx) {
    const std::vector<float> slice = tap_slice(g, ki, kj, weight);
    sgemm(false, false, g.batch, g.channels, g.out_channels, 1.f, dy, slice.data(), 0.f, dx);
  }
  if (dweight) {
    std::vector<float> slice(static_cast<std::size_t>(g.out_channels * g.channels));
    sgemm(true, false, g.out_channels, g.channels, g.batch, 1.f, dy, x, 0.f, slice.data());
    const std::int64_t taps = g.kernel_h * g.kernel_w, tap = ki * g.kernel_w + kj;
    std::fill(dweight, dweight + g.out_channels * g.channels * taps, 0.f);
    for (std::int64_t i = 0; i < g.out_channels * g.channels; ++i) dweight[i * taps + tap] = slice[i];
  }
}

}  // namespace partrain::cpu
