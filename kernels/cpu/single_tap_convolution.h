#pragma once
// Conv2d of 1 x 1 feature maps (ResNet's last stage on 28 x 28 images): with padding, only one tap
// of each filter meets the input and every other tap reads zeros, so the convolution is one GEMM
// over that tap's [O, C] weight slice instead of im2col's K = C * KH * KW mostly-zero rows.
#include <cstdint>

#include "kernels/common/op_geometry.h"

namespace partrain::cpu {

/// The tap of a Conv2d that maps 1 x 1 inputs to 1 x 1 outputs with groups == 1: (ki, kj) with
/// ki * dilation_h == pad_h and kj * dilation_w == pad_w. False (ki, kj untouched) for any other
/// geometry.
bool single_tap(const kernels::ConvGeometry& g, std::int64_t& ki, std::int64_t& kj);

/// y [N, O] = x [N, C] weight[:, :, ki, kj]^T (+ bias [O]); x and y are the [N, C, 1, 1] and
/// [N, O, 1, 1] tensors, weight [O, C, KH, KW].
void single_tap_convolution_forward(const kernels::ConvGeometry& g, std::int64_t ki, std::int64_t kj,
                                    const float* x, const float* weight, const float* bias, float* y);

/// dx [N, C] = dy [N, O] weight[:, :, ki, kj] (when dx is not null); dweight = 0 except
/// dweight[:, :, ki, kj] = dy^T x (when dweight is not null). Both overwritten.
void single_tap_convolution_backward(const kernels::ConvGeometry& g, std::int64_t ki, std::int64_t kj,
                                     const float* x, const float* weight, const float* dy, float* dx,
                                     float* dweight);

}  // namespace partrain::cpu
