// CPU kernels of the elementwise ops (schemas and semantics: src/graph/ops/elementwise.cpp).
#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"
#include "kernels/cpu/vector_math.h"

namespace partrain {

namespace {
using cpu::kParallelThreshold;

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

void gelu_forward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out) {
  if (gelu_uses_tanh(context))
    unary_forward(in, out, [](float x) {
      return 0.5f * x * (1.f + cpu::tanh_vectorisable(kSqrtTwoOverPi * (x + kGeluCubic * x * x * x)));
    });
  else
    unary_forward(in, out, [](float x) { return 0.5f * x * (1.f + cpu::erf_vectorisable(x * kInverseSqrtTwo)); });
}
void gelu_backward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out,
                   std::span<const Tensor> dout, std::span<const Tensor> din) {
  if (gelu_uses_tanh(context))
    unary_backward<true, false>(in, out, dout, din, [](float x, float) {
      const float t = cpu::tanh_vectorisable(kSqrtTwoOverPi * (x + kGeluCubic * x * x * x));
      return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * kSqrtTwoOverPi * (1.f + 3.f * kGeluCubic * x * x);
    });
  else
    unary_backward<true, false>(in, out, dout, din, [](float x, float) {
      return 0.5f * (1.f + cpu::erf_vectorisable(x * kInverseSqrtTwo)) + x * kInverseSqrtTwoPi * cpu::exp_vectorisable(-0.5f * x * x);
    });
}

// ---------------- Dropout (counter-based masks, regenerated in backward) ----------------
// Element i of the tensor belongs to sample i / per_sample (dimension 0 is the batch).
// The four Philox words of core/rng.h random_uniform(context, sample, element) for the elements
// element & ~3 ... element | 3: one Philox evaluation serves four elements (random_uniform makes one
// per element). Counter and key exactly as random_uniform's (test_ops_elementwise checks the masks).
PhiloxCounter dropout_words(const RandomContext& context, std::uint32_t sample, std::uint64_t element) {
  const PhiloxKey key = {std::uint32_t(context.seed) ^ context.stream,
                         std::uint32_t(context.seed >> 32) ^ (std::uint32_t(element >> 34) * 0x9E3779B9u)};
  return philox4x32({context.step, context.microbatch, context.first_sample + sample, std::uint32_t(element >> 2)},
                    key);
}

template <typename Apply>
void for_each_dropout_scale(const KernelContext& context, const Tensor& x, Apply apply) {
  const float p = static_cast<float>(context.attributes.get_float("p"));
  const std::int64_t n = x.numel();
  const std::int64_t per_sample = x.rank() > 0 && x.dim(0) > 0 ? n / x.dim(0) : n;
  const float keep_scale = 1.f / (1.f - p);
  const std::uint64_t first_element = kernels::dropout_first_element(context, per_sample);
  constexpr std::int64_t kBlock = 4096;  // elements per loop iteration (a multiple of 4)
  const std::int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n > kParallelThreshold)
  for (std::int64_t block = 0; block < blocks; ++block) {
    const std::int64_t end = std::min(n, (block + 1) * kBlock);
    std::int64_t i = block * kBlock;
    auto sample = static_cast<std::uint32_t>(i / per_sample);
    std::int64_t in_sample = i % per_sample;
    PhiloxCounter words{};
    bool fresh = false;  // words hold the current element's group of four
    for (; i < end; ++i) {
      const std::uint64_t element = first_element + static_cast<std::uint64_t>(in_sample);
      if (!fresh || (element & 3) == 0) words = dropout_words(context.random, sample, element);
      fresh = true;
      apply(i, uniform_from_word(words[element & 3]) >= p ? keep_scale : 0.f);
      if (++in_sample == per_sample) {  // the next sample: a new counter
        in_sample = 0;
        ++sample;
        fresh = false;
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
  for_each_dropout_scale(context, in[0], [&](std::int64_t i, float scale) { y[i] = x[i] * scale; });
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
  for_each_dropout_scale(context, in[0], [&](std::int64_t i, float scale) { dx[i] = dy[i] * scale; });
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
