// CUDA kernels of the gemm ops (schemas and semantics: src/graph/ops/gemm.cpp; reference:
// kernels/cpu/gemm.cpp). Every product goes through gemm() (cuBLASLt, see gemm.cuh); own kernels
// only for k = 0 products, the Gemm bias gradient and f32/bf16 conversions.
//
// Row-major vs column-major: cuBLASLt is column-major, so the row-major product C = op(A) op(B)
// is computed as the column-major product C^T = op(B)^T op(A)^T: cuBLASLt's "A" is our b and its
// "B" is our a, with the same transpose flags, and C^T is [n, m] with leading dimension n.
#include <cuda_bf16.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdint>
#include <map>
#include <mutex>

#include "kernels/common/op_geometry.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/gemm.cuh"

namespace partrain::cuda {

namespace {

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    default: PARTRAIN_FAIL("gemm: CUDA products take f32 or bf16, got " << dtype_name(dtype));
  }
}

// Largest power of two (up to 256, cuBLASLt's default assumption) dividing the address.
std::uint32_t alignment_of(const void* pointer) {
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  if (address == 0) return 256;
  const std::uintptr_t lowest_bit = address & (~address + 1);
  return static_cast<std::uint32_t>(std::min<std::uintptr_t>(lowest_bit, 256));
}

// `elements` elements of `dtype` after `pointer`.
const void* advance(const void* pointer, std::int64_t elements, DType dtype) {
  return static_cast<const char*>(pointer) + elements * static_cast<std::int64_t>(dtype_size(dtype));
}

// ---------------- algorithm cache ----------------
// What the cuBLASLt heuristic chose for one problem; use_lt = false: it found nothing, run the
// problem through cublasGemmStridedBatchedEx instead.
struct AlgoChoice {
  bool use_lt = false;
  cublasLtMatmulAlgo_t algo{};
};

// Everything the heuristic sees: handle (hence device), shapes, strides, dtypes, epilogue and the
// alignment of every pointer.
using AlgoKey = std::array<std::int64_t, 18>;

class AlgoCache {
 public:
  bool find(const AlgoKey& key, AlgoChoice& choice) {
    std::lock_guard lock(mutex_);
    const auto it = choices_.find(key);
    if (it == choices_.end()) return false;
    choice = it->second;
    return true;
  }
  void insert(const AlgoKey& key, const AlgoChoice& choice) {
    std::lock_guard lock(mutex_);
    if (choices_.size() >= kMaxEntries) choices_.clear();  // bounded; training uses few shapes
    choices_[key] = choice;
  }

 private:
  static constexpr std::size_t kMaxEntries = 1 << 14;
  std::mutex mutex_;
  std::map<AlgoKey, AlgoChoice> choices_;
};

AlgoCache& algo_cache() {
  static AlgoCache cache;
  return cache;
}

// ---------------- kernels ----------------
// c_i = beta c_i + bias (each row) for every entry: the k = 0 product (c = beta c + bias, as BLAS
// defines it) and the bias prefill of products without the bias epilogue. beta = 0 never reads c
// (it may hold NaN).
template <typename C>
__global__ void scale_and_add_bias_kernel(C* c, std::int64_t stride_c, std::int64_t batch, std::int64_t m,
                                          std::int64_t n, float beta, const C* bias) {
  const std::int64_t per_entry = m * n;
  const std::int64_t total = batch * per_entry;
  for (std::int64_t index = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; index < total;
       index += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t entry = index / per_entry;
    const std::int64_t within = index - entry * per_entry;
    C* element = c + entry * stride_c + within;
    float value = beta == 0.f ? 0.f : beta * to_float(*element);
    if (bias) value += to_float(bias[within % n]);
    *element = from_float<C>(value);
  }
}

void scale_and_add_bias(const CudaBackend& backend, const GemmProblem& p, float beta) {
  dispatch_floating(p.c_dtype, "gemm output", [&](auto tag) {
    using C = decltype(tag);
    const std::int64_t total = p.batch * p.m * p.n;
    scale_and_add_bias_kernel<C><<<blocks_for(total), kThreadsPerBlock, 0, backend.stream()>>>(
        static_cast<C*>(p.c), p.stride_c, p.batch, p.m, p.n, beta, static_cast<const C*>(p.bias));
    PARTRAIN_CUDA_CHECK_LAUNCH();
  });
}

