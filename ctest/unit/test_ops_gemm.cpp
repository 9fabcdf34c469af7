// Finite-difference gradient checks, reference values and shape inference of the gemm ops.
#include <gtest/gtest.h>

#include <array>
#include <cmath>

#include <omp.h>

#include "graph/op_schema.h"
#include "kernels/cpu/cpu_backend.h"
#include "support/expectations.h"

namespace partrain {
namespace {
using testing::check_gradients;
using testing::expect_gradients;
using testing::normal_tensor;
using testing::run_forward;

void expect_near(const std::vector<float>& actual, const std::vector<double>& expected, double tolerance = 1e-4) {
  testing::expect_near(actual, expected, tolerance);
}

Attributes matmul_attributes(int trans_a, int trans_b, double alpha = 1.0) {
  return {{"trans_a", std::int64_t{trans_a}}, {"trans_b", std::int64_t{trans_b}}, {"alpha", alpha}};
}

// A of `batch` entries, each [M, K] ([K, M] when trans_a); B [K, N] ([N, K] when trans_b), shared
// (rank 2) or one per batch entry.
Shape operand_shape(const Shape& batch, std::int64_t rows, std::int64_t cols, bool transposed) {
  Shape shape = batch;
  shape.push_back(transposed ? cols : rows);
  shape.push_back(transposed ? rows : cols);
  return shape;
}

// Naive triple loop in double: y[b, i, j] = alpha * sum_p op(A_b)[i, p] op(B_b)[p, j].
std::vector<double> reference_matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, double alpha) {
  const std::size_t ra = a.rank();
  const std::int64_t m = trans_a ? a.dim(-1) : a.dim(-2);
  const std::int64_t k = trans_a ? a.dim(-2) : a.dim(-1);
  const std::int64_t n = trans_b ? b.dim(-2) : b.dim(-1);
  std::int64_t batch = 1;
  for (std::size_t i = 0; i + 2 < ra; ++i) batch *= a.shape()[i];
  const bool shared = b.rank() == 2;
  const auto av = a.to_float_vector();
  const auto bv = b.to_float_vector();
  std::vector<double> y(batch * m * n);
  for (std::int64_t e = 0; e < batch; ++e) {
    const float* pa = av.data() + e * m * k;
    const float* pb = bv.data() + (shared ? 0 : e * k * n);
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double sum = 0;
        for (std::int64_t p = 0; p < k; ++p) {
          const double x = trans_a ? pa[p * m + i] : pa[i * k + p];
          const double w = trans_b ? pb[j * k + p] : pb[p * n + j];
          sum += x * w;
        }
        y[(e * m + i) * n + j] = alpha * sum;
      }
  }
  return y;
}

// Naive Linear: y[r, j] = sum_p x[r, p] w(j, p) + bias[j].
std::vector<double> reference_gemm(const Tensor& x, const Tensor& w, const Tensor* bias, bool trans_b) {
  const std::int64_t k = x.dim(-1);
  const std::int64_t rows = x.numel() / k;
  const std::int64_t n = trans_b ? w.dim(0) : w.dim(1);
  const auto xv = x.to_float_vector();
  const auto wv = w.to_float_vector();
  const auto bv = bias ? bias->to_float_vector() : std::vector<float>(n, 0.f);
  std::vector<double> y(rows * n);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < n; ++j) {
      double sum = bv[j];
      for (std::int64_t p = 0; p < k; ++p) sum += double(xv[r * k + p]) * (trans_b ? wv[j * k + p] : wv[p * n + j]);
      y[r * n + j] = sum;
    }
  return y;
}

// ---------------- MatMul ----------------
TEST(GemmOps, MatMulGradientsAllTransposeCombinations) {
  std::uint64_t seed = 1;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      SCOPED_TRACE("trans_a=" + std::to_string(ta) + " trans_b=" + std::to_string(tb));
      const Tensor a = normal_tensor(operand_shape({}, 3, 4, ta), seed++);
      const Tensor b = normal_tensor(operand_shape({}, 4, 5, tb), seed++);
      expect_gradients(OpType::MatMul, matmul_attributes(ta, tb), {a, b});
    }
}

TEST(GemmOps, MatMulGradientsBatchedSharedAndBatchedB) {
  std::uint64_t seed = 20;
  for (bool shared : {true, false})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        SCOPED_TRACE(std::string(shared ? "shared B" : "batched B") + " trans_a=" + std::to_string(ta) +
                     " trans_b=" + std::to_string(tb));
        const Tensor a = normal_tensor(operand_shape({2, 2}, 3, 4, ta), seed++);
        const Tensor b = normal_tensor(operand_shape(shared ? Shape{} : Shape{2, 2}, 4, 3, tb), seed++);
        expect_gradients(OpType::MatMul, matmul_attributes(ta, tb, 0.5), {a, b});
      }
}

