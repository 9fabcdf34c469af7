// CUDA vs CPU: the tensor-parallel ops (kernels/cuda/tensor_parallel.cu against
// kernels/cpu/tensor_parallel.cpp), forward and backward, f32 and bf16, with and without vocabulary
// padding, as rank 0 and rank t − 1 of groups of t = 2 and 4, Dropout on a tensor-parallel part, and sequence parallelism's all-gathers,
// reduce-scatters, scatter and gather (also against a hand-computed layout). Both backends reduce over the same
// test-local group (below), so each rank's results are compared as they are. Skipped without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor_parallel_group.h"
#include "cuda/cuda_op_check.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/cuda_backend.cuh"
#include "support/gradient_check.h"

namespace partrain {
namespace {
using testing::CudaOpCheck;
using testing::expect_cuda_matches_cpu;
using testing::index_tensor;
using testing::normal_tensor;
using Reduction = TensorParallelGroup::Reduction;

// A group of `size` ranks seen from rank `rank`, whose other ranks are simulated deterministically:
// a Sum multiplies every element by size (every rank contributed the same values), a Max adds
// kMaxLead (some other rank's values were larger by that much), so the kernels must use what the
// group returns. Device tensors are staged through host memory with blocking cudaMemcpy on the
// legacy default stream, which does not wait for the CUDA backend's non-blocking stream: like a
// group over a communicator that is not CUDA-aware, it sees correct data only because the kernels
// synchronise their stream before an all-reduce. Records every call; a deferrable all-reduce
// (Megatron's f and g) completes at once. An all-gather puts rank r's part as this rank's part +
// (r − rank) · kGatherStep; a reduce-scatter returns Σ_r (r + 1) · (block r of the input): both
// depend on where each block lies, so the kernels' rearranging is checked.
class SimulatedGroup final : public TensorParallelGroup {
 public:
  static constexpr float kMaxLead = 0.5f;
  static constexpr float kGatherStep = 0.25f;
  struct Call {
    Reduction reduction;
    std::int64_t elements;
    bool on_device;
    bool deferrable;
  };