template <typename S, typename D>
__global__ void convert_kernel(const S* source, D* destination, std::int64_t count) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    destination[i] = from_float<D>(to_float(source[i]));
}

// Column sums of a row-major [rows, n] matrix, two deterministic passes: partial[chunk, col] over
// `rows_per_chunk` rows (a 32 x 8 block per 32 columns of one chunk), then the chunks in order.
constexpr int kSumColumns = 32;
constexpr int kSumRowThreads = 8;

template <typename T>
__global__ void column_sum_partial_kernel(const T* matrix, std::int64_t rows, std::int64_t n,
                                          std::int64_t rows_per_chunk, float* partial) {
  __shared__ float sums[kSumRowThreads][kSumColumns + 1];
  const std::int64_t column = static_cast<std::int64_t>(blockIdx.x) * kSumColumns + threadIdx.x;
  const std::int64_t begin = static_cast<std::int64_t>(blockIdx.y) * rows_per_chunk;
  const std::int64_t end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;
  float sum = 0.f;
  if (column < n)
    for (std::int64_t row = begin + threadIdx.y; row < end; row += kSumRowThreads)
      sum += to_float(matrix[row * n + column]);
  sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && column < n) {
    float total = 0.f;
    for (int i = 0; i < kSumRowThreads; ++i) total += sums[i][threadIdx.x];
    partial[static_cast<std::int64_t>(blockIdx.y) * n + column] = total;
  }
}

template <typename T>
__global__ void column_sum_final_kernel(const float* partial, std::int64_t chunks, std::int64_t n, T* sums) {
  for (std::int64_t column = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; column < n;
       column += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float total = 0.f;
    for (std::int64_t chunk = 0; chunk < chunks; ++chunk) total += partial[chunk * n + column];
    sums[column] = from_float<T>(total);
  }
}

// sums[j] = sum over rows of matrix[row, j] (matrix [rows, n] of `dtype`, sums [n] of `dtype`),
// accumulated in fp32.
void column_sums(const CudaBackend& backend, const void* matrix, std::int64_t rows, std::int64_t n, DType dtype,
                 void* sums) {
  if (n == 0) return;
  // At most ~1024 chunks of >= 256 rows: enough blocks to fill the GPU, a short second pass.
  const std::int64_t rows_per_chunk = std::max<std::int64_t>(256, (rows + 1023) / 1024);
  const std::int64_t chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
  const Tensor partial =
      backend.scratch(static_cast<std::size_t>(std::max<std::int64_t>(chunks * n, 1)) * sizeof(float));
  float* partial_data = static_cast<float*>(partial.raw_data());
  dispatch_floating(dtype, "Gemm bias gradient", [&](auto tag) {
    using T = decltype(tag);
    if (chunks > 0) {
      const dim3 grid(static_cast<unsigned int>((n + kSumColumns - 1) / kSumColumns),
                      static_cast<unsigned int>(chunks));
      const dim3 block(kSumColumns, kSumRowThreads);
      column_sum_partial_kernel<T><<<grid, block, 0, backend.stream()>>>(static_cast<const T*>(matrix), rows, n,
                                                                         rows_per_chunk, partial_data);
      PARTRAIN_CUDA_CHECK_LAUNCH();
    }
    column_sum_final_kernel<T><<<blocks_for(n), kThreadsPerBlock, 0, backend.stream()>>>(partial_data, chunks, n,
                                                                                        static_cast<T*>(sums));
    PARTRAIN_CUDA_CHECK_LAUNCH();
  });
}

// ---------------- cuBLASLt descriptors ----------------
void init_layout(cublasLtMatrixLayoutOpaque_t& layout, cudaDataType_t type, std::int64_t rows, std::int64_t cols,
                 std::int64_t batch, std::int64_t stride) {
  PARTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutInit(&layout, type, static_cast<std::uint64_t>(rows),
                                                 static_cast<std::uint64_t>(cols), rows));  // column-major, ld = rows
  if (batch > 1) {
    const std::int32_t count = static_cast<std::int32_t>(batch);
    PARTRAIN_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(&layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
    PARTRAIN_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(&layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
  }
}

// A problem with one entry and c of the operands' dtype.
GemmProblem problem(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                    DType dtype, const void* a, const void* b, void* c) {
  GemmProblem p;
  p.trans_a = trans_a;
  p.trans_b = trans_b;
  p.m = m;
  p.n = n;
  p.k = k;
  p.alpha = alpha;
  p.ab_dtype = dtype;
  p.c_dtype = dtype;
  p.a = a;
  p.b = b;
  p.c = c;
  return p;
}

// Device pointer of a tensor's data (any dtype); throws for a host tensor.
void* device_pointer(const Tensor& tensor) {
  PARTRAIN_CHECK(!tensor.device().is_cpu(), "CUDA gemm kernel given a host tensor");
  return tensor.raw_data();
}

void check_dtype(const Tensor& tensor, DType dtype, const char* what) {
  PARTRAIN_CHECK(tensor.dtype() == dtype, what << " has dtype " << dtype_name(tensor.dtype()) << ", expected "
                                               << dtype_name(dtype));
}

}  // namespace