TEST(GemmOps, MatMulForwardMatchesNaiveLoops) {
  std::uint64_t seed = 40;
  for (bool shared : {true, false})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        SCOPED_TRACE(std::string(shared ? "shared B" : "batched B") + " trans_a=" + std::to_string(ta) +
                     " trans_b=" + std::to_string(tb));
        const Tensor a = normal_tensor(operand_shape({3, 2}, 5, 7, ta), seed++);
        const Tensor b = normal_tensor(operand_shape(shared ? Shape{} : Shape{3, 2}, 7, 6, tb), seed++);
        const auto y = run_forward(OpType::MatMul, matmul_attributes(ta, tb, -1.5), {a, b})[0];
        EXPECT_EQ(y.shape(), (Shape{3, 2, 5, 6}));
        expect_near(y.to_float_vector(), reference_matmul(a, b, ta, tb, -1.5));
      }
  // Defaults: no transposes, alpha = 1.
  const Tensor a = Tensor::from_vector<float>({2, 2}, {1, 2, 3, 4});
  const Tensor b = Tensor::from_vector<float>({2, 2}, {5, 6, 7, 8});
  EXPECT_EQ(run_forward(OpType::MatMul, {}, {a, b})[0].to_float_vector(), (std::vector<float>{19, 22, 43, 50}));
}

// Enough batch entries and work for the OpenMP loops (and the in-order sum of dB for shared B).
TEST(GemmOps, MatMulLargeBatchParallelPath) {
  std::uint64_t seed = 60;
  for (bool shared : {true, false})
    for (int ta = 0; ta < 2; ++ta) {
      SCOPED_TRACE(std::string(shared ? "shared B" : "batched B") + " trans_a=" + std::to_string(ta));
      const Tensor a = normal_tensor(operand_shape({8}, 32, 32, ta), seed++);  // 8 x 2 x 32^3 FLOPs
      const Tensor b = normal_tensor(operand_shape(shared ? Shape{} : Shape{8}, 32, 32, 1), seed++);
      const Attributes attributes = matmul_attributes(ta, 1, 0.25);
      expect_near(run_forward(OpType::MatMul, attributes, {a, b})[0].to_float_vector(),
                  reference_matmul(a, b, ta, true, 0.25));
      testing::GradientCheckOptions options;
      options.max_elements_per_input = 16;  // the small cases above check every element
      expect_gradients(OpType::MatMul, attributes, {a, b}, options);
    }
}

// A single product big enough to be split over the threads (bands of rows when C is taller than
// wide, of columns otherwise; sizes that are not multiples of the band): against the naive loops on
// 1 and 2 threads, and the same bits on every run with 2 threads (the bands are static). 1 and 2
// threads may differ in the last bits: OpenBLAS picks its kernels by the product's size.
TEST(GemmOps, LargeSingleProductSplitOverThreads) {
  std::uint64_t seed = 80;
  for (const auto& [m, k, n] : {std::array<std::int64_t, 3>{300, 80, 90}, std::array<std::int64_t, 3>{45, 150, 333}})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        SCOPED_TRACE("m=" + std::to_string(m) + " n=" + std::to_string(n) + " trans_a=" + std::to_string(ta) +
                     " trans_b=" + std::to_string(tb));
        const Tensor a = normal_tensor(operand_shape({}, m, k, ta), seed++);
        const Tensor b = normal_tensor(operand_shape({}, k, n, tb), seed++);
        const Attributes attributes = matmul_attributes(ta, tb, 0.75);
        const int threads = omp_get_max_threads();
        omp_set_num_threads(2);
        const std::vector<float> two = run_forward(OpType::MatMul, attributes, {a, b})[0].to_float_vector();
        EXPECT_EQ(run_forward(OpType::MatMul, attributes, {a, b})[0].to_float_vector(), two);
        omp_set_num_threads(1);
        const std::vector<float> one = run_forward(OpType::MatMul, attributes, {a, b})[0].to_float_vector();
        omp_set_num_threads(threads);
        const std::vector<double> reference = reference_matmul(a, b, ta, tb, 0.75);
        expect_near(two, reference);
        expect_near(one, reference);
      }
}

