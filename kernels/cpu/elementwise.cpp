// CPU kernels of the elementwise ops (schemas and semantics: src/graph/ops/elementwise.cpp).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/vector_math.h"

namespace partrain {

namespace {
using cpu::kParallelThreshold;
using cpu::for_each_chunk;

// ---------------- Add, Sub, Mul (broadcasting) ----------------
template <typename Function>
void binary_forward(std::span<const Tensor> inputs, std::span<const Tensor> outputs, Function function) {
  const Tensor& a = inputs[0];
  const Tensor& b = inputs[1];
  const Tensor& y = outputs[0];
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* py = y.data<float>();
  const std::int64_t n = y.numel();
  if (a.shape() == y.shape() && b.shape() == y.shape()) {
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
    for (std::int64_t i = 0; i < n; ++i) py[i] = function(pa[i], pb[i]);
    return;
  }
  // Row by row of the last dimension: the operands' offsets are computed once per row (integer
  // divisions per element dominated the attention-mask Add), then step by 0 or the stride.
  const auto stride_a = kernels::broadcast_strides(a.shape(), y.shape());
  const auto stride_b = kernels::broadcast_strides(b.shape(), y.shape());
  const std::int64_t last = y.rank() > 0 ? y.shape().back() : 1;
  const std::int64_t rows = last > 0 ? n / last : 0;
  const std::int64_t step_a = y.rank() > 0 ? stride_a.back() : 0, step_b = y.rank() > 0 ? stride_b.back() : 0;
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row_a = pa + cpu::broadcast_offset(r * last, y.shape(), stride_a);
    const float* row_b = pb + cpu::broadcast_offset(r * last, y.shape(), stride_b);
    float* out = py + r * last;
    for (std::int64_t j = 0; j < last; ++j) out[j] = function(row_a[j * step_a], row_b[j * step_b]);
  }
}

void add_forward(const KernelContext&, std::span<const Tensor> in, std::span<const Tensor> out) {
  binary_forward(in, out, [](float a, float b) { return a + b; });
}
void sub_forward(const KernelContext&, std::span<const Tensor> in, std::span<const Tensor> out) {
  binary_forward(in, out, [](float a, float b) { return a - b; });
}
void mul_forward(const KernelContext&, std::span<const Tensor> in, std::span<const Tensor> out) {
  binary_forward(in, out, [](float a, float b) { return a * b; });
}

void add_backward(const KernelContext&, std::span<const Tensor>, std::span<const Tensor>,
                  std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  if (input_grads[0].defined()) cpu::reduce_to_broadcast_input(input_grads[0], output_grads[0]);
  if (input_grads[1].defined()) cpu::reduce_to_broadcast_input(input_grads[1], output_grads[0]);
}

void sub_backward(const KernelContext& context, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                  std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  add_backward(context, inputs, outputs, output_grads, input_grads);
  if (input_grads[1].defined()) {
    float* db = input_grads[1].data<float>();
    for (std::int64_t i = 0; i < input_grads[1].numel(); ++i) db[i] = -db[i];
  }
}

// The other operand broadcast to the output shape, as weights for the reduction.
std::vector<float> expanded(const Tensor& operand, const Shape& output_shape) {
  const auto strides = kernels::broadcast_strides(operand.shape(), output_shape);
  const std::int64_t n = numel(output_shape);
  std::vector<float> values(n);
  const float* p = operand.data<float>();
  const std::int64_t last = output_shape.empty() ? 1 : output_shape.back();
  const std::int64_t rows = last > 0 ? n / last : 0;
  const std::int64_t step = output_shape.empty() ? 0 : strides.back();
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* row = p + cpu::broadcast_offset(r * last, output_shape, strides);
    for (std::int64_t j = 0; j < last; ++j) values[r * last + j] = row[j * step];
  }
  return values;
}