void gemm(const CudaBackend& backend, const GemmProblem& p) {
  PARTRAIN_CHECK(p.m >= 0 && p.n >= 0 && p.k >= 0 && p.batch >= 0,
                 "gemm: negative size m=" << p.m << " n=" << p.n << " k=" << p.k << " batch=" << p.batch);
  PARTRAIN_CHECK(is_floating(p.ab_dtype) && is_floating(p.c_dtype) &&
                     (p.ab_dtype == DType::BF16 || p.c_dtype == DType::F32),
                 "gemm: unsupported dtypes " << dtype_name(p.ab_dtype) << " x " << dtype_name(p.ab_dtype) << " -> "
                                             << dtype_name(p.c_dtype));
  PARTRAIN_CHECK(p.bias == nullptr || p.beta == 0.f, "gemm: a bias needs beta = 0, got " << p.beta);
  PARTRAIN_CHECK(p.batch <= INT32_MAX, "gemm: batch " << p.batch << " exceeds cuBLASLt's int32 batch count");
  if (p.batch == 0 || p.m == 0 || p.n == 0) return;
  if (p.k == 0) {  // empty sum: no library call (cuBLAS rejects k = 0 for some layouts)
    scale_and_add_bias(backend, p, p.beta);
    return;
  }
  const cudaDataType_t ab_type = cuda_type(p.ab_dtype);
  const cudaDataType_t c_type = cuda_type(p.c_dtype);
  const cublasOperation_t op_first = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;   // cuBLASLt's A: our b
  const cublasOperation_t op_second = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's B: our a
  // Column-major views: b stored [k, n] row-major is [n, k] column-major (ld n), [n, k] is [k, n];
  // a stored [m, k] is [k, m] (ld k), [k, m] is [m, k]; c [m, n] is [n, m] (ld n).
  const std::int64_t first_rows = p.trans_b ? p.k : p.n;
  const std::int64_t first_cols = p.trans_b ? p.n : p.k;
  const std::int64_t second_rows = p.trans_a ? p.m : p.k;
  const std::int64_t second_cols = p.trans_a ? p.k : p.m;

  cublasLtMatrixLayoutOpaque_t first{}, second{}, output{};
  init_layout(first, ab_type, first_rows, first_cols, p.batch, p.stride_b);
  init_layout(second, ab_type, second_rows, second_cols, p.batch, p.stride_a);
  init_layout(output, c_type, p.n, p.m, p.batch, p.stride_c);

  cublasLtMatmulDescOpaque_t description{};
  // CUBLAS_COMPUTE_32F (not ..._FAST_TF32): IEEE fp32 accumulation, as the CPU reference.
  PARTRAIN_CUBLAS_CHECK(cublasLtMatmulDescInit(&description, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const std::int32_t transa = op_first;
  const std::int32_t transb = op_second;
  PARTRAIN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(&description, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof transa));
  PARTRAIN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(&description, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof transb));
  // The fused bias epilogue wants a 16-byte aligned bias (cuBLASLt kernels load it in vectors;
  // other projects report misaligned-address errors below that); otherwise c is prefilled with the
  // bias rows and kept with beta = 1: still one rounding of c, as the CPU reference does.
  const bool bias_epilogue = p.bias != nullptr && alignment_of(p.bias) >= 16;
  const bool bias_prefill = p.bias != nullptr && !bias_epilogue;
  const float beta = bias_prefill ? 1.f : p.beta;
  if (bias_epilogue) {
    // The bias has one value per row of the column-major D = per column of our c, as wanted; its
    // dtype is D's (the default of CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE).
    const std::uint32_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    const void* bias = p.bias;
    PARTRAIN_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(&description, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    PARTRAIN_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(&description, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  }

  const AlgoKey key = {static_cast<std::int64_t>(reinterpret_cast<std::uintptr_t>(backend.cublas_lt())),
                       p.trans_a, p.trans_b, p.m, p.n, p.k, p.batch, p.stride_a, p.stride_b, p.stride_c,
                       static_cast<std::int64_t>(p.ab_dtype), static_cast<std::int64_t>(p.c_dtype), bias_epilogue,
                       alignment_of(p.a), alignment_of(p.b), alignment_of(p.c), alignment_of(p.bias), 0};
  AlgoChoice choice;
  if (!algo_cache().find(key, choice)) {
    cublasLtMatmulPreferenceOpaque_t preference{};
    PARTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceInit(&preference));
    const std::uint64_t workspace_bytes = CudaBackend::kCublasWorkspaceBytes;
    PARTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(&preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                               &workspace_bytes, sizeof workspace_bytes));
    // Pointers may be less than 256-byte aligned (tensor views, batch-entry offsets): say so, so
    // that the heuristic only offers kernels that can load them.
    const std::uint32_t alignments[4] = {alignment_of(p.b), alignment_of(p.a), alignment_of(p.c), alignment_of(p.c)};
    const cublasLtMatmulPreferenceAttributes_t alignment_attributes[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; ++i)
      PARTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(&preference, alignment_attributes[i], &alignments[i],
                                                                 sizeof alignments[i]));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(backend.cublas_lt(), &description, &first, &second,
                                                                 &output, &output, &preference, 1, &result, &found);
    PARTRAIN_CHECK(status == CUBLAS_STATUS_SUCCESS || status == CUBLAS_STATUS_NOT_SUPPORTED,
                   "cublasLtMatmulAlgoGetHeuristic failed: " << cublas_status_name(status));
    choice.use_lt = status == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
    if (choice.use_lt) choice.algo = result.algo;
    algo_cache().insert(key, choice);
  }

  if (bias_prefill) scale_and_add_bias(backend, p, 0.f);
  if (choice.use_lt) {
    PARTRAIN_CUBLAS_CHECK(cublasLtMatmul(backend.cublas_lt(), &description, &p.alpha, p.b, &first, p.a, &second, &beta,
                                         p.c, &output, p.c, &output, &choice.algo, backend.cublas_workspace(),
                                         CudaBackend::kCublasWorkspaceBytes, backend.stream()));
    return;
  }
  // Fallback (problems the heuristic has no kernel for): classic cuBLAS on the same stream, which
  // has no epilogue: the bias is prefilled (above already when bias_prefill) and kept with beta = 1.
  if (bias_epilogue) scale_and_add_bias(backend, p, 0.f);
  const float fallback_beta = p.bias ? 1.f : p.beta;
  PARTRAIN_CUBLAS_CHECK(cublasGemmStridedBatchedEx_64(
      backend.cublas(), op_first, op_second, p.n, p.m, p.k, &p.alpha, p.b, ab_type, first_rows, p.stride_b, p.a,
      ab_type, second_rows, p.stride_a, &fallback_beta, p.c, c_type, p.n, p.stride_c, p.batch, CUBLAS_COMPUTE_32F,
      CUBLAS_GEMM_DEFAULT));
}

