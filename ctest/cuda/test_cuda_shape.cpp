// CUDA vs CPU checks of the shape ops (Gather, Reshape, Permute, Slice, Concat, Split), label
// "cuda": float tensors through the fp32/bf16 harness (forward and backward), integer tensors
// forward-only and bit-exact (these ops move bytes), and Gather's out-of-range error on the device.
// Skipped without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "cuda/cuda_op_check.h"
#include "graph/op_schema.h"
#include "kernels/cuda/cuda_backend.cuh"
#include "support/gradient_check.h"

namespace partrain {
namespace {
using testing::CudaOpCheck;
using testing::expect_cuda_matches_cpu;
using testing::index_tensor;
using testing::normal_tensor;
using testing::run_forward;
using Ints = std::vector<std::int64_t>;

// Forward on the CPU and the CUDA backend; every output must be bit-identical (any dtype).
void expect_forward_identical(OpType type, const Attributes& attributes, const std::vector<Tensor>& inputs) {
  const std::vector<Tensor> expected = run_forward(type, attributes, inputs);
  cuda::CudaBackend& backend = cuda::cuda_backend(0);
  std::vector<TensorType> input_types;
  std::vector<Tensor> device_inputs;
  for (const Tensor& input : inputs) {
    input_types.push_back({input.shape(), input.dtype()});
    device_inputs.push_back(to_backend(input, backend));
  }
  std::vector<Tensor> outputs;
  for (const TensorType& output : infer_output_types(type, attributes, input_types))
    outputs.push_back(backend.empty(output.shape, output.dtype));
  const KernelContext context{attributes, backend};
  backend.forward(type, context, device_inputs, outputs);
  ASSERT_EQ(outputs.size(), expected.size());
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    const Tensor actual = to_host(outputs[k], backend);
    ASSERT_EQ(actual.shape(), expected[k].shape()) << op_name(type) << " output " << k;
    ASSERT_EQ(actual.dtype(), expected[k].dtype()) << op_name(type) << " output " << k;
    EXPECT_EQ(std::memcmp(actual.raw_data(), expected[k].raw_data(), actual.nbytes()), 0)
        << op_name(type) << " output " << k << " differs from the CPU (" << attributes.canonical_string() << ")";
  }
}

// Integer indices with positions {0, 5, 11} all pointing at row `row` (repeated indices).
Tensor repeated_indices(const Shape& shape, std::int64_t vocabulary, std::uint64_t seed, DType dtype, std::int64_t row) {
  Tensor indices = index_tensor(shape, vocabulary, seed, dtype);
  for (std::int64_t p : {0, 5, 11}) {
    if (p >= indices.numel()) continue;
    if (dtype == DType::I64) indices.data<std::int64_t>()[p] = row;
    else indices.data<std::int32_t>()[p] = static_cast<std::int32_t>(row);
  }
  return indices;
}

// ---------------- Gather ----------------
TEST(CudaShape, GatherMatchesCpuWithI32AndI64AndRepeatedIndices) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::I64, DType::I32}) {
    SCOPED_TRACE(dtype_name(dtype));
    // Odd hidden size (rows not a multiple of 16 bytes), rank-2 indices.
    expect_cuda_matches_cpu(OpType::Gather, {}, {normal_tensor({11, 6}, 1), repeated_indices({3, 5}, 11, 2, dtype, 3)});
    expect_cuda_matches_cpu(OpType::Gather, {}, {normal_tensor({50, 33}, 3), repeated_indices({2, 7, 3}, 50, 4, dtype, 7)});
    // Embedding-sized rows (vectorised copies) and many repeats of few rows (atomic contention).
    expect_cuda_matches_cpu(OpType::Gather, {}, {normal_tensor({1000, 64}, 5), index_tensor({8, 128}, 1000, 6, dtype)});
    expect_cuda_matches_cpu(OpType::Gather, {}, {normal_tensor({3, 256}, 7), index_tensor({512}, 3, 8, dtype)});
  }
}

