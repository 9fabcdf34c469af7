// CUDA vs CPU: the softmax ops (kernels/cuda/softmax.cu against kernels/cpu/softmax.cpp), forward
// and backward, in fp32 and bf16. Skipped without a GPU.
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "cuda/cuda_op_check.h"
#include "kernels/cuda/cuda_backend.cuh"
#include "support/gradient_check.h"

namespace partrain {
namespace {
using testing::CudaOpCheck;
using testing::expect_cuda_matches_cpu;
using testing::index_tensor;
using testing::normal_tensor;

constexpr float kInfinity = std::numeric_limits<float>::infinity();
const Attributes kCausal{{"causal", std::int64_t{1}}};

// ---------------- Softmax ----------------
TEST(CudaSoftmax, RowsOfManyLengths) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  // Warp per row up to 1024 elements, block per row beyond; a long row of 4096; odd sizes.
  for (const Shape& shape : {Shape{2, 3, 7}, Shape{5, 1}, Shape{33, 31}, Shape{4, 1024}, Shape{4, 1025}, Shape{3, 4096},
                             Shape{2, 2, 5000}, Shape{1000, 40}}) {
    SCOPED_TRACE(shape_string(shape));
    expect_cuda_matches_cpu(OpType::Softmax, {}, {normal_tensor(shape, 1, 3.f)});
  }
}

TEST(CudaSoftmax, AdditiveMasks) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  // Broadcast [B, 1, 1, T] mask with hidden keys; a full-shape mask; a mask of lower rank.
  Tensor mask = normal_tensor({2, 1, 1, 5}, 2);
  mask.data<float>()[1] = -kInfinity;
  mask.data<float>()[8] = -kInfinity;
  expect_cuda_matches_cpu(OpType::Softmax, {}, {normal_tensor({2, 2, 3, 5}, 3), mask});
  expect_cuda_matches_cpu(OpType::Softmax, {}, {normal_tensor({3, 6, 9}, 4), normal_tensor({3, 6, 9}, 5)});
  expect_cuda_matches_cpu(OpType::Softmax, {}, {normal_tensor({2, 4, 6, 1500}, 6), normal_tensor({6, 1}, 7)});
  Tensor long_mask = normal_tensor({2, 1, 1, 2048}, 8);
  for (int j = 0; j < 2048; j += 3) long_mask.data<float>()[j] = -kInfinity;
  expect_cuda_matches_cpu(OpType::Softmax, {}, {normal_tensor({2, 3, 4, 2048}, 9), long_mask});
  // The mask stays f32 while x is bf16 (mixed dtypes in one kernel).
  CudaOpCheck f32_mask;
  f32_mask.f32_inputs_in_bf16 = {1};
  expect_cuda_matches_cpu(OpType::Softmax, {}, {normal_tensor({2, 2, 3, 5}, 10), mask}, f32_mask);
}

TEST(CudaSoftmax, FullyMaskedRowsGiveZeros) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  const Tensor mask = Tensor::from_vector<float>({2, 3}, {-kInfinity, -kInfinity, -kInfinity, 0, 0, -kInfinity});
  expect_cuda_matches_cpu(OpType::Softmax, {}, {normal_tensor({2, 3}, 11), mask});
  Tensor long_mask = Tensor::full({2, 1, 3000}, 0.0);
  for (int j = 0; j < 3000; ++j) long_mask.data<float>()[j] = -kInfinity;  // sample 0 sees nothing
  expect_cuda_matches_cpu(OpType::Softmax, {}, {normal_tensor({2, 2, 3000}, 12), long_mask});
}

TEST(CudaSoftmax, Causal) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  // Square, S < T (cached prefix), S > T (leading rows see nothing), long rows, with a mask.
  for (const Shape& shape :
       {Shape{2, 4, 4}, Shape{2, 3, 5}, Shape{4, 2}, Shape{2, 2, 64, 64}, Shape{1, 1100, 1100}, Shape{3, 2000}}) {
    SCOPED_TRACE(shape_string(shape));
    expect_cuda_matches_cpu(OpType::Softmax, kCausal, {normal_tensor(shape, 13, 2.f)});
  }
  expect_cuda_matches_cpu(OpType::Softmax, kCausal, {normal_tensor({2, 2, 3, 5}, 14), normal_tensor({2, 1, 1, 5}, 15)});
}

