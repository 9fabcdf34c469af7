#pragma once
// Finite-difference gradient checking of one op on the CPU backend.
// The scalar loss is L = sum_k <r_k, y_k> with fixed random projections r_k of every output y_k, so
// the op's backward kernel, fed output gradients r_k, must return dL/dx for each input. Numerical
// gradients are central differences (L(x+h) - L(x-h)) / 2h on every element of small inputs and on
// a random sample of elements of large ones.
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/tensor.h"
#include "core/attributes.h"
#include "core/op_type.h"

namespace partrain::testing {

struct GradientCheckOptions {
  double step = 1e-2;                 // h of the central difference
  double tolerance = 1e-2;            // on the normalised error ||analytic - numeric|| / max(norms)
  int max_elements_per_input = 96;    // elements checked per input (random sample beyond this)
  std::uint64_t seed = 1234;
  bool training = true;
  RandomContext random{7, 3, 1, 0, 11};
};

struct GradientCheckResult {
  bool passed = false;
  double worst_error = 0;             // largest normalised error over the checked inputs
  std::string report;                 // one line per checked input
};

/// Checks the backward kernel of `type` (or `backward_override` in its place) against finite
/// differences at `inputs`. Inputs whose schema marks them non-differentiable, or that are not f32,
/// are left alone. Throws partrain::Error on kernel errors.
GradientCheckResult check_gradients(OpType type, const Attributes& attributes, const std::vector<Tensor>& inputs,
                                    const GradientCheckOptions& options = {},
                                    BackwardKernel backward_override = nullptr);

/// Host f32 tensor with elements uniform in [low, high), reproducible from `seed`.
Tensor uniform_tensor(const Shape& shape, std::uint64_t seed, float low = -1.f, float high = 1.f);
/// Host f32 tensor of standard normal elements, reproducible from `seed`.
Tensor normal_tensor(const Shape& shape, std::uint64_t seed, float standard_deviation = 1.f);
/// Host integer tensor with elements uniform in [0, upper), reproducible from `seed`.
Tensor index_tensor(const Shape& shape, std::int64_t upper, std::uint64_t seed, DType dtype = DType::I64);

/// Runs the forward kernel of `type` on the CPU backend, allocating outputs from the schema.
std::vector<Tensor> run_forward(OpType type, const Attributes& attributes, const std::vector<Tensor>& inputs,
                                bool training = true, RandomContext random = {});

}  // namespace partrain::testing