TEST(CudaShape, GatherRejectsOutOfRangeIndicesLikeTheCpu) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  cuda::CudaBackend& backend = cuda::cuda_backend(0);
  const Attributes attributes;
  const KernelContext context{attributes, backend};
  const Tensor weight = to_backend(normal_tensor({4, 3}, 5), backend);
  for (DType dtype : {DType::I64, DType::I32})
    for (std::int64_t bad : {4, -1}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " index " + std::to_string(bad));
      const Tensor host_indices = dtype == DType::I64
                                      ? Tensor::from_vector<std::int64_t>({2, 2}, {0, 1, bad, 2})
                                      : Tensor::from_vector<std::int32_t>({2, 2}, {0, 1, static_cast<std::int32_t>(bad), 2});
      const std::vector<Tensor> inputs{weight, to_backend(host_indices, backend)};
      const std::vector<Tensor> outputs{backend.empty({2, 2, 3})};
      // The error comes at the op under plain ordering, at the next device check under overlap.
      try {
        backend.forward(OpType::Gather, context, inputs, outputs);
        backend.check_device_errors();
        ADD_FAILURE() << "no error for index " << bad;
      } catch (const Error& error) {
        const std::string message = error.message();
        EXPECT_NE(message.find("index " + std::to_string(bad)), std::string::npos) << message;
        EXPECT_NE(message.find("[1, 0]"), std::string::npos) << message;
        EXPECT_NE(message.find("[0, 4)"), std::string::npos) << message;  // the limit
        EXPECT_NE(message.find("Gather forward"), std::string::npos) << message;  // the op
      }
      const std::vector<Tensor> output_grads{backend.zeros({2, 2, 3})};
      const std::vector<Tensor> input_grads{backend.empty({4, 3}), Tensor()};
      EXPECT_THROW(
          {
            backend.backward(OpType::Gather, context, inputs, outputs, output_grads, input_grads);
            backend.check_device_errors();
          },
          Error);
    }
  // The backend stays usable after the error.
  const std::vector<Tensor> inputs{weight, to_backend(Tensor::from_vector<std::int64_t>({2}, {3, 0}), backend)};
  const std::vector<Tensor> outputs{backend.empty({2, 3})};
  backend.forward(OpType::Gather, context, inputs, outputs);
  const Tensor y = to_host(outputs[0], backend);
  const Tensor w = to_host(weight, backend);
  EXPECT_EQ(std::memcmp(y.data<float>(), w.data<float>() + 9, 3 * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(y.data<float>() + 3, w.data<float>(), 3 * sizeof(float)), 0);
}

// ---------------- Reshape ----------------
TEST(CudaShape, ReshapeMatchesCpu) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  expect_cuda_matches_cpu(OpType::Reshape, {{"shape", Ints{0, -1, 2}}}, {normal_tensor({2, 3, 4}, 10)});
  expect_cuda_matches_cpu(OpType::Reshape, {{"shape", Ints{-1}}}, {normal_tensor({3, 5, 7}, 11)});
  expect_forward_identical(OpType::Reshape, {{"shape", Ints{6, 4}}}, {index_tensor({2, 3, 4}, 100, 12, DType::I64)});
}

// ---------------- Permute ----------------
TEST(CudaShape, PermuteRank4MatchesCpu) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  // [B, S, h, d] <-> [B, h, S, d] (innermost axis kept: strided gather), NCHW <-> NHWC and full
  // reversals (innermost axis moves: tile transpose), odd sizes for partial tiles.
  const std::vector<Ints> perms = {{0, 2, 1, 3}, {0, 2, 3, 1}, {0, 3, 1, 2}, {3, 1, 0, 2}, {3, 2, 1, 0}, {1, 0, 3, 2}};
  for (const Ints& perm : perms) {
    SCOPED_TRACE(::testing::PrintToString(perm));
    expect_cuda_matches_cpu(OpType::Permute, {{"perm", perm}}, {normal_tensor({2, 3, 5, 7}, 20)});
    expect_cuda_matches_cpu(OpType::Permute, {{"perm", perm}}, {normal_tensor({3, 37, 2, 45}, 21)});
  }
}

TEST(CudaShape, PermuteOtherRanksAndSizeOneAxesMatchCpu) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  expect_cuda_matches_cpu(OpType::Permute, {{"perm", Ints{1, 0}}}, {normal_tensor({33, 65}, 22)});
  expect_cuda_matches_cpu(OpType::Permute, {{"perm", Ints{1, 0}}}, {normal_tensor({1, 40}, 23)});  // no data moves
  expect_cuda_matches_cpu(OpType::Permute, {{"perm", Ints{2, 1, 0}}}, {normal_tensor({4, 1, 6}, 24)});
  expect_cuda_matches_cpu(OpType::Permute, {{"perm", Ints{2, 0, 1}}}, {normal_tensor({2, 3, 4}, 25)});
  expect_cuda_matches_cpu(OpType::Permute, {{"perm", Ints{4, 2, 0, 3, 1}}}, {normal_tensor({2, 3, 4, 5, 3}, 26)});
  expect_cuda_matches_cpu(OpType::Permute, {{"perm", Ints{5, 0, 4, 1, 3, 2}}}, {normal_tensor({2, 3, 2, 3, 2, 5}, 27)});
  expect_cuda_matches_cpu(OpType::Permute, {{"perm", Ints{7, 6, 5, 4, 3, 2, 1, 0}}},
                          {normal_tensor({2, 2, 3, 2, 2, 3, 2, 2}, 28)});
  expect_forward_identical(OpType::Permute, {{"perm", Ints{0, 2, 3, 1}}}, {index_tensor({2, 3, 5, 7}, 1000, 29, DType::I64)});
  expect_forward_identical(OpType::Permute, {{"perm", Ints{0, 2, 1, 3}}}, {index_tensor({2, 3, 5, 7}, 1000, 30, DType::I32)});
}

