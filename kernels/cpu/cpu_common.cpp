#include "kernels/cpu/cpu_common.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>

#include "core/error.h"

namespace partrain::cpu {

void reduce_to_broadcast_input(const Tensor& gradient, const Tensor& output_grad, const float* weight) {
  const Shape& output_shape = output_grad.shape();
  const float* dy = output_grad.data<float>();
  float* dx = gradient.data<float>();
  const std::int64_t n = output_grad.numel();
  if (gradient.shape() == output_shape) {  // no broadcasting: elementwise
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
    for (std::int64_t i = 0; i < n; ++i) dx[i] = weight ? dy[i] * weight[i] : dy[i];
    return;
  }
  const std::vector<std::int64_t> strides = kernels::broadcast_strides(gradient.shape(), output_shape);
  const std::int64_t m = gradient.numel();
  // Per-thread partial sums (in double) avoid races on the reduced elements.
  const int threads = n > kParallelThreshold ? omp_get_max_threads() : 1;
  std::vector<double> partial(static_cast<std::size_t>(threads) * m, 0.0);
  // Row by row of the last dimension: one offset computation per row, then step by 0 or the stride.
  const std::int64_t last = output_shape.empty() ? 1 : output_shape.back();
  const std::int64_t rows = last > 0 ? n / last : 0;
  const std::int64_t step = output_shape.empty() ? 0 : strides.back();
#pragma omp parallel num_threads(threads)
  {
    double* mine = partial.data() + static_cast<std::size_t>(omp_get_thread_num()) * m;
#pragma omp for schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      double* target = mine + broadcast_offset(r * last, output_shape, strides);
      const float* grad = dy + r * last;
      const float* w = weight ? weight + r * last : nullptr;
      for (std::int64_t j = 0; j < last; ++j) target[j * step] += w ? double(grad[j]) * w[j] : grad[j];
    }
  }
  for (std::int64_t j = 0; j < m; ++j) {
    double sum = 0;
    for (int t = 0; t < threads; ++t) sum += partial[static_cast<std::size_t>(t) * m + j];
    dx[j] = static_cast<float>(sum);
  }
}

int blas_int(std::int64_t value) {
  PARTRAIN_CHECK(value >= 0 && value <= INT_MAX, "GEMM dimension " << value << " does not fit a BLAS int");
  return static_cast<int>(value);
}

void sgemm_strided(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                   const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                   std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // empty sum: C = beta * C
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0 ? 0.f : beta * c[i * ldc + j];
    return;
  }
  // OpenBLAS runs one thread per call (OPENBLAS_NUM_THREADS=1: the OpenMP loops own the cores).
  // oneDNN's dnnl_sgemm, threaded per call, was faster but an intermittent heap corruption inside its
  // scratch-buffer free (seen under srun, cause not isolated) put it off until it can be shown safe.
  const auto product = [&](std::int64_t rows, std::int64_t columns, const float* a_at, const float* b_at, float* c_at) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                static_cast<int>(rows), static_cast<int>(columns), static_cast<int>(k), alpha, a_at,
                static_cast<int>(lda), b_at, static_cast<int>(ldb), beta, c_at, static_cast<int>(ldc));
  };
  // A large product outside a parallel loop uses every thread: C is cut into one band of rows (or of
  // columns, when C is wider than tall) per thread, each a product of its own over the whole k. The
  // bands are static, so a run repeats bit for bit on the same thread count (OpenBLAS picks its
  // kernels by size, so 1 and 2 threads may differ in the last bits).
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const std::int64_t longest = std::max(m, n);
  if (threads < 2 || 2.0 * static_cast<double>(m) * n * k < kParallelGemmFlops || longest < 2 * kGemmBand) {
    product(m, n, a, b, c);
    return;
  }
  // Bands of whole multiples of kGemmBand, so the kernels' register blocks stay full.
  const std::int64_t bands = std::min<std::int64_t>(threads, longest / kGemmBand);
  const std::int64_t per_band = (longest / bands + kGemmBand - 1) / kGemmBand * kGemmBand;
  const bool by_rows = m >= n;
#pragma omp parallel for schedule(static) num_threads(static_cast<int>(bands))
  for (std::int64_t band = 0; band < bands; ++band) {
    const std::int64_t first = band * per_band;
    const std::int64_t count = std::min(longest, first + per_band) - first;
    if (count <= 0) continue;
    if (by_rows)  // rows [first, first + count) of C and of op(A)
      product(count, n, trans_a ? a + first : a + first * lda, b, c + first * ldc);
    else  // columns [first, first + count) of C and of op(B)
      product(m, count, a, trans_b ? b + first * ldb : b + first, c + first);
  }
}

void sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
           const float* b, float beta, float* c) {
  sgemm_strided(trans_a, trans_b, blas_int(m), blas_int(n), blas_int(k), alpha, a, trans_a ? m : k, b,
                trans_b ? k : n, beta, c, n);
}

}  // namespace partrain::cpu