TEST(GemmOps, MatMulShapeInference) {
  using Types = std::vector<TensorType>;
  EXPECT_EQ(infer_output_types(OpType::MatMul, {}, Types{{{kBatch, 128, 64}}, {{64, 32}}})[0].shape,
            (Shape{kBatch, 128, 32}));
  // Attention scores: [B, h, S, d] x [B, h, T, d]^T.
  EXPECT_EQ(infer_output_types(OpType::MatMul, matmul_attributes(0, 1), Types{{{kBatch, 12, 128, 64}}, {{kBatch, 12, 96, 64}}})[0].shape,
            (Shape{kBatch, 12, 128, 96}));
  EXPECT_EQ(infer_output_types(OpType::MatMul, matmul_attributes(1, 0), Types{{{kBatch, 64, 128}}, {{64, 32}}})[0].shape,
            (Shape{kBatch, 128, 32}));
  EXPECT_EQ(infer_output_types(OpType::MatMul, {}, Types{{{4, 5}, DType::BF16}, {{5, 6}, DType::BF16}})[0],
            (TensorType{{4, 6}, DType::BF16}));
  // Mismatched K, batch dimensions, rank, dtype, transposes.
  EXPECT_THROW(infer_output_types(OpType::MatMul, {}, Types{{{kBatch, 128, 64}}, {{65, 32}}}), Error);
  EXPECT_THROW(infer_output_types(OpType::MatMul, matmul_attributes(0, 1), Types{{{kBatch, 128, 64}}, {{64, 32}}}), Error);
  EXPECT_THROW(infer_output_types(OpType::MatMul, {}, Types{{{kBatch, 2, 3, 4}}, {{kBatch, 3, 4, 5}}}), Error);
  EXPECT_THROW(infer_output_types(OpType::MatMul, {}, Types{{{2, 3, 4}}, {{1, 4, 5}}}), Error);
  EXPECT_THROW(infer_output_types(OpType::MatMul, {}, Types{{{4}}, {{4, 5}}}), Error);
  EXPECT_THROW(infer_output_types(OpType::MatMul, {}, Types{{{3, 4}}, {{4, 5}, DType::BF16}}), Error);
  EXPECT_THROW(infer_output_types(OpType::MatMul, {}, Types{{{3, 4}, DType::I64}, {{4, 5}, DType::I64}}), Error);
  EXPECT_THROW(infer_output_types(OpType::MatMul, {{"trans_a", std::int64_t{2}}}, Types{{{3, 4}}, {{4, 5}}}), Error);
  EXPECT_THROW(infer_output_types(OpType::MatMul, {}, Types{{{3, 4}}}), Error);
  // FLOPs: a multiply-add is 2.
  const OpSchema& schema = op_schema(OpType::MatMul);
  const Types inputs{{{2, 8, 16}}, {{16, 4}}};
  const Types outputs = infer_output_types(OpType::MatMul, {}, inputs);
  EXPECT_DOUBLE_EQ(schema.flops({}, inputs, outputs), 2.0 * 2 * 8 * 16 * 4);
  EXPECT_TRUE(schema.input_is_differentiable(0) && schema.input_is_differentiable(1));
}

// ---------------- Gemm ----------------
TEST(GemmOps, GemmGradients) {
  std::uint64_t seed = 80;
  for (int tb = 0; tb < 2; ++tb)
    for (bool with_bias : {true, false})
      for (const Shape& x_shape : {Shape{3, 4}, Shape{2, 3, 4}}) {
        SCOPED_TRACE("trans_b=" + std::to_string(tb) + (with_bias ? " bias " : " no bias ") + shape_string(x_shape));
        std::vector<Tensor> inputs{normal_tensor(x_shape, seed++), normal_tensor(tb ? Shape{5, 4} : Shape{4, 5}, seed++)};
        if (with_bias) inputs.push_back(normal_tensor({5}, seed++));
        expect_gradients(OpType::Gemm, {{"trans_b", std::int64_t{tb}}}, inputs);
      }
}

TEST(GemmOps, GemmForwardMatchesNaiveLoops) {
  std::uint64_t seed = 100;
  for (int tb = 0; tb < 2; ++tb)
    for (bool with_bias : {true, false}) {
      SCOPED_TRACE("trans_b=" + std::to_string(tb) + (with_bias ? " bias" : " no bias"));
      const Tensor x = normal_tensor({2, 3, 7}, seed++);
      const Tensor w = normal_tensor(tb ? Shape{6, 7} : Shape{7, 6}, seed++);
      const Tensor bias = normal_tensor({6}, seed++);
      std::vector<Tensor> inputs{x, w};
      if (with_bias) inputs.push_back(bias);
      const auto y = run_forward(OpType::Gemm, {{"trans_b", std::int64_t{tb}}}, inputs)[0];
      EXPECT_EQ(y.shape(), (Shape{2, 3, 6}));
      expect_near(y.to_float_vector(), reference_gemm(x, w, with_bias ? &bias : nullptr, tb));
    }
  // Default trans_b = 1 (nn.Linear): W [N, K].
  const Tensor x = Tensor::from_vector<float>({1, 2}, {1, 2});
  const Tensor w = Tensor::from_vector<float>({3, 2}, {1, 0, 0, 1, 1, 1});
  const Tensor bias = Tensor::from_vector<float>({3}, {10, 20, 30});
  EXPECT_EQ(run_forward(OpType::Gemm, {}, {x, w, bias})[0].to_float_vector(), (std::vector<float>{11, 22, 33}));
}