void mul_backward(const KernelContext&, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                  std::span<const Tensor> output_grads, std::span<const Tensor> input_grads) {
  const Shape& shape = outputs[0].shape();
  if (input_grads[0].defined())
    cpu::reduce_to_broadcast_input(input_grads[0], output_grads[0], expanded(inputs[1], shape).data());
  if (input_grads[1].defined())
    cpu::reduce_to_broadcast_input(input_grads[1], output_grads[0], expanded(inputs[0], shape).data());
}

// ---------------- unary ops: y = f(x), dx = dy * f'(x, y) ----------------
template <typename Function>
void unary_forward(std::span<const Tensor> inputs, std::span<const Tensor> outputs, Function function) {
  const float* x = inputs[0].data<float>();
  float* y = outputs[0].data<float>();
  const std::int64_t n = outputs[0].numel();
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
  for (std::int64_t i = 0; i < n; ++i) y[i] = function(x[i]);
}

// kReadsInput / kReadsOutput: whether the derivative uses x / y — exactly the op's saved tensors
// (OpSchema::saved_inputs / saved_outputs), the others are shape-only after the forward pass.
template <bool kReadsInput, bool kReadsOutput, typename Derivative>
void unary_backward(std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                    std::span<const Tensor> output_grads, std::span<const Tensor> input_grads, Derivative derivative) {
  if (!input_grads[0].defined()) return;
  const float* x = kReadsInput ? inputs[0].data<float>() : nullptr;
  const float* y = kReadsOutput ? outputs[0].data<float>() : nullptr;
  const float* dy = output_grads[0].data<float>();
  float* dx = input_grads[0].data<float>();
  const std::int64_t n = inputs[0].numel();
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
  for (std::int64_t i = 0; i < n; ++i)
    dx[i] = dy[i] * derivative(kReadsInput ? x[i] : 0.f, kReadsOutput ? y[i] : 0.f);
}

void scale_forward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out) {
  const float value = static_cast<float>(context.attributes.get_float("value"));
  unary_forward(in, out, [value](float x) { return x * value; });
}
void scale_backward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out,
                    std::span<const Tensor> dout, std::span<const Tensor> din) {
  const float value = static_cast<float>(context.attributes.get_float("value"));
  unary_backward<false, false>(in, out, dout, din, [value](float, float) { return value; });
}

void relu_forward(const KernelContext&, std::span<const Tensor> in, std::span<const Tensor> out) {
  unary_forward(in, out, [](float x) { return x > 0 ? x : 0.f; });
}
void relu_backward(const KernelContext&, std::span<const Tensor> in, std::span<const Tensor> out,
                   std::span<const Tensor> dout, std::span<const Tensor> din) {
  unary_backward<true, false>(in, out, dout, din, [](float x, float) { return x > 0 ? 1.f : 0.f; });
}

void tanh_forward(const KernelContext&, std::span<const Tensor> in, std::span<const Tensor> out) {
  unary_forward(in, out, [](float x) { return std::tanh(x); });
}
void tanh_backward(const KernelContext&, std::span<const Tensor> in, std::span<const Tensor> out,
                   std::span<const Tensor> dout, std::span<const Tensor> din) {
  unary_backward<false, true>(in, out, dout, din, [](float, float y) { return 1.f - y * y; });
}

// GELU (Hendrycks & Gimpel 2016): exact x * Phi(x) or the tanh approximation used by GPT-2 / BERT.
// erf, tanh and exp from vector_math.h (absolute error about 1e-7): std::erf / std::tanh per element
// were a fifth of a GPT step.
constexpr float kSqrtTwoOverPi = 0.7978845608028654f;
constexpr float kInverseSqrtTwo = 0.7071067811865476f;
constexpr float kInverseSqrtTwoPi = 0.3989422804014327f;
constexpr float kGeluCubic = 0.044715f;

bool gelu_uses_tanh(const KernelContext& context) { return context.attributes.get_string("approximate", "none") == "tanh"; }

