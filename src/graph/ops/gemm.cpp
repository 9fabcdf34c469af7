// Schemas of the gemm ops.
//   MatMul: (a, b) -> y = alpha * op(a) op(b)
//           a is [..., M, K] ([..., K, M] when trans_a = 1), b is [..., K, N] ([..., N, K] when
//           trans_b = 1); b has rank 2 (shared by every batch entry of a) or exactly a's leading
//           (batch) dimensions. y is [..., M, N] with a's leading dimensions and a's dtype.
//           attributes trans_a, trans_b (int 0/1, default 0), alpha (float, default 1).
//   Gemm:   (x, w[, bias]) -> y = x w^T + bias (trans_b = 1, default: w is [N, K], the PyTorch
//           nn.Linear layout) or y = x w + bias (trans_b = 0: w is [K, N], the GPT-2 Conv1D layout).
//           x is [..., K] (treated as a [rows, K] matrix), bias is [N], y is [..., N].
#include <algorithm>

#include "core/error.h"
#include "graph/op_schema.h"

namespace partrain {

namespace {
bool transpose_attribute(const Attributes& attributes, const char* name, std::int64_t fallback) {
  const std::int64_t value = attributes.get_int(name, fallback);
  PARTRAIN_CHECK(value == 0 || value == 1, name << " must be 0 or 1, got " << value);
  return value == 1;
}

void check_floating_pair(const TensorType& a, const TensorType& b, const char* name_a, const char* name_b) {
  PARTRAIN_CHECK(is_floating(a.dtype), name_a << " must be floating point, got " << dtype_name(a.dtype));
  PARTRAIN_CHECK(a.dtype == b.dtype, name_a << " and " << name_b << " have dtypes " << dtype_name(a.dtype) << " and "
                                            << dtype_name(b.dtype));
}

std::vector<TensorType> infer_matmul(const Attributes& attributes, std::span<const TensorType> inputs) {
  const bool trans_a = transpose_attribute(attributes, "trans_a", 0);
  const bool trans_b = transpose_attribute(attributes, "trans_b", 0);
  const Shape& a = inputs[0].shape;
  const Shape& b = inputs[1].shape;
  check_floating_pair(inputs[0], inputs[1], "MatMul A", "B");
  PARTRAIN_CHECK(a.size() >= 2, "MatMul A must have rank >= 2, got " << shape_string(a));
  PARTRAIN_CHECK(b.size() >= 2, "MatMul B must have rank >= 2, got " << shape_string(b));
  const std::size_t ra = a.size();
  const std::size_t rb = b.size();
  if (rb > 2) {
    PARTRAIN_CHECK(rb == ra && std::equal(a.begin(), a.end() - 2, b.begin()),
                   "MatMul B " << shape_string(b) << " must have rank 2 or the same batch dimensions as A "
                               << shape_string(a));
  }
  const std::int64_t m = trans_a ? a[ra - 1] : a[ra - 2];
  const std::int64_t k_a = trans_a ? a[ra - 2] : a[ra - 1];
  const std::int64_t k_b = trans_b ? b[rb - 1] : b[rb - 2];
  const std::int64_t n = trans_b ? b[rb - 2] : b[rb - 1];
  PARTRAIN_CHECK(k_a == k_b, "MatMul inner dimensions differ: A " << shape_string(a) << (trans_a ? " (transposed)" : "")
                                                                  << " has K = " << k_a << ", B " << shape_string(b)
                                                                  << (trans_b ? " (transposed)" : "") << " has K = " << k_b);
  Shape y(a.begin(), a.end() - 2);
  y.push_back(m);
  y.push_back(n);
  return {{y, inputs[0].dtype}};
}

double flops_matmul(const Attributes& attributes, std::span<const TensorType> inputs, std::span<const TensorType> outputs) {
  const Shape& a = inputs[0].shape;
  const bool trans_a = attributes.get_int("trans_a", 0) == 1;
  const double k = static_cast<double>(trans_a ? a[a.size() - 2] : a[a.size() - 1]);
  return 2.0 * static_cast<double>(numel(outputs[0].shape)) * k;
}

std::vector<TensorType> infer_gemm(const Attributes& attributes, std::span<const TensorType> inputs) {
  const bool trans_b = transpose_attribute(attributes, "trans_b", 1);
  const Shape& x = inputs[0].shape;
  const Shape& w = inputs[1].shape;
  check_floating_pair(inputs[0], inputs[1], "Gemm X", "W");
  PARTRAIN_CHECK(!x.empty(), "Gemm X must have rank >= 1, got a scalar");
  PARTRAIN_CHECK(w.size() == 2, "Gemm W must have rank 2, got " << shape_string(w));
  const std::int64_t k = x.back();
  const std::int64_t k_w = trans_b ? w[1] : w[0];
  const std::int64_t n = trans_b ? w[0] : w[1];
  PARTRAIN_CHECK(k == k_w, "Gemm inner dimensions differ: X " << shape_string(x) << " has K = " << k << ", W "
                                                              << shape_string(w) << (trans_b ? " ([N, K], trans_b=1)" : " ([K, N], trans_b=0)")
                                                              << " has K = " << k_w);
  if (inputs.size() > 2) {
    const TensorType& bias = inputs[2];
    PARTRAIN_CHECK(bias.dtype == inputs[0].dtype, "Gemm bias has dtype " << dtype_name(bias.dtype) << ", X has "
                                                                         << dtype_name(inputs[0].dtype));
    PARTRAIN_CHECK(bias.shape == Shape{n}, "Gemm bias must be [" << n << "], got " << shape_string(bias.shape));
  }
  Shape y = x;
  y.back() = n;
  return {{y, inputs[0].dtype}};
}

double flops_gemm(const Attributes&, std::span<const TensorType> inputs, std::span<const TensorType> outputs) {
  const double k = static_cast<double>(inputs[0].shape.back());
  const double elements = static_cast<double>(numel(outputs[0].shape));
  return 2.0 * elements * k + (inputs.size() > 2 ? elements : 0.0);
}
}  // namespace

void add_gemm_schemas(std::vector<OpSchema>& schemas) {
  // Saved tensors: both operands (dA = dY·op(B), dB = op(A)ᵀ·dY), never the product. Gemm's bias is
  // not read (dbias = Σ dY). The kernels read both operands even when only one gradient is wanted
  // (a frozen weight); reading A only for dB and B only for dA would save the other then.
  schemas.push_back({OpType::MatMul, 2, 2, infer_matmul, flops_matmul});
  schemas.back().saved_inputs = 0b11u;
  schemas.back().saved_outputs = 0u;
  schemas.push_back({OpType::Gemm, 2, 3, infer_gemm, flops_gemm});
  schemas.back().saved_inputs = 0b011u;
  schemas.back().saved_outputs = 0u;
}

}  // namespace partrain