// ---------------- SoftmaxCrossEntropy ----------------
// Labels in [0, classes) with every `ignore_every`-th position set to ignore_index.
Tensor labels_with_ignored(const Shape& shape, std::int64_t classes, std::uint64_t seed, DType dtype, int ignore_every,
                           std::int64_t ignore_index = -100) {
  Tensor labels = index_tensor(shape, classes, seed, DType::I64);
  std::vector<std::int64_t> values(labels.data<std::int64_t>(), labels.data<std::int64_t>() + labels.numel());
  if (ignore_every > 0)
    for (std::size_t i = 0; i < values.size(); i += ignore_every) values[i] = ignore_index;
  if (dtype == DType::I64) return Tensor::from_vector<std::int64_t>(shape, values);
  return Tensor::from_vector<std::int32_t>(shape, std::vector<std::int32_t>(values.begin(), values.end()));
}

TEST(CudaSoftmax, CrossEntropy) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::I64, DType::I32}) {
    SCOPED_TRACE(dtype_name(dtype));
    expect_cuda_matches_cpu(OpType::SoftmaxCrossEntropy, {},
                            {normal_tensor({2, 3, 7}, 20), labels_with_ignored({2, 3}, 7, 21, dtype, 0)});
    expect_cuda_matches_cpu(OpType::SoftmaxCrossEntropy, {},
                            {normal_tensor({4, 9, 33}, 22, 3.f), labels_with_ignored({4, 9}, 33, 23, dtype, 4)});
    // Long rows (block per row): a GPT-2-sized vocabulary.
    expect_cuda_matches_cpu(OpType::SoftmaxCrossEntropy, {},
                            {normal_tensor({3, 50257}, 24), labels_with_ignored({3}, 50257, 25, dtype, 3)});
    expect_cuda_matches_cpu(OpType::SoftmaxCrossEntropy, {},
                            {normal_tensor({64, 300}, 26), labels_with_ignored({64}, 300, 27, dtype, 5)});
    // Another ignore_index; every position ignored (loss 0, zero gradients).
    expect_cuda_matches_cpu(OpType::SoftmaxCrossEntropy, {{"ignore_index", std::int64_t{0}}},
                            {normal_tensor({5, 6}, 28), labels_with_ignored({5}, 6, 29, dtype, 2, 0)});
    expect_cuda_matches_cpu(OpType::SoftmaxCrossEntropy, {},
                            {normal_tensor({2, 2, 10}, 30), labels_with_ignored({2, 2}, 10, 31, dtype, 1)});
  }
}

TEST(CudaSoftmax, CrossEntropyLabelOutsideTheClassesIsAnError) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  cuda::CudaBackend& backend = cuda::cuda_backend(0);
  const Attributes attributes;
  const KernelContext context{attributes, backend};
  const Tensor logits = to_backend(normal_tensor({2, 3, 5}, 40), backend);
  for (std::int64_t bad : {std::int64_t{5}, std::int64_t{-1}, std::int64_t{1000}}) {
    for (DType dtype : {DType::I64, DType::I32}) {
      SCOPED_TRACE(std::to_string(bad) + " " + dtype_name(dtype));
      // Flat index 4 = position [1, 1] holds the bad label; -100 (ignored) is fine.
      const std::vector<std::int64_t> values = {0, -100, 4, 2, bad, 1};
      const Tensor host_labels =
          dtype == DType::I64
              ? Tensor::from_vector<std::int64_t>({2, 3}, values)
              : Tensor::from_vector<std::int32_t>({2, 3}, std::vector<std::int32_t>(values.begin(), values.end()));
      const Tensor labels = to_backend(host_labels, backend);
      const Tensor loss = backend.empty({}, DType::F32);
      try {
        backend.forward(OpType::SoftmaxCrossEntropy, context, std::vector<Tensor>{logits, labels},
                        std::vector<Tensor>{loss});
        backend.check_device_errors();  // the error comes here under overlap ordering
        ADD_FAILURE() << "no error for label " << bad;
      } catch (const Error& error) {
        const std::string message = error.message();
        EXPECT_NE(message.find("label " + std::to_string(bad)), std::string::npos) << message;
        EXPECT_NE(message.find("[1, 1]"), std::string::npos) << message;
        EXPECT_NE(message.find("flat index 4"), std::string::npos) << message;
        EXPECT_NE(message.find("SoftmaxCrossEntropy forward"), std::string::npos) << message;
      }
      const Tensor loss_grad = to_backend(Tensor::full({}, 1.0), backend);
      const Tensor dlogits = backend.empty({2, 3, 5}, DType::F32);
      EXPECT_THROW(
          {
            backend.backward(OpType::SoftmaxCrossEntropy, context, std::vector<Tensor>{logits, labels},
                             std::vector<Tensor>{loss}, std::vector<Tensor>{loss_grad},
                             std::vector<Tensor>{dlogits, Tensor()});
            backend.check_device_errors();
          },
          Error);
    }
  }
}

}  // namespace
}  // namespace partrain
