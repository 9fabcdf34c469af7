// CPU kernels of the gemm ops (schemas and semantics: src/graph/ops/gemm.cpp). All products are
// cpu::sgemm (OpenBLAS) calls: a single large product is split over every OpenMP thread; batched
// MatMuls loop over batch entries in an OpenMP parallel loop when there are several and enough work,
// each entry's product then running on its thread.
#include <algorithm>
#include <climits>
#include <vector>

#include "kernels/common/op_geometry.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"

namespace partrain {

namespace {
using cpu::kParallelThreshold;

// Batched products run their entries in an OpenMP loop from this many FLOPs in all (far above the
// cost of a parallel region).
constexpr double kParallelFlops = 1 << 18;

using cpu::blas_int;
using cpu::sgemm;

// Runs body(i) for i in [0, count), in parallel when there are several entries and enough work.
template <typename Body>
void for_each_batch(std::int64_t count, double work_per_entry, Body body) {
  const bool parallel = count > 1 && static_cast<double>(count) * work_per_entry >= kParallelFlops;
#pragma omp parallel for schedule(dynamic) if (parallel)
  for (std::int64_t i = 0; i < count; ++i) body(i);
}

// ---------------- MatMul ----------------
using kernels::MatMulDims;

MatMulDims matmul_dims(const KernelContext& context, const Tensor& a, const Tensor& b) {
  const MatMulDims dims = kernels::matmul_dims(context.attributes, a.shape(), b.shape());
  for (std::int64_t size : {dims.m, dims.k, dims.n}) blas_int(size);  // checked here: no throwing in parallel loops
  return dims;
}

void matmul_forward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  const MatMulDims d = matmul_dims(context, inputs[0], inputs[1]);
  const float* a = inputs[0].data<float>();
  const float* b = inputs[1].data<float>();
  float* y = outputs[0].data<float>();
  if (d.shared_b && !d.trans_a) {  // the batch entries of a stacked: one [batch * M, K] x [K, N] product
    sgemm(false, d.trans_b, d.batch * d.m, d.n, d.k, d.alpha, a, b, 0.f, y);
    return;
  }
  for_each_batch(d.batch, 2.0 * d.m * d.n * d.k, [&](std::int64_t i) {
    sgemm(d.trans_a, d.trans_b, d.m, d.n, d.k, d.alpha, a + i * d.stride_a(), b + i * d.stride_b(), 0.f,
          y + i * d.stride_y());
  });
}

// dA for one entry (or for stacked entries when trans_a = 0, m = rows).
void matmul_grad_a(const MatMulDims& d, std::int64_t m, const float* dy, const float* b, float* da) {
  if (!d.trans_a) sgemm(false, !d.trans_b, m, d.k, d.n, d.alpha, dy, b, 0.f, da);  // dA = alpha dY op(B)^T
  else sgemm(d.trans_b, true, d.k, m, d.n, d.alpha, b, dy, 0.f, da);               // dA = alpha op(B) dY^T
}

// dB (+)= for one entry (or for stacked entries when trans_a = 0, m = rows).
void matmul_grad_b(const MatMulDims& d, std::int64_t m, const float* a, const float* dy, float beta, float* db) {
  if (!d.trans_b) sgemm(!d.trans_a, false, d.k, d.n, m, d.alpha, a, dy, beta, db);  // dB = alpha op(A)^T dY
  else sgemm(true, d.trans_a, d.n, d.k, m, d.alpha, dy, a, beta, db);               // dB = alpha dY^T op(A)
}

void matmul_backward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor>,
                     std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  const MatMulDims d = matmul_dims(context, inputs[0], inputs[1]);
  const float* a = inputs[0].data<float>();
  const float* b = inputs[1].data<float>();
  const float* dy = output_grads[0].data<float>();
  const double work = 2.0 * d.m * d.n * d.k;
  if (input_grads[0].defined()) {
    float* da = input_grads[0].data<float>();
    if (d.shared_b && !d.trans_a) {
      matmul_grad_a(d, d.batch * d.m, dy, b, da);
    } else {
      for_each_batch(d.batch, work, [&](std::int64_t i) {
        matmul_grad_a(d, d.m, dy + i * d.stride_y(), b + i * d.stride_b(), da + i * d.stride_a());
      });
    }
  }
  if (input_grads[1].defined()) {
    float* db = input_grads[1].data<float>();
    if (d.shared_b && !d.trans_a) {
      matmul_grad_b(d, d.batch * d.m, a, dy, 0.f, db);
    } else if (d.shared_b) {  // sum over the batch entries, in order
      if (d.batch == 0) std::fill(db, db + input_grads[1].numel(), 0.f);
      for (std::int64_t i = 0; i < d.batch; ++i)
        matmul_grad_b(d, d.m, a + i * d.stride_a(), dy + i * d.stride_y(), i == 0 ? 0.f : 1.f, db);
    } else {
      for_each_batch(d.batch, work, [&](std::int64_t i) {
        matmul_grad_b(d, d.m, a + i * d.stride_a(), dy + i * d.stride_y(), 0.f, db + i * d.stride_b());
      });
    }
  }
}

