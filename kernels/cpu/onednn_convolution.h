#pragma once
// Conv2d through oneDNN's convolution primitives (forward, data gradient, weight gradient), one
// cached set of primitives per shape. Used when partrain is built with oneDNN (CMake option
// PARTRAIN_WITH_ONEDNN), the CPU has AVX2 (oneDNN's direct JIT kernels; a feature check, not a
// vendor one) and the shape is one it wins on; otherwise kernels/cpu/convolution.cpp keeps im2col.
#include "kernels/common/op_geometry.h"

namespace partrain::cpu {

/// True when partrain was built with oneDNN (PARTRAIN_WITH_ONEDNN found it).
bool onednn_convolution_built();

/// The three computations of a convolution's training step.
enum class ConvolutionPass { Forward, BackwardData, BackwardWeights };

/// True when the oneDNN path serves `pass` of Conv2d geometry `g`: built with oneDNN, the CPU has
/// AVX2 with FMA, groups == 1, stride 1 and at least 4 output positions per map (where it beats
/// im2col by measurement), PARTRAIN_CPU_CONVOLUTION is not "im2col", and oneDNN has a direct (JIT)
/// kernel for it. Its GEMM-based fallbacks lose to ours (1 x 1 maps with 3 x 3 kernels: 0.3 s
/// per call against milliseconds) and run the sgemm kernel of oneDNN 2.6 that moves the stack
/// pointer into the heap (docs: validation/perf/README.md), so those passes stay on im2col.
/// Throws partrain::Error when PARTRAIN_CPU_CONVOLUTION is neither unset, "onednn" nor "im2col".
bool onednn_convolution_available(const kernels::ConvGeometry& g, bool has_bias, ConvolutionPass pass);

/// y [N, O, OH, OW] = conv(x [N, C, H, W], weight [O, C, KH, KW]) (+ bias [O]); all NCHW, fp32.
/// Only after onednn_convolution_available(g, bias != nullptr, Forward) returned true.
void onednn_convolution_forward(const kernels::ConvGeometry& g, const float* x, const float* weight,
                                const float* bias, float* y);

/// dx [N, C, H, W] = the data gradient of the convolution for dy [N, O, OH, OW] (overwrites dx).
void onednn_convolution_backward_data(const kernels::ConvGeometry& g, const float* weight, const float* dy,
                                      float* dx);

/// dweight [O, C, KH, KW] (and dbias [O] when not null) = the weight gradients for x and dy
/// (overwritten, not accumulated).
void onednn_convolution_backward_weights(const kernels::ConvGeometry& g, const float* x, const float* dy,
                                         float* dweight, float* dbias);

}  // namespace partrain::cpu