// The GELU loops over [0, n), each compiled per vector width (PARTRAIN_VECTOR_CLONES). OpenMP's
// outlined loop bodies are not cloned, so the threads split the tensor into chunks and each chunk
// calls a cloned function.
PARTRAIN_VECTOR_CLONES void gelu_tanh_forward(const float* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i)
    y[i] = 0.5f * x[i] * (1.f + cpu::tanh_vectorisable(kSqrtTwoOverPi * (x[i] + kGeluCubic * x[i] * x[i] * x[i])));
}
PARTRAIN_VECTOR_CLONES void gelu_erf_forward(const float* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = 0.5f * x[i] * (1.f + cpu::erf_vectorisable(x[i] * kInverseSqrtTwo));
}
PARTRAIN_VECTOR_CLONES void gelu_tanh_backward(const float* x, const float* dy, float* dx, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float t = cpu::tanh_vectorisable(kSqrtTwoOverPi * (x[i] + kGeluCubic * x[i] * x[i] * x[i]));
    dx[i] = dy[i] * (0.5f * (1.f + t) +
                     0.5f * x[i] * (1.f - t * t) * kSqrtTwoOverPi * (1.f + 3.f * kGeluCubic * x[i] * x[i]));
  }
}
PARTRAIN_VECTOR_CLONES void gelu_erf_backward(const float* x, const float* dy, float* dx, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i)
    dx[i] = dy[i] * (0.5f * (1.f + cpu::erf_vectorisable(x[i] * kInverseSqrtTwo)) +
                     x[i] * kInverseSqrtTwoPi * cpu::exp_vectorisable(-0.5f * x[i] * x[i]));
}

void gelu_forward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out) {
  const float* x = in[0].data<float>();
  float* y = out[0].data<float>();
  const bool tanh = gelu_uses_tanh(context);
  for_each_chunk(out[0].numel(), [&](std::int64_t first, std::int64_t count) {
    (tanh ? gelu_tanh_forward : gelu_erf_forward)(x + first, y + first, count);
  });
}
void gelu_backward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor>,
                   std::span<const Tensor> dout, std::span<const Tensor> din) {
  if (!din[0].defined()) return;
  const float* x = in[0].data<float>();
  const float* dy = dout[0].data<float>();
  float* dx = din[0].data<float>();
  const bool tanh = gelu_uses_tanh(context);
  for_each_chunk(in[0].numel(), [&](std::int64_t first, std::int64_t count) {
    (tanh ? gelu_tanh_backward : gelu_erf_backward)(x + first, dy + first, dx + first, count);
  });
}

// ---------------- Dropout (counter-based masks, regenerated in backward) ----------------
// Element i of the tensor belongs to sample i / per_sample (dimension 0 is the batch).
// One Philox evaluation of core/rng.h random_uniform(context, sample, element)'s counter and key
// serves the four elements element & ~3 ... element | 3 (random_uniform makes one per element);
// test_ops_elementwise checks the masks against random_uniform.

// The Philox words of the groups of four [first_group, first_group + groups) of one sample, stored
// as the elements' words in element order: words[4 k + j] is element 4 (first_group + k) + j's.
// A loop over independent groups, so the compiler evaluates 8 or 16 Philox counters at once.
PARTRAIN_VECTOR_CLONES void dropout_group_words(const RandomContext& context, std::uint32_t sample,
                                                std::uint64_t first_group, std::int64_t groups,
                                                std::uint32_t* words) {
  for (std::int64_t k = 0; k < groups; ++k) {
    const std::uint64_t group = first_group + static_cast<std::uint64_t>(k);
    const PhiloxKey key = {std::uint32_t(context.seed) ^ context.stream,
                           std::uint32_t(context.seed >> 32) ^ (std::uint32_t(group >> 32) * 0x9E3779B9u)};
    const PhiloxCounter counter =
        philox4x32({context.step, context.microbatch, context.first_sample + sample, std::uint32_t(group)}, key);
    for (int j = 0; j < 4; ++j) words[4 * k + j] = counter[j];
  }
}

// scales[j] = 1 / (1 - p) where element j's word keeps it, else 0.
PARTRAIN_VECTOR_CLONES void dropout_scales_from_words(const std::uint32_t* words, std::int64_t count, float p,
                                                      float keep_scale, float* scales) {
  for (std::int64_t j = 0; j < count; ++j) scales[j] = uniform_from_word(words[j]) >= p ? keep_scale : 0.f;
}