// ---------------- Gemm (linear layer) ----------------
using kernels::GemmDims;

GemmDims gemm_dims(const KernelContext& context, const Tensor& x, const Tensor& w) {
  return kernels::gemm_dims(context.attributes, x, w);
}

void gemm_forward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  const GemmDims d = gemm_dims(context, inputs[0], inputs[1]);
  float* y = outputs[0].data<float>();
  float beta = 0.f;
  if (inputs.size() > 2 && inputs[2].defined()) {
    const float* bias = inputs[2].data<float>();
    const std::int64_t rows = d.rows;
    const std::int64_t n = d.n;
#pragma omp parallel for schedule(static) if (rows * n > kParallelThreshold)
    for (std::int64_t r = 0; r < rows; ++r) std::copy(bias, bias + n, y + r * n);
    beta = 1.f;
  }
  sgemm(false, d.trans_b, d.rows, d.n, d.k, 1.f, inputs[0].data<float>(), inputs[1].data<float>(), beta, y);
}

void gemm_backward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor>,
                   std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  const GemmDims d = gemm_dims(context, inputs[0], inputs[1]);
  const float* x = inputs[0].data<float>();
  const float* w = inputs[1].data<float>();
  const float* dy = output_grads[0].data<float>();
  if (input_grads[0].defined())  // dX = dY W (trans_b) or dY W^T
    sgemm(false, !d.trans_b, d.rows, d.k, d.n, 1.f, dy, w, 0.f, input_grads[0].data<float>());
  if (input_grads[1].defined()) {
    float* dw = input_grads[1].data<float>();
    if (d.trans_b) sgemm(true, false, d.n, d.k, d.rows, 1.f, dy, x, 0.f, dw);  // dW [N, K] = dY^T X
    else sgemm(true, false, d.k, d.n, d.rows, 1.f, x, dy, 0.f, dw);           // dW [K, N] = X^T dY
  }
  if (input_grads.size() > 2 && input_grads[2].defined()) {  // dbias = sum of dY over rows
    float* dbias = input_grads[2].data<float>();
    const std::int64_t rows = d.rows;
    const std::int64_t n = d.n;
    constexpr std::int64_t kBlock = 64;  // columns per task: contiguous reads of each row
    const std::int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (rows * n > kParallelThreshold)
    for (std::int64_t block = 0; block < blocks; ++block) {
      const std::int64_t begin = block * kBlock;
      const std::int64_t end = std::min(n, begin + kBlock);
      double sums[kBlock] = {};
      for (std::int64_t r = 0; r < rows; ++r) {
        const float* row = dy + r * n;
        for (std::int64_t j = begin; j < end; ++j) sums[j - begin] += row[j];
      }
      for (std::int64_t j = begin; j < end; ++j) dbias[j] = static_cast<float>(sums[j - begin]);
    }
  }
}
}  // namespace

void register_cpu_gemm_kernels(Backend& backend) {
  backend.set_kernels(OpType::MatMul, {matmul_forward, matmul_backward});
  backend.set_kernels(OpType::Gemm, {gemm_forward, gemm_backward});
}

}  // namespace partrain