void convert_floats(const CudaBackend& backend, void* destination, DType destination_dtype, const void* source,
                    DType source_dtype, std::int64_t count) {
  if (count <= 0) return;
  if (destination_dtype == source_dtype) {
    PARTRAIN_CUDA_CHECK(cudaMemcpyAsync(destination, source, static_cast<std::size_t>(count) * dtype_size(source_dtype),
                                        cudaMemcpyDeviceToDevice, backend.stream()));
    return;
  }
  dispatch_floating(source_dtype, "convert_floats source", [&](auto source_tag) {
    using S = decltype(source_tag);
    dispatch_floating(destination_dtype, "convert_floats destination", [&](auto destination_tag) {
      using D = decltype(destination_tag);
      convert_kernel<S, D><<<blocks_for(count), kThreadsPerBlock, 0, backend.stream()>>>(
          static_cast<const S*>(source), static_cast<D*>(destination), count);
      PARTRAIN_CUDA_CHECK_LAUNCH();
    });
  });
}

namespace {

// ---------------- MatMul ----------------
using kernels::MatMulDims;

MatMulDims matmul_dims(const KernelContext& context, const Tensor& a, const Tensor& b) {
  return kernels::matmul_dims(context.attributes, a.shape(), b.shape());
}

void matmul_forward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  const CudaBackend& backend = cuda_of(context);
  const MatMulDims d = matmul_dims(context, inputs[0], inputs[1]);
  const DType dtype = inputs[0].dtype();
  check_dtype(inputs[1], dtype, "MatMul B");
  check_dtype(outputs[0], dtype, "MatMul Y");
  const void* a = device_pointer(inputs[0]);
  const void* b = device_pointer(inputs[1]);
  void* y = device_pointer(outputs[0]);
  if (d.shared_b && !d.trans_a) {  // the batch entries of a stacked: one [batch * M, K] x [K, N] product
    gemm(backend, problem(false, d.trans_b, d.batch * d.m, d.n, d.k, d.alpha, dtype, a, b, y));
    return;
  }
  GemmProblem p = problem(d.trans_a, d.trans_b, d.m, d.n, d.k, d.alpha, dtype, a, b, y);
  p.batch = d.batch;
  p.stride_a = d.stride_a();
  p.stride_b = d.stride_b();  // 0 for a shared b: cuBLASLt reuses the matrix
  p.stride_c = d.stride_y();
  gemm(backend, p);
}