  SimulatedGroup(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce(const Tensor& tensor, Reduction reduction) override { reduce(tensor, reduction, false); }
  void all_reduce_deferrable(const Tensor& tensor) override { reduce(tensor, Reduction::Sum, true); }
  void all_gather(const Tensor& input, const Tensor& output) override {
    ASSERT_EQ(input.dtype(), DType::F32);
    ASSERT_EQ(output.numel(), input.numel() * size_);
    ++all_gathers;
    const std::vector<float> part = host_values(input);
    std::vector<float> whole;
    for (int r = 0; r < size_; ++r)
      for (float value : part) whole.push_back(value + static_cast<float>(r - rank_) * kGatherStep);
    write_values(output, whole);
  }
  void reduce_scatter(const Tensor& input, const Tensor& output) override {
    ASSERT_EQ(input.dtype(), DType::F32);
    ASSERT_EQ(input.numel(), output.numel() * size_);
    ++reduce_scatters;
    const std::vector<float> whole = host_values(input);
    std::vector<float> part(static_cast<std::size_t>(output.numel()), 0.f);
    for (int r = 0; r < size_; ++r)
      for (std::size_t i = 0; i < part.size(); ++i) part[i] += static_cast<float>(r + 1) * whole[r * part.size() + i];
    write_values(output, part);
  }

  std::vector<Call> calls;
  int all_gathers = 0, reduce_scatters = 0;

 private:
  void reduce(const Tensor& tensor, Reduction reduction, bool deferrable) {
    ASSERT_EQ(tensor.dtype(), DType::F32) << "the group takes f32 tensors (core/tensor_parallel_group.h)";
    const bool on_device = !tensor.device().is_cpu();
    calls.push_back({reduction, tensor.numel(), on_device, deferrable});
    if (tensor.numel() == 0) return;
    std::vector<float> values(static_cast<std::size_t>(tensor.numel()));
    if (on_device) {
      ASSERT_EQ(cudaMemcpy(values.data(), tensor.raw_data(), tensor.nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    } else {
      std::copy(tensor.data<float>(), tensor.data<float>() + tensor.numel(), values.begin());
    }
    for (float& value : values)
      value = reduction == Reduction::Sum ? value * static_cast<float>(size_) : value + kMaxLead;
    if (on_device) {
      ASSERT_EQ(cudaMemcpy(tensor.raw_data(), values.data(), tensor.nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
      // A copy from pageable memory may return before it lands: complete it before returning.
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    } else {
      std::copy(values.begin(), values.end(), tensor.data<float>());
    }
  }

  static std::vector<float> host_values(const Tensor& tensor) {
    std::vector<float> values(static_cast<std::size_t>(tensor.numel()));
    if (tensor.device().is_cpu()) {
      std::copy(tensor.data<float>(), tensor.data<float>() + tensor.numel(), values.begin());
    } else if (!values.empty()) {
      EXPECT_EQ(cudaMemcpy(values.data(), tensor.raw_data(), tensor.nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return values;
  }
  static void write_values(const Tensor& tensor, const std::vector<float>& values) {
    if (tensor.device().is_cpu()) {
      std::copy(values.begin(), values.end(), tensor.data<float>());
    } else if (!values.empty()) {
      EXPECT_EQ(cudaMemcpy(tensor.raw_data(), values.data(), tensor.nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    }
  }

  int rank_, size_;
};

// (rank, size) pairs: the first and the last rank of t = 2 and t = 4.
const std::vector<std::pair<int, int>> kRanks = {{0, 2}, {1, 2}, {0, 4}, {3, 4}};

std::string rank_name(int rank, int size) { return "rank " + std::to_string(rank) + " of " + std::to_string(size); }

// A host tensor of `values` as i64 or i32.
Tensor integer_tensor(const Shape& shape, const std::vector<std::int64_t>& values, DType dtype) {
  if (dtype == DType::I64) return Tensor::from_vector<std::int64_t>(shape, values);
  return Tensor::from_vector<std::int32_t>(shape, std::vector<std::int32_t>(values.begin(), values.end()));
}

// Labels in [0, classes) with every `ignore_every`-th position set to ignore_index.
Tensor labels_with_ignored(const Shape& shape, std::int64_t classes, std::uint64_t seed, DType dtype, int ignore_every,
                           std::int64_t ignore_index = -100) {
  Tensor labels = index_tensor(shape, classes, seed, DType::I64);
  std::vector<std::int64_t> values(labels.data<std::int64_t>(), labels.data<std::int64_t>() + labels.numel());
  if (ignore_every > 0)
    for (std::size_t i = 0; i < values.size(); i += ignore_every) values[i] = ignore_index;
  return integer_tensor(shape, values, dtype);
}

// ---------------- f and g ----------------
TEST(CudaTensorParallel, CopyAndAllReduceMatchTheCpu) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  for (const auto& [rank, size] : kRanks) {
    SCOPED_TRACE(rank_name(rank, size));
    SimulatedGroup group(rank, size);
    CudaOpCheck check;
    check.tensor_parallel = &group;
    for (const Shape& shape : {Shape{2, 3, 8}, Shape{5, 7}, Shape{4, 1000}}) {
      SCOPED_TRACE(shape_string(shape));
      expect_cuda_matches_cpu(OpType::TensorParallelCopy, {}, {normal_tensor(shape, 1)}, check);
      expect_cuda_matches_cpu(OpType::TensorParallelAllReduce, {}, {normal_tensor(shape, 2)}, check);
    }
  }
}

TEST(CudaTensorParallel, CopyReducesInTheBackwardAndAllReduceInTheForward) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  cuda::CudaBackend& backend = cuda::cuda_backend(0);
  SimulatedGroup group(1, 4);
  const Attributes attributes;
  const KernelContext context{attributes, backend, true, {}, &group};
  const Tensor x = to_backend(normal_tensor({3, 5}, 3), backend);
  const Tensor y = backend.empty({3, 5});
  const Tensor dy = to_backend(normal_tensor({3, 5}, 4), backend);
  const Tensor dx = backend.empty({3, 5});
  const std::vector<float> xs = normal_tensor({3, 5}, 3).to_float_vector();
  const std::vector<float> dys = normal_tensor({3, 5}, 4).to_float_vector();

  backend.forward(OpType::TensorParallelCopy, context, std::vector<Tensor>{x}, std::vector<Tensor>{y});
  EXPECT_TRUE(group.calls.empty());
  EXPECT_EQ(to_host(y, backend).to_float_vector(), xs);
  backend.backward(OpType::TensorParallelCopy, context, std::vector<Tensor>{x}, std::vector<Tensor>{y},
                   std::vector<Tensor>{dy}, std::vector<Tensor>{dx});
  ASSERT_EQ(group.calls.size(), 1u);
  EXPECT_EQ(group.calls[0].reduction, Reduction::Sum);
  EXPECT_TRUE(group.calls[0].on_device);
  EXPECT_TRUE(group.calls[0].deferrable) << "f and g are deferrable all-reduces, as on the CPU";
  std::vector<float> expected = dys;
  for (float& value : expected) value *= 4;
  EXPECT_EQ(to_host(dx, backend).to_float_vector(), expected);

  group.calls.clear();
  backend.forward(OpType::TensorParallelAllReduce, context, std::vector<Tensor>{x}, std::vector<Tensor>{y});
  ASSERT_EQ(group.calls.size(), 1u);
  EXPECT_TRUE(group.calls[0].deferrable);
  expected = xs;
  for (float& value : expected) value *= 4;
  EXPECT_EQ(to_host(y, backend).to_float_vector(), expected);
  backend.backward(OpType::TensorParallelAllReduce, context, std::vector<Tensor>{x}, std::vector<Tensor>{y},
                   std::vector<Tensor>{dy}, std::vector<Tensor>{dx});
  EXPECT_EQ(group.calls.size(), 1u);
  EXPECT_EQ(to_host(dx, backend).to_float_vector(), dys);
}

// ---------------- VocabParallelEmbedding ----------------
TEST(CudaTensorParallel, EmbeddingMatchesTheCpu) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  for (const auto& [rank, size] : kRanks) {
    SCOPED_TRACE(rank_name(rank, size));
    SimulatedGroup group(rank, size);
    CudaOpCheck check;
    check.tensor_parallel = &group;
    for (DType dtype : {DType::I64, DType::I32}) {
      SCOPED_TRACE(dtype_name(dtype));
      // Indices over the whole vocabulary (rows · t): some are the rank's, most another's; repeats.
      expect_cuda_matches_cpu(OpType::VocabParallelEmbedding, {},
                              {normal_tensor({11, 6}, 10), index_tensor({3, 5}, 11 * size, 11, dtype)}, check);
      expect_cuda_matches_cpu(OpType::VocabParallelEmbedding, {},
                              {normal_tensor({50, 64}, 12), index_tensor({8, 128}, 50 * size, 13, dtype)}, check);
      // Few rows, many positions: heavy atomic contention on the rank's rows.
      expect_cuda_matches_cpu(OpType::VocabParallelEmbedding, {},
                              {normal_tensor({3, 256}, 14), index_tensor({512}, 3 * size, 15, dtype)}, check);
      // A padded vocabulary (vocab_size: the real rows, the last rank's part ends in padding).
      const std::int64_t real = 11 * size - 4;
      expect_cuda_matches_cpu(OpType::VocabParallelEmbedding, {{"vocab_size", real}},
                              {normal_tensor({11, 6}, 16), index_tensor({3, 5}, real, 17, dtype)}, check);
    }
    EXPECT_TRUE(group.calls.empty()) << "the embedding itself does not communicate";
  }
}

// ---------------- VocabParallelCrossEntropy ----------------
TEST(CudaTensorParallel, CrossEntropyMatchesTheCpu) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  for (const auto& [rank, size] : kRanks) {
    SCOPED_TRACE(rank_name(rank, size));
    SimulatedGroup group(rank, size);
    CudaOpCheck check;
    check.tensor_parallel = &group;
    for (DType dtype : {DType::I64, DType::I32}) {
      SCOPED_TRACE(dtype_name(dtype));
      // Labels over all C = classes · t classes (some on this rank), some ignored; both outputs
      // (loss and log_sum_exp) and the logits' gradient are compared.
      expect_cuda_matches_cpu(OpType::VocabParallelCrossEntropy, {},
                              {normal_tensor({2, 3, 7}, 20), labels_with_ignored({2, 3}, 7 * size, 21, dtype, 0)},
                              check);
      expect_cuda_matches_cpu(OpType::VocabParallelCrossEntropy, {},
                              {normal_tensor({4, 9, 33}, 22, 3.f),
                               labels_with_ignored({4, 9}, 33 * size, 23, dtype, 4)},
                              check);
      // Long rows (a block per row): part of a GPT-2-sized vocabulary.
      expect_cuda_matches_cpu(OpType::VocabParallelCrossEntropy, {},
                              {normal_tensor({3, 12565}, 24), labels_with_ignored({3}, 12565 * size, 25, dtype, 3)},
                              check);
      // Another ignore_index (a class of rank 0); every position ignored (loss 0, zero gradients).
      expect_cuda_matches_cpu(OpType::VocabParallelCrossEntropy, {{"ignore_index", std::int64_t{0}}},
                              {normal_tensor({5, 6}, 26), labels_with_ignored({5}, 6 * size, 27, dtype, 2, 0)}, check);
      expect_cuda_matches_cpu(OpType::VocabParallelCrossEntropy, {},
                              {normal_tensor({2, 2, 10}, 28), labels_with_ignored({2, 2}, 10 * size, 29, dtype, 1)},
                              check);
      // A padded vocabulary (Megatron-LM's vocab_divisible_by): the last rank's classes past
      // vocab_size are padding, whose (random, here) logits must take no part in the loss and get a
      // zero gradient; a warp per row and a block per row.
      const std::int64_t real = 7 * size - 3;
      expect_cuda_matches_cpu(OpType::VocabParallelCrossEntropy, {{"vocab_size", real}},
                              {normal_tensor({2, 3, 7}, 60, 3.f), labels_with_ignored({2, 3}, real, 61, dtype, 4)},
                              check);
      const std::int64_t long_real = 12565 * size - 1000;
      expect_cuda_matches_cpu(OpType::VocabParallelCrossEntropy, {{"vocab_size", long_real}},
                              {normal_tensor({3, 12565}, 62), labels_with_ignored({3}, long_real, 63, dtype, 0)},
                              check);
    }
  }
}

TEST(CudaTensorParallel, CrossEntropyReducesMaximaThenSumsAndTargets) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  cuda::CudaBackend& backend = cuda::cuda_backend(0);
  SimulatedGroup group(1, 2);
  const Attributes attributes;
  const KernelContext context{attributes, backend, true, {}, &group};
  const std::vector<Tensor> inputs{to_backend(normal_tensor({6, 9}, 30), backend),
                                   to_backend(labels_with_ignored({6}, 18, 31, DType::I64, 4), backend)};
  const std::vector<Tensor> outputs{backend.empty({}), backend.empty({6})};
  backend.forward(OpType::VocabParallelCrossEntropy, context, inputs, outputs);
  // The CPU makes a third all-reduce for the target logits; the CUDA kernel sums them with the
  // sums of exponentials.
  ASSERT_EQ(group.calls.size(), 2u);
  EXPECT_EQ(group.calls[0].reduction, Reduction::Max);
  EXPECT_EQ(group.calls[0].elements, 6);
  EXPECT_EQ(group.calls[1].reduction, Reduction::Sum);
  EXPECT_EQ(group.calls[1].elements, 12);
  EXPECT_TRUE(group.calls[0].on_device && group.calls[1].on_device);
  EXPECT_FALSE(group.calls[0].deferrable || group.calls[1].deferrable) << "the next kernels read the results";
  group.calls.clear();
  const std::vector<Tensor> output_grads{to_backend(Tensor::full({}, 1.0), backend), backend.zeros({6})};
  const std::vector<Tensor> input_grads{backend.empty({6, 9}), Tensor()};
  backend.backward(OpType::VocabParallelCrossEntropy, context, inputs, outputs, output_grads, input_grads);
  EXPECT_TRUE(group.calls.empty()) << "the backward uses log_sum_exp and does not communicate";
}

// ---------------- errors ----------------
// Runs the forward (and, with output gradients, the backward) of `type` on `backend`; returns the
// partrain::Error messages ("" when the call succeeded). Each call is followed by the backend's
// device check (the runtime's step end), where the CUDA backend reports a bad index under overlap
// ordering (kernels/cuda/device_errors.cuh); a no-op on the CPU.
std::vector<std::string> error_messages(Backend& backend, OpType type, const Attributes& attributes,
                                        TensorParallelGroup* group, const std::vector<Tensor>& host_inputs,
                                        const std::vector<Shape>& output_shapes, const Shape& gradient_shape) {
  const KernelContext context{attributes, backend, true, {}, group};
  std::vector<Tensor> inputs, outputs, output_grads;
  for (const Tensor& input : host_inputs) inputs.push_back(to_backend(input, backend));
  for (const Shape& shape : output_shapes) {
    outputs.push_back(backend.zeros(shape));
    output_grads.push_back(backend.zeros(shape));
  }
  std::vector<Tensor> input_grads(inputs.size());  // the first input's gradient only
  input_grads[0] = backend.empty(gradient_shape);
  std::vector<std::string> messages(2);
  try {
    backend.forward(type, context, inputs, outputs);
    backend.check_device_errors();
  } catch (const Error& error) {
    messages[0] = error.message();
  }
  try {
    backend.backward(type, context, inputs, outputs, output_grads, input_grads);
    backend.check_device_errors();
  } catch (const Error& error) {
    messages[1] = error.message();
  }
  return messages;
}

// The GPU's message is the CPU's followed by where it was found: " (in <op> <direction>, found by a
// check on the device)" (and, under plain ordering, the op hook's " (in ... ordering)").
void expect_cpu_message_then_op(const std::vector<std::string>& gpu, const std::vector<std::string>& cpu,
                                const std::string& op) {
  ASSERT_EQ(gpu.size(), cpu.size());
  const char* directions[] = {" forward", " backward"};
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_FALSE(cpu[i].empty()) << "the CPU reported no error, direction " << i;
    EXPECT_EQ(gpu[i].substr(0, cpu[i].size()), cpu[i]) << gpu[i];
    EXPECT_NE(gpu[i].find("(in " + op + directions[i]), std::string::npos) << gpu[i];
  }
}

TEST(CudaTensorParallel, BadIndicesAndLabelsGiveTheCpuErrors) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  cuda::CudaBackend& backend = cuda::cuda_backend(0);
  SimulatedGroup group(1, 2);
  for (DType dtype : {DType::I64, DType::I32}) {
    for (std::int64_t bad : {std::int64_t{8}, std::int64_t{-1}}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + std::to_string(bad));
      // Vocabulary 4 rows · 2 ranks = 8; flat position 2 = [1, 0] holds the bad index.
      const std::vector<Tensor> embedding{normal_tensor({4, 3}, 40), integer_tensor({2, 2}, {0, 7, bad, 2}, dtype)};
      const std::vector<std::string> cpu =
          error_messages(cpu_backend(), OpType::VocabParallelEmbedding, {}, &group, embedding, {{2, 2, 3}}, {4, 3});
      const std::vector<std::string> gpu =
          error_messages(backend, OpType::VocabParallelEmbedding, {}, &group, embedding, {{2, 2, 3}}, {4, 3});
      EXPECT_NE(cpu[0].find("[1, 0]"), std::string::npos) << cpu[0];
      expect_cpu_message_then_op(gpu, cpu, "VocabParallelEmbedding");
      // Classes 4 per rank, 8 in all; ignore_index -100 is fine, `bad` is not.
      const std::vector<Tensor> cross_entropy{normal_tensor({4, 4}, 41), integer_tensor({4}, {-100, 7, bad, 2}, dtype)};
      const OpType ce = OpType::VocabParallelCrossEntropy;
      const std::vector<std::string> cpu_ce =
          error_messages(cpu_backend(), ce, {}, &group, cross_entropy, {{}, {4}}, {4, 4});
      const std::vector<std::string> gpu_ce = error_messages(backend, ce, {}, &group, cross_entropy, {{}, {4}}, {4, 4});
      EXPECT_NE(cpu_ce[0].find("label " + std::to_string(bad)), std::string::npos) << cpu_ce[0];
      expect_cpu_message_then_op(gpu_ce, cpu_ce, "VocabParallelCrossEntropy");
    }
  }
  // The backend stays usable after the errors.
  CudaOpCheck check;
  check.tensor_parallel = &group;
  expect_cuda_matches_cpu(OpType::VocabParallelEmbedding, {},
                          {normal_tensor({4, 3}, 42), index_tensor({2, 2}, 8, 43, DType::I64)}, check);
}

TEST(CudaTensorParallel, NoGroupIsAnError) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  cuda::CudaBackend& backend = cuda::cuda_backend(0);
  const std::vector<std::string> cpu = error_messages(cpu_backend(), OpType::TensorParallelAllReduce, {}, nullptr,
                                                      {normal_tensor({2, 3}, 50)}, {{2, 3}}, {2, 3});
  const std::vector<std::string> gpu = error_messages(backend, OpType::TensorParallelAllReduce, {}, nullptr,
                                                      {normal_tensor({2, 3}, 50)}, {{2, 3}}, {2, 3});
  EXPECT_FALSE(gpu[0].empty());
  EXPECT_EQ(gpu[0], cpu[0]);
  const std::vector<std::string> embedding =
      error_messages(backend, OpType::VocabParallelEmbedding, {}, nullptr,
                     {normal_tensor({4, 3}, 51), index_tensor({2}, 4, 52, DType::I64)}, {{2, 3}}, {4, 3});
  EXPECT_FALSE(embedding[0].empty());
}

// ---------------- sequence parallelism ----------------
Attributes sequence_attributes(std::int64_t axis, int parts) { return {{"axis", axis}, {"parts", std::int64_t{parts}}}; }

TEST(CudaSequenceParallel, AllGatherReduceScatterScatterAndGatherMatchTheCpu) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  for (const auto& [rank, size] : kRanks) {
    SCOPED_TRACE(rank_name(rank, size));
    SimulatedGroup group(rank, size);
    CudaOpCheck check;
    check.tensor_parallel = &group;
    // [B, S/t, H] parts along the sequence (axis 1), a batch of 1 (no rearranging) and a constant
    // [S, H] tensor split along axis 0 (the position vectors).
    for (const auto& [part, axis] : {std::pair{Shape{2, 3, 8}, std::int64_t{1}}, std::pair{Shape{1, 5, 7}, std::int64_t{1}},
                                     std::pair{Shape{3, 40, 33}, std::int64_t{1}}, std::pair{Shape{4, 16}, std::int64_t{0}}}) {
      SCOPED_TRACE(shape_string(part) + " axis " + std::to_string(axis));
      Shape whole = part;
      whole[static_cast<std::size_t>(axis)] *= size;
      const Attributes attributes = sequence_attributes(axis, size);
      expect_cuda_matches_cpu(OpType::SequenceParallelAllGather, attributes, {normal_tensor(part, 70)}, check);
      expect_cuda_matches_cpu(OpType::SequenceParallelReduceScatter, attributes, {normal_tensor(whole, 71)}, check);
      expect_cuda_matches_cpu(OpType::SequenceParallelScatter, attributes, {normal_tensor(whole, 72)}, check);
      expect_cuda_matches_cpu(OpType::SequenceParallelGather, attributes, {normal_tensor(part, 73)}, check);
    }
    EXPECT_GT(group.all_gathers, 0);
    EXPECT_GT(group.reduce_scatters, 0);
  }
}

// The layouts by hand, rank 1 of 2, a part [2, 1, 3] of a whole [2, 2, 3] (sequence axis 1), on
// both backends: the all-gather puts rank r's part at sequence position r of every sample; the
// reduce-scatter hands the group sample-by-sample blocks; the scatter takes position 1; the
// gather's backward takes the rank's part of the gradient.
TEST(CudaSequenceParallel, LayoutsByHand) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  const Attributes attributes = sequence_attributes(1, 2);
  const std::vector<float> part_values = {1, 2, 3, 4, 5, 6};                       // [2, 1, 3]
  const std::vector<float> whole_values = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};  // [2, 2, 3]
  const float step = SimulatedGroup::kGatherStep;
  // Rank 0's part is rank 1's − step (SimulatedGroup); sample o holds [rank 0's row, rank 1's row].
  const std::vector<float> gathered = {1 - step, 2 - step, 3 - step, 1, 2, 3, 4 - step, 5 - step, 6 - step, 4, 5, 6};
  // Σ_r (r + 1) · block r, blocks r = [sample 0 row r, sample 1 row r]: 1·rows 0 + 2·rows 1.
  const std::vector<float> reduced = {1 + 2 * 4, 2 + 2 * 5, 3 + 2 * 6, 7 + 2 * 10, 8 + 2 * 11, 9 + 2 * 12};
  const std::vector<float> rank_part = {4, 5, 6, 10, 11, 12};
  for (Backend* backend : {static_cast<Backend*>(&cpu_backend()), static_cast<Backend*>(&cuda::cuda_backend(0))}) {
    SCOPED_TRACE(backend->name());
    SimulatedGroup group(1, 2);
    const KernelContext context{attributes, *backend, true, {}, &group};
    const Tensor part = to_backend(Tensor::from_vector<float>({2, 1, 3}, part_values), *backend);
    const Tensor whole = to_backend(Tensor::from_vector<float>({2, 2, 3}, whole_values), *backend);
    const Tensor part_out = backend->empty({2, 1, 3});
    const Tensor whole_out = backend->empty({2, 2, 3});
    backend->forward(OpType::SequenceParallelAllGather, context, std::vector<Tensor>{part}, std::vector<Tensor>{whole_out});
    EXPECT_EQ(to_host(whole_out, *backend).to_float_vector(), gathered);
    backend->forward(OpType::SequenceParallelReduceScatter, context, std::vector<Tensor>{whole},
                     std::vector<Tensor>{part_out});
    EXPECT_EQ(to_host(part_out, *backend).to_float_vector(), reduced);
    // f's backward is g's forward and vice versa.
    backend->backward(OpType::SequenceParallelAllGather, context, std::vector<Tensor>{part}, std::vector<Tensor>{whole_out},
                      std::vector<Tensor>{whole}, std::vector<Tensor>{part_out});
    EXPECT_EQ(to_host(part_out, *backend).to_float_vector(), reduced);
    backend->forward(OpType::SequenceParallelScatter, context, std::vector<Tensor>{whole}, std::vector<Tensor>{part_out});
    EXPECT_EQ(to_host(part_out, *backend).to_float_vector(), rank_part);
    backend->backward(OpType::SequenceParallelGather, context, std::vector<Tensor>{part}, std::vector<Tensor>{whole_out},
                      std::vector<Tensor>{whole}, std::vector<Tensor>{part_out});
    EXPECT_EQ(to_host(part_out, *backend).to_float_vector(), rank_part);
    EXPECT_EQ(group.all_gathers, 1);
    EXPECT_EQ(group.reduce_scatters, 2);
  }
}