// ---------------- Slice ----------------
TEST(CudaShape, SliceAlongSeveralAxesMatchesCpu) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  const Tensor x = normal_tensor({4, 6, 10}, 40);
  const std::vector<Attributes> slices = {
      {{"axis", 0}, {"start", 1}, {"end", 3}},
      {{"axis", 1}, {"start", -5}, {"end", 6}, {"step", 2}},
      {{"axis", -1}, {"start", 1}, {"end", -1}},
      {{"axis", 2}, {"start", 0}, {"end", 10}, {"step", 3}},
      {{"axis", 1}, {"start", 2}, {"end", 3}},
      {{"axis", 2}, {"start", 4}, {"end", 8}},  // 4 f32 = 16-byte rows
  };
  for (const Attributes& attributes : slices) {
    SCOPED_TRACE(attributes.canonical_string());
    expect_cuda_matches_cpu(OpType::Slice, attributes, {x});
    expect_forward_identical(OpType::Slice, attributes, {index_tensor({4, 6, 10}, 1000, 41, DType::I32)});
  }
}

// ---------------- Concat and Split ----------------
TEST(CudaShape, ConcatAlongSeveralAxesMatchesCpu) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  expect_cuda_matches_cpu(OpType::Concat, {{"axis", 0}},
                          {normal_tensor({1, 3, 4}, 50), normal_tensor({2, 3, 4}, 51), normal_tensor({3, 3, 4}, 52)});
  expect_cuda_matches_cpu(OpType::Concat, {{"axis", 1}},
                          {normal_tensor({2, 1, 5}, 53), normal_tensor({2, 4, 5}, 54), normal_tensor({2, 2, 5}, 55)});
  expect_cuda_matches_cpu(OpType::Concat, {{"axis", -1}},
                          {normal_tensor({3, 2, 3}, 56), normal_tensor({3, 2, 1}, 57), normal_tensor({3, 2, 8}, 58)});
  expect_cuda_matches_cpu(OpType::Concat, {{"axis", 1}}, {normal_tensor({2, 64, 7}, 59), normal_tensor({2, 64, 7}, 60)});
  expect_forward_identical(OpType::Concat, {{"axis", 1}},
                           {index_tensor({2, 3}, 100, 61, DType::I64), index_tensor({2, 5}, 100, 62, DType::I64)});
  expect_forward_identical(OpType::Concat, {{"axis", 2}},
                           {index_tensor({2, 3, 3}, 100, 63, DType::I32), index_tensor({2, 3, 1}, 100, 64, DType::I32)});
}

TEST(CudaShape, SplitAlongSeveralAxesMatchesCpu) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  expect_cuda_matches_cpu(OpType::Split, {{"axis", 1}, {"sizes", Ints{1, 3, 2}}}, {normal_tensor({2, 6, 3}, 70)});
  expect_cuda_matches_cpu(OpType::Split, {{"axis", 0}, {"sizes", Ints{2, 0, 1}}}, {normal_tensor({3, 4}, 71)});
  expect_cuda_matches_cpu(OpType::Split, {{"axis", -1}, {"sizes", Ints{5, 2, 6}}}, {normal_tensor({3, 2, 13}, 72)});
  // The QKV split of attention: [B, S, 3 * hidden] into three [B, S, hidden].
  expect_cuda_matches_cpu(OpType::Split, {{"axis", 2}, {"sizes", Ints{64, 64, 64}}}, {normal_tensor({2, 5, 192}, 73)});
  expect_forward_identical(OpType::Split, {{"axis", 1}, {"sizes", Ints{1, 2}}}, {index_tensor({4, 3}, 100, 74, DType::I64)});
  expect_forward_identical(OpType::Split, {{"axis", 0}, {"sizes", Ints{3, 1}}}, {index_tensor({4, 3, 2}, 100, 75, DType::I32)});
}

}  // namespace
}  // namespace partrain
