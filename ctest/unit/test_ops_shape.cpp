// Finite-difference gradient checks, reference values and shape inference of the shape ops
// (Gather, Reshape, Permute, Slice, Concat, Split).
#include <gtest/gtest.h>

#include <numeric>

#include "graph/op_schema.h"
#include "kernels/cpu/cpu_backend.h"
#include "support/expectations.h"

namespace partrain {
namespace {
using testing::check_gradients;
using testing::expect_gradients;
using testing::index_tensor;
using testing::normal_tensor;
using testing::run_forward;
using Ints = std::vector<std::int64_t>;

// 0, 1, 2, ... as an f32 tensor.
Tensor iota_tensor(const Shape& shape) {
  std::vector<float> values(numel(shape));
  std::iota(values.begin(), values.end(), 0.f);
  return Tensor::from_vector<float>(shape, values);
}

Shape infer_one(OpType type, const Attributes& attributes, const std::vector<TensorType>& inputs) {
  return infer_output_types(type, attributes, inputs).at(0).shape;
}

// Runs the backward kernel on the CPU backend for the given output gradients; input grads are
// allocated for the inputs flagged in `wanted`.
std::vector<Tensor> run_backward(OpType type, const Attributes& attributes, const std::vector<Tensor>& inputs,
                                 const std::vector<Tensor>& output_grads, const std::vector<bool>& wanted) {
  const std::vector<Tensor> outputs = run_forward(type, attributes, inputs);
  std::vector<Tensor> input_grads(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i)
    if (wanted[i]) input_grads[i] = Tensor::full(inputs[i].shape(), 12345.0);
  CpuBackend& backend = cpu_backend();
  KernelContext context{attributes, backend};
  backend.backward(type, context, inputs, outputs, output_grads, input_grads);
  return input_grads;
}

// ---------------- Gather ----------------
TEST(ShapeOps, GatherGradientWithRepeatedIndices) {
  for (DType dtype : {DType::I64, DType::I32}) {
    const Tensor weight = normal_tensor({7, 5}, 1);
    Tensor indices = index_tensor({3, 4}, 7, 2, dtype);
    // Force repeats: positions 0, 5 and 11 all look up row 3.
    for (std::int64_t p : {0, 5, 11}) {
      if (dtype == DType::I64) indices.data<std::int64_t>()[p] = 3;
      else indices.data<std::int32_t>()[p] = 3;
    }
    expect_gradients(OpType::Gather, {}, {weight, indices});
  }
}

TEST(ShapeOps, GatherForwardAndScatterAdd) {
  const Tensor weight = Tensor::from_vector<float>({4, 2}, {0, 1, 10, 11, 20, 21, 30, 31});
  const Tensor indices = Tensor::from_vector<std::int32_t>({2, 2}, {2, 0, 2, 3});
  const std::vector<Tensor> y = run_forward(OpType::Gather, {}, {weight, indices});
  EXPECT_EQ(y[0].shape(), (Shape{2, 2, 2}));
  EXPECT_EQ(y[0].to_float_vector(), (std::vector<float>{20, 21, 0, 1, 20, 21, 30, 31}));

  const Tensor dy = Tensor::from_vector<float>({2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  const auto grads = run_backward(OpType::Gather, {}, {weight, indices}, {dy}, {true, false});
  // Row 2 gets positions 0 and 2, row 1 nothing, rows 0 and 3 one position each.
  EXPECT_EQ(grads[0].to_float_vector(), (std::vector<float>{3, 4, 0, 0, 6, 8, 7, 8}));
  EXPECT_FALSE(grads[1].defined());
}

TEST(ShapeOps, GatherBackwardIsRaceFreeOnLargeInputs) {
  // Large enough for the parallel path, every position hitting one of 3 rows.
  const std::int64_t hidden = 256, positions = 512;
  const Tensor weight = normal_tensor({3, hidden}, 3);
  const Tensor indices = index_tensor({positions}, 3, 4);
  const Tensor dy = Tensor::full({positions, hidden}, 1.0);
  const auto grads = run_backward(OpType::Gather, {}, {weight, indices}, {dy}, {true, false});
  std::vector<float> counts(3, 0.f);
  for (std::int64_t p = 0; p < positions; ++p) counts[indices.data<std::int64_t>()[p]] += 1;
  const float* dw = grads[0].data<float>();
  for (std::int64_t v = 0; v < 3; ++v)
    for (std::int64_t h = 0; h < hidden; ++h) ASSERT_EQ(dw[v * hidden + h], counts[v]) << v << ", " << h;
}

TEST(ShapeOps, GatherRejectsOutOfRangeIndices) {
  const Tensor weight = normal_tensor({4, 3}, 5);
  for (std::int64_t bad : {4, -1}) {
    const Tensor indices = Tensor::from_vector<std::int64_t>({2, 2}, {0, 1, bad, 2});
    try {
      run_forward(OpType::Gather, {}, {weight, indices});
      ADD_FAILURE() << "no error for index " << bad;
    } catch (const Error& error) {
      const std::string message = error.message();
      EXPECT_NE(message.find("index " + std::to_string(bad)), std::string::npos) << message;
      EXPECT_NE(message.find("[1, 0]"), std::string::npos) << message;
    }
  }
  // Shape inference: [V, H] weight and integer indices only; a batch of indices stays symbolic.
  EXPECT_EQ(infer_one(OpType::Gather, {}, {{{100, 16}}, {{kBatch, 8}, DType::I64}}), (Shape{kBatch, 8, 16}));
  EXPECT_THROW(infer_one(OpType::Gather, {}, {{{100, 16}}, {{kBatch, 8}, DType::F32}}), Error);
  EXPECT_THROW(infer_one(OpType::Gather, {}, {{{100}}, {{kBatch, 8}, DType::I32}}), Error);
  EXPECT_EQ(op_schema(OpType::Gather).differentiable_inputs, 0b01u);
}

// ---------------- Reshape ----------------
TEST(ShapeOps, ReshapeGradientAndValues) {
  expect_gradients(OpType::Reshape, {{"shape", Ints{0, -1, 2}}}, {normal_tensor({2, 3, 4}, 6)});
  const Tensor x = iota_tensor({2, 6});
  const auto y = run_forward(OpType::Reshape, {{"shape", Ints{0, 3, -1}}}, {x});
  EXPECT_EQ(y[0].shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(y[0].to_float_vector(), x.to_float_vector());
  EXPECT_EQ(run_forward(OpType::Reshape, {{"shape", Ints{-1}}}, {x})[0].shape(), (Shape{12}));
}

TEST(ShapeOps, ReshapeInferenceWithSymbolicBatch) {
  const Shape hidden = infer_one(OpType::Reshape, {{"shape", Ints{0, 0, 12, 64}}}, {{{kBatch, 128, 768}}});
  EXPECT_EQ(hidden, (Shape{kBatch, 128, 12, 64}));
  EXPECT_EQ(infer_one(OpType::Reshape, {{"shape", Ints{0, 0, 768}}}, {{hidden}}), (Shape{kBatch, 128, 768}));
  EXPECT_EQ(infer_one(OpType::Reshape, {{"shape", Ints{0, 0, -1}}}, {{hidden}}), (Shape{kBatch, 128, 768}));
  EXPECT_EQ(infer_one(OpType::Reshape, {{"shape", Ints{0, -1}}}, {{hidden}}), (Shape{kBatch, 128 * 768}));
  // Concrete batch: the same attribute works at run time.
  EXPECT_EQ(infer_one(OpType::Reshape, {{"shape", Ints{0, 0, 12, 64}}}, {{{4, 128, 768}}}), (Shape{4, 128, 12, 64}));
  EXPECT_EQ(infer_one(OpType::Reshape, {{"shape", Ints{-1, 768}}}, {{{4, 128, 768}}}), (Shape{512, 768}));
  // The symbolic batch cannot be merged away or inferred.
  EXPECT_THROW(infer_one(OpType::Reshape, {{"shape", Ints{-1, 768}}}, {{{kBatch, 128, 768}}}), Error);
  EXPECT_THROW(infer_one(OpType::Reshape, {{"shape", Ints{-1, 128, 768}}}, {{{kBatch, 128, 768}}}), Error);
  // Bad counts, two -1, out-of-rank 0, negative entries.
  EXPECT_THROW(infer_one(OpType::Reshape, {{"shape", Ints{0, 0, 12, 60}}}, {{{kBatch, 128, 768}}}), Error);
  EXPECT_THROW(infer_one(OpType::Reshape, {{"shape", Ints{0, 0, 7, -1}}}, {{{kBatch, 128, 768}}}), Error);
  EXPECT_THROW(infer_one(OpType::Reshape, {{"shape", Ints{-1, -1}}}, {{{4, 6}}}), Error);
  EXPECT_THROW(infer_one(OpType::Reshape, {{"shape", Ints{4, 6, 0}}}, {{{4, 6}}}), Error);
  EXPECT_THROW(infer_one(OpType::Reshape, {{"shape", Ints{-2, -12}}}, {{{4, 6}}}), Error);
}

// ---------------- Permute ----------------
TEST(ShapeOps, PermuteGradients) {
  expect_gradients(OpType::Permute, {{"perm", Ints{2, 0, 1}}}, {normal_tensor({2, 3, 4}, 7)});
  expect_gradients(OpType::Permute, {{"perm", Ints{0, 2, 1, 3}}}, {normal_tensor({2, 3, 2, 4}, 8)});
  expect_gradients(OpType::Permute, {{"perm", Ints{3, 1, 0, 2}}}, {normal_tensor({2, 3, 2, 4}, 9)});
}

TEST(ShapeOps, PermuteValuesAndRoundTrip) {
  const Tensor x = iota_tensor({2, 3});
  const auto y = run_forward(OpType::Permute, {{"perm", Ints{1, 0}}}, {x});
  EXPECT_EQ(y[0].shape(), (Shape{3, 2}));
  EXPECT_EQ(y[0].to_float_vector(), (std::vector<float>{0, 3, 1, 4, 2, 5}));

  // [B, S, h, d] -> [B, h, S, d] and back; sizes large enough for the parallel path.
  const Tensor heads = normal_tensor({2, 33, 4, 70}, 10);
  const auto moved = run_forward(OpType::Permute, {{"perm", Ints{0, 2, 1, 3}}}, {heads});
  EXPECT_EQ(moved[0].shape(), (Shape{2, 4, 33, 70}));
  const float* a = heads.data<float>();
  const float* b = moved[0].data<float>();
  EXPECT_EQ(b[((1 * 4 + 3) * 33 + 20) * 70 + 5], a[((1 * 33 + 20) * 4 + 3) * 70 + 5]);
  const auto back = run_forward(OpType::Permute, {{"perm", Ints{0, 2, 1, 3}}}, {moved[0]});
  EXPECT_EQ(back[0].to_float_vector(), heads.to_float_vector());

  // A general permutation (no preserved last axis) and its inverse, with size-1 axes.
  const Tensor x5 = normal_tensor({3, 1, 5, 2, 7}, 11);
  const Ints perm{4, 2, 0, 1, 3}, inverse{2, 3, 1, 4, 0};
  const auto there = run_forward(OpType::Permute, {{"perm", perm}}, {x5});
  EXPECT_EQ(there[0].shape(), (Shape{7, 5, 3, 1, 2}));
  EXPECT_EQ(there[0].data<float>()[(((6 * 5 + 4) * 3 + 2) * 1 + 0) * 2 + 1],
            x5.data<float>()[(((2 * 1 + 0) * 5 + 4) * 2 + 1) * 7 + 6]);
  EXPECT_EQ(run_forward(OpType::Permute, {{"perm", inverse}}, {there[0]})[0].to_float_vector(), x5.to_float_vector());

  // Integer tensors move too (byte copies).
  const Tensor ids = Tensor::from_vector<std::int64_t>({2, 2}, {1, 2, 3, 4});
  EXPECT_EQ(run_forward(OpType::Permute, {{"perm", Ints{1, 0}}}, {ids})[0].to_float_vector(), (std::vector<float>{1, 3, 2, 4}));
}

TEST(ShapeOps, PermuteInference) {
  EXPECT_EQ(infer_one(OpType::Permute, {{"perm", Ints{0, 2, 1, 3}}}, {{{kBatch, 128, 12, 64}}}),
            (Shape{kBatch, 12, 128, 64}));
  EXPECT_EQ(infer_one(OpType::Permute, {{"perm", Ints{1, 0, 2}}}, {{{kBatch, 128, 64}}}), (Shape{128, kBatch, 64}));
  EXPECT_THROW(infer_one(OpType::Permute, {{"perm", Ints{0, 1}}}, {{{kBatch, 128, 64}}}), Error);
  EXPECT_THROW(infer_one(OpType::Permute, {{"perm", Ints{0, 1, 1}}}, {{{kBatch, 128, 64}}}), Error);
  EXPECT_THROW(infer_one(OpType::Permute, {{"perm", Ints{0, 1, 3}}}, {{{kBatch, 128, 64}}}), Error);
  EXPECT_THROW(infer_one(OpType::Permute, {{"perm", Ints{0, -1, 1}}}, {{{kBatch, 128, 64}}}), Error);
  EXPECT_THROW(infer_one(OpType::Permute, {}, {{{kBatch, 128, 64}}}), Error);
}

// ---------------- Slice ----------------
TEST(ShapeOps, SliceGradients) {
  expect_gradients(OpType::Slice, {{"axis", 1}, {"start", -5}, {"end", 6}, {"step", 2}}, {normal_tensor({2, 7, 3}, 12)});
  expect_gradients(OpType::Slice, {{"axis", -1}, {"start", 1}, {"end", -1}}, {normal_tensor({3, 2, 5}, 13)});
}

TEST(ShapeOps, SliceValues) {
  const Tensor x = iota_tensor({2, 5});
  const auto slice = [&](const Attributes& attributes) { return run_forward(OpType::Slice, attributes, {x})[0]; };
  EXPECT_EQ(slice({{"axis", 1}, {"start", -4}, {"end", 5}, {"step", 2}}).to_float_vector(),
            (std::vector<float>{1, 3, 6, 8}));
  EXPECT_EQ(slice({{"axis", 1}, {"start", 1}, {"end", 3}}).to_float_vector(), (std::vector<float>{1, 2, 6, 7}));
  EXPECT_EQ(slice({{"axis", 0}, {"start", 1}, {"end", 100}}).to_float_vector(), (std::vector<float>{5, 6, 7, 8, 9}));
  EXPECT_EQ(slice({{"axis", 1}, {"start", -100}, {"end", -3}}).to_float_vector(), (std::vector<float>{0, 1, 5, 6}));
  EXPECT_EQ(slice({{"axis", 1}, {"start", 4}, {"end", 2}}).shape(), (Shape{2, 0}));
  EXPECT_EQ(slice({{"axis", 1}, {"start", 2}}).to_float_vector(), (std::vector<float>{2, 3, 4, 7, 8, 9}));

  // Backward: zeros with dout scattered in.
  const Attributes attributes{{"axis", 1}, {"start", 0}, {"end", 5}, {"step", 3}};
  const Tensor dy = Tensor::from_vector<float>({2, 2}, {1, 2, 3, 4});
  const auto grads = run_backward(OpType::Slice, attributes, {x}, {dy}, {true});
  EXPECT_EQ(grads[0].to_float_vector(), (std::vector<float>{1, 0, 0, 2, 0, 3, 0, 0, 4, 0}));
}

TEST(ShapeOps, SliceInference) {
  EXPECT_EQ(infer_one(OpType::Slice, {{"axis", 1}, {"start", 0}, {"end", 1}}, {{{kBatch, 128, 768}}}),
            (Shape{kBatch, 1, 768}));
  EXPECT_EQ(infer_one(OpType::Slice, {{"axis", 2}, {"start", -256}, {"end", 768}, {"step", 2}}, {{{kBatch, 128, 768}}}),
            (Shape{kBatch, 128, 128}));
  EXPECT_THROW(infer_one(OpType::Slice, {{"axis", 0}, {"start", 0}, {"end", 1}}, {{{kBatch, 128, 768}}}), Error);
  EXPECT_THROW(infer_one(OpType::Slice, {{"axis", 1}, {"start", 0}, {"end", 1}, {"step", 0}}, {{{kBatch, 128}}}), Error);
  EXPECT_THROW(infer_one(OpType::Slice, {{"axis", 3}, {"start", 0}, {"end", 1}}, {{{kBatch, 128}}}), Error);
}

// ---------------- Concat and Split ----------------
TEST(ShapeOps, ConcatAndSplitGradients) {
  expect_gradients(OpType::Concat, {{"axis", 1}},
                   {normal_tensor({2, 1, 3}, 14), normal_tensor({2, 4, 3}, 15), normal_tensor({2, 2, 3}, 16)});
  expect_gradients(OpType::Split, {{"axis", 1}, {"sizes", Ints{1, 3, 2}}}, {normal_tensor({2, 6, 3}, 17)});
  expect_gradients(OpType::Split, {{"axis", 0}, {"sizes", Ints{2, 0, 1}}}, {normal_tensor({3, 4}, 18)});
}

TEST(ShapeOps, ConcatValuesAndSplitRoundTrip) {
  const Tensor a = Tensor::from_vector<float>({2, 1}, {1, 2});
  const Tensor b = Tensor::from_vector<float>({2, 2}, {3, 4, 5, 6});
  EXPECT_EQ(run_forward(OpType::Concat, {{"axis", 1}}, {a, b})[0].to_float_vector(),
            (std::vector<float>{1, 3, 4, 2, 5, 6}));
  EXPECT_EQ(run_forward(OpType::Concat, {{"axis", -1}}, {b, a})[0].to_float_vector(),
            (std::vector<float>{3, 4, 1, 5, 6, 2}));
  EXPECT_EQ(run_forward(OpType::Concat, {{"axis", 0}}, {b, b})[0].to_float_vector(),
            (std::vector<float>{3, 4, 5, 6, 3, 4, 5, 6}));

  // Split then Concat gives the input back (large enough for the parallel paths).
  for (std::int64_t axis : {0, 1, 2}) {
    const Tensor x = normal_tensor({6, 40, 90}, 19 + axis);
    const Ints sizes = axis == 0 ? Ints{1, 3, 2} : axis == 1 ? Ints{10, 25, 5} : Ints{30, 0, 60};
    const auto parts = run_forward(OpType::Split, {{"axis", axis}, {"sizes", sizes}}, {x});
    ASSERT_EQ(parts.size(), 3u);
    EXPECT_EQ(parts[1].dim(static_cast<int>(axis)), sizes[1]);
    EXPECT_EQ(run_forward(OpType::Concat, {{"axis", axis}}, parts)[0].to_float_vector(), x.to_float_vector());
  }
  const Tensor x = iota_tensor({2, 3});
  const auto parts = run_forward(OpType::Split, {{"axis", 1}, {"sizes", Ints{2, 1}}}, {x});
  EXPECT_EQ(parts[0].to_float_vector(), (std::vector<float>{0, 1, 3, 4}));
  EXPECT_EQ(parts[1].to_float_vector(), (std::vector<float>{2, 5}));
}

TEST(ShapeOps, ConcatBackwardSkipsUndefinedGradients) {
  const Tensor a = Tensor::from_vector<float>({2, 1}, {1, 2});
  const Tensor b = Tensor::from_vector<float>({2, 2}, {3, 4, 5, 6});
  const Tensor dy = Tensor::from_vector<float>({2, 3}, {10, 20, 30, 40, 50, 60});
  const auto grads = run_backward(OpType::Concat, {{"axis", 1}}, {a, b}, {dy}, {false, true});
  EXPECT_FALSE(grads[0].defined());
  EXPECT_EQ(grads[1].to_float_vector(), (std::vector<float>{20, 30, 50, 60}));
}

TEST(ShapeOps, ConcatAndSplitInference) {
  const std::vector<TensorType> inputs{{{kBatch, 128, 64}}, {{kBatch, 128, 32}}, {{kBatch, 128, 32}}};
  EXPECT_EQ(infer_one(OpType::Concat, {{"axis", 2}}, inputs), (Shape{kBatch, 128, 128}));
  EXPECT_EQ(infer_one(OpType::Concat, {{"axis", -1}}, {{{kBatch, 3}}}), (Shape{kBatch, 3}));
  EXPECT_THROW(infer_one(OpType::Concat, {{"axis", 1}}, inputs), Error);  // dimension 2 differs
  EXPECT_THROW(infer_one(OpType::Concat, {{"axis", 0}}, {{{kBatch, 3}}, {{kBatch, 3}}}), Error);
  EXPECT_THROW(infer_one(OpType::Concat, {{"axis", 1}}, {{{kBatch, 3}}, {{4, 3}}}), Error);
  EXPECT_THROW(infer_one(OpType::Concat, {{"axis", 1}}, {{{2, 3}}, {{2, 3, 1}}}), Error);
  EXPECT_THROW(infer_one(OpType::Concat, {{"axis", 1}}, {{{2, 3}}, {{2, 3}, DType::I32}}), Error);
  EXPECT_THROW(infer_output_types(OpType::Concat, {{"axis", 0}}, std::vector<TensorType>{}), Error);

  const auto split = infer_output_types(OpType::Split, {{"axis", 2}, {"sizes", Ints{768, 768, 768}}},
                                        std::vector<TensorType>{{{kBatch, 128, 2304}}});
  ASSERT_EQ(split.size(), 3u);
  for (const TensorType& part : split) EXPECT_EQ(part.shape, (Shape{kBatch, 128, 768}));
  const auto split_types = [](const Attributes& attributes, const Shape& shape) {
    return infer_output_types(OpType::Split, attributes, std::vector<TensorType>{{shape}});
  };
  EXPECT_THROW(split_types({{"axis", 2}, {"sizes", Ints{768, 768}}}, {kBatch, 128, 2304}), Error);
  EXPECT_THROW(split_types({{"axis", 2}, {"sizes", Ints{2000, 500, -196}}}, {kBatch, 128, 2304}), Error);
  EXPECT_THROW(split_types({{"axis", 0}, {"sizes", Ints{1, 1}}}, {kBatch, 128}), Error);
  EXPECT_THROW(split_types({{"axis", 1}}, {kBatch, 128}), Error);
}

TEST(ShapeOps, NoFlops) {
  const std::vector<TensorType> inputs{{{4, 6}}};
  const std::vector<TensorType> outputs{{{24}}};
  for (OpType type : {OpType::Gather, OpType::Reshape, OpType::Permute, OpType::Slice, OpType::Concat, OpType::Split})
    EXPECT_EQ(op_schema(type).flops({}, inputs, outputs), 0.0);
}

}  // namespace
}  // namespace partrain