TEST(CudaSequenceParallel, WrongGroupSizeIsTheCpuError) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  SimulatedGroup group(0, 2);
  const Attributes attributes = sequence_attributes(1, 4);  // made for 4 ranks
  const std::vector<std::string> cpu = error_messages(cpu_backend(), OpType::SequenceParallelAllGather, attributes, &group,
                                                      {normal_tensor({2, 3, 4}, 80)}, {{2, 12, 4}}, {2, 3, 4});
  const std::vector<std::string> gpu = error_messages(cuda::cuda_backend(0), OpType::SequenceParallelAllGather, attributes,
                                                      &group, {normal_tensor({2, 3, 4}, 80)}, {{2, 12, 4}}, {2, 3, 4});
  EXPECT_NE(cpu[0].find("SequenceParallelAllGather was made for 4 ranks but runs in a tensor-parallel group of 2"),
            std::string::npos)
      << cpu[0];
  EXPECT_EQ(gpu[0], cpu[0]);
}

// ---------------- Dropout on a tensor-parallel part ----------------
TEST(CudaTensorParallel, DropoutOfAPartMatchesTheCpuExactly) {
  PARTRAIN_SKIP_WITHOUT_GPU();
  // tensor_parallel_split = 1: the rank's part draws the whole tensor's mask elements from
  // rank · (part elements per sample) on (kernels::dropout_first_element), on both backends.
  for (const auto& [rank, size] : kRanks) {
    SCOPED_TRACE(rank_name(rank, size));
    SimulatedGroup group(rank, size);
    CudaOpCheck exact;
    exact.f32_tolerance = 0;
    exact.bf16_tolerance = 0;
    exact.tensor_parallel = &group;
    expect_cuda_matches_cpu(OpType::Dropout, {{"p", 0.3}, {"tensor_parallel_split", std::int64_t{1}}},
                            {normal_tensor({4, 3, 5, 7}, 60)}, exact);
    EXPECT_TRUE(group.calls.empty());
  }
}

}  // namespace
}  // namespace partrain