// Enough rows and columns for the parallel bias fill and the blocked bias-gradient reduction.
TEST(GemmOps, GemmLargeBiasGradientIsRowSum) {
  const Tensor x = normal_tensor({2, 64, 8}, 120);
  const Tensor w = normal_tensor({130, 8}, 121);
  const Tensor bias = normal_tensor({130}, 122);
  expect_near(run_forward(OpType::Gemm, {}, {x, w, bias})[0].to_float_vector(), reference_gemm(x, w, &bias, true));
  testing::GradientCheckOptions options;
  options.max_elements_per_input = 32;
  expect_gradients(OpType::Gemm, {}, {x, w, bias}, options);

  const Tensor dy = normal_tensor({2, 64, 130}, 123);
  std::vector<Tensor> outputs = run_forward(OpType::Gemm, {}, {x, w, bias});
  std::vector<Tensor> grads{Tensor(), Tensor(), Tensor::full({130}, std::nan(""))};  // only dbias wanted
  CpuBackend& backend = cpu_backend();
  const Attributes attributes;
  const KernelContext context{attributes, backend};
  backend.backward(OpType::Gemm, context, std::vector<Tensor>{x, w, bias}, outputs, std::vector<Tensor>{dy}, grads);
  const auto dyv = dy.to_float_vector();
  std::vector<double> expected(130, 0.0);
  for (std::int64_t r = 0; r < 128; ++r)
    for (int j = 0; j < 130; ++j) expected[j] += dyv[r * 130 + j];
  expect_near(grads[2].to_float_vector(), expected);
}

TEST(GemmOps, GemmShapeInference) {
  using Types = std::vector<TensorType>;
  EXPECT_EQ(infer_output_types(OpType::Gemm, {}, Types{{{kBatch, 128, 768}}, {{3072, 768}}, {{3072}}})[0].shape,
            (Shape{kBatch, 128, 3072}));
  EXPECT_EQ(infer_output_types(OpType::Gemm, {{"trans_b", std::int64_t{0}}}, Types{{{kBatch, 128, 768}}, {{768, 2304}}})[0].shape,
            (Shape{kBatch, 128, 2304}));
  EXPECT_EQ(infer_output_types(OpType::Gemm, {}, Types{{{kBatch, 784}}, {{10, 784}}})[0].shape, (Shape{kBatch, 10}));
  // Mismatched K (both layouts), bad bias, bad W rank.
  EXPECT_THROW(infer_output_types(OpType::Gemm, {}, Types{{{kBatch, 128, 768}}, {{768, 3072}}}), Error);
  EXPECT_THROW(infer_output_types(OpType::Gemm, {{"trans_b", std::int64_t{0}}}, Types{{{kBatch, 128, 768}}, {{3072, 768}}}), Error);
  EXPECT_THROW(infer_output_types(OpType::Gemm, {}, Types{{{kBatch, 768}}, {{3072, 768}}, {{768}}}), Error);
  EXPECT_THROW(infer_output_types(OpType::Gemm, {}, Types{{{kBatch, 768}}, {{3072, 768}}, {{1, 3072}}}), Error);
  EXPECT_THROW(infer_output_types(OpType::Gemm, {}, Types{{{kBatch, 768}}, {{2, 3072, 768}}}), Error);
  EXPECT_THROW(infer_output_types(OpType::Gemm, {}, Types{{{kBatch, 768}}}), Error);
  // FLOPs: 2 per multiply-add plus one per output for the bias.
  const OpSchema& schema = op_schema(OpType::Gemm);
  const Types inputs{{{4, 8}}, {{16, 8}}, {{16}}};
  const Types outputs = infer_output_types(OpType::Gemm, {}, inputs);
  EXPECT_DOUBLE_EQ(schema.flops({}, inputs, outputs), 2.0 * 4 * 8 * 16 + 4 * 16);
  EXPECT_DOUBLE_EQ(schema.flops({}, std::span(inputs).first(2), outputs), 2.0 * 4 * 8 * 16);
}

}  // namespace
}  // namespace partrain