// dA = alpha dY op(B)^T (stored [m, k]) or alpha op(B) dY^T (trans_a: stored [k, m]) for `batch`
// entries of `m` rows each.
GemmProblem grad_a_problem(const MatMulDims& d, std::int64_t m, std::int64_t batch, DType dtype, const void* dy,
                           const void* b, void* da) {
  GemmProblem p = d.trans_a ? problem(d.trans_b, true, d.k, m, d.n, d.alpha, dtype, b, dy, da)
                            : problem(false, !d.trans_b, m, d.k, d.n, d.alpha, dtype, dy, b, da);
  p.batch = batch;
  p.stride_a = d.trans_a ? d.stride_b() : d.stride_y();
  p.stride_b = d.trans_a ? d.stride_y() : d.stride_b();
  p.stride_c = d.stride_a();
  return p;
}

// dB = alpha op(A)^T dY (stored [k, n]) or alpha dY^T op(A) (trans_b: stored [n, k]) for `batch`
// entries of `m` rows each (each entry its own dB: stride k * n).
GemmProblem grad_b_problem(const MatMulDims& d, std::int64_t m, std::int64_t batch, DType dtype, const void* a,
                           const void* dy, void* db) {
  GemmProblem p = d.trans_b ? problem(true, d.trans_a, d.n, d.k, m, d.alpha, dtype, dy, a, db)
                            : problem(!d.trans_a, false, d.k, d.n, m, d.alpha, dtype, a, dy, db);
  p.batch = batch;
  p.stride_a = d.trans_b ? d.stride_y() : d.stride_a();
  p.stride_b = d.trans_b ? d.stride_a() : d.stride_y();
  p.stride_c = d.k * d.n;
  return p;
}

