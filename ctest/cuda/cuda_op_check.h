#pragma once
// CUDA vs CPU op checks (ggml's test-backend-ops idea): an op runs forward and backward on the CPU
// backend (the reference) and on the CUDA backend with the same inputs, output gradients and random
// context, and every output and input gradient is compared by normalised error
//   ‖cuda − cpu‖₂ / max(‖cpu‖₂, 1e-30)
// against a per-op tolerance, in fp32, bf16 and fp16 (the float inputs rounded to the 16-bit type for
// both backends; the CPU backend then computes in fp32 on converted copies and rounds its results,
// which is what the CUDA kernels do with fp32 accumulation, and the CUDA backend's fp16 path too).
// The backward gets the values its schema does not save as shape-only stand-ins, as in training.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/backend.h"
#include "core/attributes.h"
#include "core/op_type.h"

namespace partrain::testing {

/// True when a GPU is usable (the CUDA backend of device 0 can be created).
bool cuda_available();
/// True when the driver reports at least one GPU (whether or not the backend can be created on it).
bool gpu_visible();
/// Why CUDA tests are skipped here (no GPU, driver too old, ...).
std::string cuda_unavailable_reason();

struct CudaOpCheck {
  /// Normalised-error tolerances. fp32: GEMM and reduction order differ between OpenBLAS and cuBLAS.
  double f32_tolerance = 1e-5;
  double bf16_tolerance = 1e-2;  // bf16 and fp16 (fp16 keeps 3 more mantissa bits)
  /// Run the backward too (with a fixed random output gradient).
  bool backward = true;
  /// Training mode (dropout, batch statistics).
  bool training = true;
  RandomContext random{1234, 3, 1, 0, 77};
  /// Indices of float inputs that stay f32 in the bf16 run (BatchNorm running statistics).
  std::vector<int> f32_inputs_in_bf16;
  /// Also compare the inputs after the forward (ops that update inputs in place: BatchNorm2d).
  bool compare_inputs_after_forward = false;
  /// The tensor-parallel group both backends' kernels get (tensor-parallel ops); it must take host
  /// and device tensors, and give both backends the same result for the same data.
  TensorParallelGroup* tensor_parallel = nullptr;
};

/// Runs the comparison in fp32, bf16 and fp16; every mismatch is a GoogleTest failure naming the op,
/// the precision, the tensor and its normalised error. Call PARTRAIN_SKIP_WITHOUT_GPU() first.
void expect_cuda_matches_cpu(OpType type, const Attributes& attributes, const std::vector<Tensor>& inputs,
                             const CudaOpCheck& check = {});

/// The normalised error defined above (host tensors of any float dtype, same element count).
double normalised_error(const Tensor& actual, const Tensor& expected);

}  // namespace partrain::testing

/// Skips the current test with a message when no GPU is visible; fails it when a GPU is visible
/// but the CUDA backend cannot be created on it (a broken driver or library must not read as a skip).
#define PARTRAIN_SKIP_WITHOUT_GPU()                                                                 \
  do {                                                                                             \
    if (!::partrain::testing::cuda_available()) {                                                  \
      if (::partrain::testing::gpu_visible())                                                      \
        FAIL() << "a GPU is visible but the CUDA backend cannot be created: "                      \
               << ::partrain::testing::cuda_unavailable_reason();                                  \
      GTEST_SKIP() << "no GPU (" << ::partrain::testing::cuda_unavailable_reason()                  \
                   << "): CUDA test skipped";                                                      \
    }                                                                                              \
  } while (0)