// Calls apply(first, count, scales) for consecutive runs of the tensor's elements, scales[j] being
// element first + j's dropout scale (0 or 1 / (1 - p)).
template <typename Apply>
void for_each_dropout_scale(const KernelContext& context, const Tensor& x, Apply apply) {
  const float p = static_cast<float>(context.attributes.get_float("p"));
  const std::int64_t n = x.numel();
  const std::int64_t per_sample = x.rank() > 0 && x.dim(0) > 0 ? n / x.dim(0) : n;
  const float keep_scale = 1.f / (1.f - p);
  const std::uint64_t first_element = kernels::dropout_first_element(context, per_sample);
  constexpr std::int64_t kBlock = 4096;  // elements per loop iteration (a multiple of 4)
  const std::int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel if (n > kParallelThreshold)
  {
    std::vector<std::uint32_t> words(kBlock + 8);  // a run's groups can start up to 3 elements early
    std::vector<float> scales(kBlock + 8);
#pragma omp for schedule(static)
    for (std::int64_t block = 0; block < blocks; ++block) {
      const std::int64_t end = std::min(n, (block + 1) * kBlock);
      for (std::int64_t i = block * kBlock; i < end;) {  // runs inside one sample
        const auto sample = static_cast<std::uint32_t>(i / per_sample);
        const std::int64_t run = std::min(end, (static_cast<std::int64_t>(sample) + 1) * per_sample) - i;
        const std::uint64_t element = first_element + static_cast<std::uint64_t>(i % per_sample);
        const std::uint64_t first_group = element >> 2, last_group = (element + run - 1) >> 2;
        const auto skip = static_cast<std::int64_t>(element & 3);  // words of the first group's earlier elements
        dropout_group_words(context.random, sample, first_group, static_cast<std::int64_t>(last_group - first_group + 1),
                            words.data());
        dropout_scales_from_words(words.data() + skip, run, p, keep_scale, scales.data());
        apply(i, run, scales.data());
        i += run;
      }
    }
  }
}

void dropout_forward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out) {
  const float* x = in[0].data<float>();
  float* y = out[0].data<float>();
  if (!context.training || context.attributes.get_float("p") == 0) {
    std::copy(x, x + in[0].numel(), y);
    return;
  }
  for_each_dropout_scale(context, in[0], [&](std::int64_t first, std::int64_t count, const float* scales) {
    for (std::int64_t j = 0; j < count; ++j) y[first + j] = x[first + j] * scales[j];
  });
}
void dropout_backward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor>,
                      std::span<const Tensor> dout, std::span<const Tensor> din) {
  if (!din[0].defined()) return;
  const float* dy = dout[0].data<float>();
  float* dx = din[0].data<float>();
  if (!context.training || context.attributes.get_float("p") == 0) {
    std::copy(dy, dy + in[0].numel(), dx);
    return;
  }
  for_each_dropout_scale(context, in[0], [&](std::int64_t first, std::int64_t count, const float* scales) {
    for (std::int64_t j = 0; j < count; ++j) dx[first + j] = dy[first + j] * scales[j];
  });
}
}  // namespace

void register_cpu_elementwise_kernels(Backend& backend) {
  backend.set_kernels(OpType::Add, {add_forward, add_backward});
  backend.set_kernels(OpType::Sub, {sub_forward, sub_backward});
  backend.set_kernels(OpType::Mul, {mul_forward, mul_backward});
  backend.set_kernels(OpType::Scale, {scale_forward, scale_backward});
  backend.set_kernels(OpType::Relu, {relu_forward, relu_backward});
  backend.set_kernels(OpType::Tanh, {tanh_forward, tanh_backward});
  backend.set_kernels(OpType::Gelu, {gelu_forward, gelu_backward});
  backend.set_kernels(OpType::Dropout, {dropout_forward, dropout_backward});
}

}  // namespace partrain