void matmul_backward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor>,
                     std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  const CudaBackend& backend = cuda_of(context);
  const MatMulDims d = matmul_dims(context, inputs[0], inputs[1]);
  const DType dtype = inputs[0].dtype();
  check_dtype(inputs[1], dtype, "MatMul B");
  check_dtype(output_grads[0], dtype, "MatMul dY");
  const void* a = device_pointer(inputs[0]);
  const void* b = device_pointer(inputs[1]);
  const void* dy = device_pointer(output_grads[0]);
  const bool stacked = d.shared_b && !d.trans_a;  // batch entries as extra rows of one product
  if (input_grads[0].defined()) {
    check_dtype(input_grads[0], dtype, "MatMul dA");
    void* da = device_pointer(input_grads[0]);
    if (stacked) gemm(backend, grad_a_problem(d, d.batch * d.m, 1, dtype, dy, b, da));
    else gemm(backend, grad_a_problem(d, d.m, d.batch, dtype, dy, b, da));
  }
  if (input_grads[1].defined()) {
    const Tensor& db_tensor = input_grads[1];
    check_dtype(db_tensor, dtype, "MatMul dB");
    void* db = device_pointer(db_tensor);
    if (stacked) {
      gemm(backend, grad_b_problem(d, d.batch * d.m, 1, dtype, a, dy, db));
    } else if (d.shared_b) {
      // Sum over the batch entries, in order (as the CPU), into an fp32 accumulator: db itself for
      // f32, else a scratch buffer rounded to bf16 once at the end.
      if (d.batch == 0) {
        PARTRAIN_CUDA_CHECK(cudaMemsetAsync(db, 0, db_tensor.nbytes(), backend.stream()));
        return;
      }
      Tensor scratch;
      void* accumulator = db;
      if (dtype != DType::F32) {
        scratch = backend.scratch(static_cast<std::size_t>(db_tensor.numel()) * sizeof(float));
        accumulator = scratch.raw_data();
      }
      for (std::int64_t i = 0; i < d.batch; ++i) {
        GemmProblem p = grad_b_problem(d, d.m, 1, dtype, advance(a, i * d.stride_a(), dtype),
                                       advance(dy, i * d.stride_y(), dtype), accumulator);
        p.c_dtype = DType::F32;
        p.beta = i == 0 ? 0.f : 1.f;
        gemm(backend, p);
      }
      if (dtype != DType::F32) convert_floats(backend, db, dtype, accumulator, DType::F32, db_tensor.numel());
    } else {
      gemm(backend, grad_b_problem(d, d.m, d.batch, dtype, a, dy, db));
    }
  }
}

// ---------------- Gemm (linear layer) ----------------
using kernels::GemmDims;

GemmDims gemm_dims(const KernelContext& context, const Tensor& x, const Tensor& w) {
  return kernels::gemm_dims(context.attributes, x, w);
}

void gemm_forward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
  const CudaBackend& backend = cuda_of(context);
  const GemmDims d = gemm_dims(context, inputs[0], inputs[1]);
  const DType dtype = inputs[0].dtype();
  check_dtype(inputs[1], dtype, "Gemm W");
  check_dtype(outputs[0], dtype, "Gemm Y");
  GemmProblem p = problem(false, d.trans_b, d.rows, d.n, d.k, 1.f, dtype, device_pointer(inputs[0]),
                          device_pointer(inputs[1]), device_pointer(outputs[0]));
  if (inputs.size() > 2 && inputs[2].defined()) {
    check_dtype(inputs[2], dtype, "Gemm bias");
    p.bias = device_pointer(inputs[2]);  // fused epilogue: y = x op(w) + bias in fp32, rounded once
  }
  gemm(backend, p);
}

void gemm_backward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor>,
                   std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  const CudaBackend& backend = cuda_of(context);
  const GemmDims d = gemm_dims(context, inputs[0], inputs[1]);
  const DType dtype = inputs[0].dtype();
  check_dtype(inputs[1], dtype, "Gemm W");
  check_dtype(output_grads[0], dtype, "Gemm dY");
  const void* x = device_pointer(inputs[0]);
  const void* w = device_pointer(inputs[1]);
  const void* dy = device_pointer(output_grads[0]);
  if (input_grads[0].defined()) {  // dX = dY W (trans_b) or dY W^T
    check_dtype(input_grads[0], dtype, "Gemm dX");
    gemm(backend, problem(false, !d.trans_b, d.rows, d.k, d.n, 1.f, dtype, dy, w, device_pointer(input_grads[0])));
  }
  if (input_grads[1].defined()) {
    check_dtype(input_grads[1], dtype, "Gemm dW");
    void* dw = device_pointer(input_grads[1]);
    if (d.trans_b) gemm(backend, problem(true, false, d.n, d.k, d.rows, 1.f, dtype, dy, x, dw));  // dW [N, K] = dY^T X
    else gemm(backend, problem(true, false, d.k, d.n, d.rows, 1.f, dtype, x, dy, dw));           // dW [K, N] = X^T dY
  }
  if (input_grads.size() > 2 && input_grads[2].defined()) {  // dbias = sum of dY over rows
    check_dtype(input_grads[2], dtype, "Gemm dbias");
    column_sums(backend, dy, d.rows, d.n, dtype, device_pointer(input_grads[2]));
  }
}

}  // namespace

void register_cuda_gemm_kernels(Backend& backend) {
  backend.set_kernels(OpType::MatMul, {matmul_forward, matmul_backward});
  backend.set_kernels(OpType::Gemm, {gemm_forward, gemm_backward});
}

}  // namespace partrain::cuda
