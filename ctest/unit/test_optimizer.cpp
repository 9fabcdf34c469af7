// Unit tests of the optimizers (src/runtime/optimizer) against independent double-precision
// references of torch.optim.AdamW / torch.optim.SGD's update equations, the clipping helpers of
// torch.nn.utils.clip_grad_norm_, and the learning-rate schedules (src/runtime/lr_schedule).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "app/planning.h"
#include "io/config.h"
#include "kernels/cpu/cpu_backend.h"
#include "runtime/lr_schedule.h"
#include "runtime/optimizer.h"

using partrain::cpu_backend;

namespace {

using partrain::Tensor;

Tensor tensor_of(const std::vector<float>& values) {
  return Tensor::from_vector<float>({static_cast<std::int64_t>(values.size())}, values);
}

std::vector<double> as_double(const std::vector<float>& values) { return {values.begin(), values.end()}; }

void expect_close(const Tensor& actual, const std::vector<double>& expected, double tolerance, const std::string& what) {
  const std::vector<float> values = actual.to_float_vector();
  ASSERT_EQ(values.size(), expected.size()) << what;
  for (std::size_t k = 0; k < values.size(); ++k)
    EXPECT_NEAR(values[k], expected[k], tolerance * std::max(1.0, std::abs(expected[k]))) << what << "[" << k << "]";
}

/// PyTorch's AdamW for one parameter, in double.
struct AdamWReference {
  double beta1, beta2, eps, weight_decay;
  std::vector<double> p, m, v;
  int t = 0;
  void step(const std::vector<double>& g, double lr) {
    ++t;
    for (std::size_t k = 0; k < p.size(); ++k) {
      p[k] *= 1 - lr * weight_decay;
      m[k] = beta1 * m[k] + (1 - beta1) * g[k];
      v[k] = beta2 * v[k] + (1 - beta2) * g[k] * g[k];
      const double m_hat = m[k] / (1 - std::pow(beta1, t));
      const double v_hat = v[k] / (1 - std::pow(beta2, t));
      p[k] -= lr * m_hat / (std::sqrt(v_hat) + eps);
    }
  }
};

/// PyTorch's SGD (momentum, no dampening, no Nesterov) for one parameter, in double.
struct SgdReference {
  double momentum, weight_decay;
  std::vector<double> p, buffer;
  void step(const std::vector<double>& g, double lr) {
    for (std::size_t k = 0; k < p.size(); ++k) {
      const double d = g[k] + weight_decay * p[k];
      buffer[k] = momentum * buffer[k] + d;  // after the first step (the test sets the first buffer)
      p[k] -= lr * buffer[k];
    }
  }
};

const std::vector<std::vector<float>> kGradients = {
    {0.5f, -1.0f, 2.0f, 0.0f}, {0.25f, 0.75f, -1.5f, 0.1f}, {-0.3f, 0.2f, 0.9f, -2.0f}, {1.0f, 1.0f, 1.0f, 1.0f}};
const std::vector<double> kRates = {1e-2, 5e-3, 2e-2, 1e-3};

TEST(Optimizer, AdamWMatchesPyTorchEquations) {
  const std::vector<float> initial = {1.0f, -0.5f, 0.25f, 2.0f};
  partrain::runtime::AdamW adamw({{"w", tensor_of(initial), true}, {"b", tensor_of(initial), false}}, 0.9, 0.999, 1e-8, 0.1, cpu_backend());
  AdamWReference w{0.9, 0.999, 1e-8, 0.1, as_double(initial), std::vector<double>(4, 0.0), std::vector<double>(4, 0.0)};
  AdamWReference b{0.9, 0.999, 1e-8, 0.0, as_double(initial), std::vector<double>(4, 0.0), std::vector<double>(4, 0.0)};
  for (std::size_t t = 0; t < kGradients.size(); ++t) {
    const std::vector<Tensor> grads = {tensor_of(kGradients[t]), tensor_of(kGradients[(t + 1) % kGradients.size()])};
    adamw.step(grads, kRates[t]);
    w.step(as_double(kGradients[t]), kRates[t]);
    b.step(as_double(kGradients[(t + 1) % kGradients.size()]), kRates[t]);
    expect_close(adamw.parameter(0).value, w.p, 1e-6, "w step " + std::to_string(t));
    expect_close(adamw.parameter(1).value, b.p, 1e-6, "b step " + std::to_string(t));
  }
  expect_close(adamw.state("w", "exp_avg"), w.m, 1e-6, "exp_avg");
  expect_close(adamw.state("w", "exp_avg_sq"), w.v, 1e-6, "exp_avg_sq");
  EXPECT_EQ(adamw.step_count("w"), 4);
  EXPECT_EQ(std::string(adamw.name()), "adamw");
}

// The CPU loops run 16 or 8 lanes wide (kernels/cpu/optimizer_kernels.h) and must round exactly as
// the plain scalar loop below, on a length that is no multiple of a chunk and splits over threads.
TEST(Optimizer, VectorisedUpdatesEqualTheScalarLoopBitForBit) {
  const std::int64_t n = 100003;
  std::vector<float> p(n), g(n), m(n), v(n);
  std::uint32_t state = 12345;
  const auto next = [&] {  // a small LCG: values in [-1, 1)
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / static_cast<float>(1 << 23) - 1.0f;
  };
  for (std::int64_t k = 0; k < n; ++k) {
    p[k] = next();
    g[k] = next();
    m[k] = 0.1f * next();
    v[k] = 1e-3f * std::abs(next());
  }
  const std::vector<float> p0 = p, m0 = m;
  partrain::AdamWUpdate u;
  u.keep = 0.9999f, u.one_minus_beta1 = 0.1f, u.beta2 = 0.999f, u.one_minus_beta2 = 0.001f, u.step_size = 1e-3f;
  u.bias_correction2_sqrt = 0.0316f, u.eps = 1e-8f, u.grad_scale = 0.7f;
  const Tensor P = tensor_of(p), G = tensor_of(g), M = tensor_of(m), V = tensor_of(v);
  cpu_backend().adamw_update(P, G, M, V, u);
  for (std::int64_t k = 0; k < n; ++k) {
    const float gk = g[k] * u.grad_scale;
    p[k] *= u.keep;
    m[k] += u.one_minus_beta1 * (gk - m[k]);
    v[k] = v[k] * u.beta2 + u.one_minus_beta2 * gk * gk;
    const float denom = std::sqrt(v[k]) / u.bias_correction2_sqrt + u.eps;
    p[k] -= u.step_size * m[k] / denom;
  }
  EXPECT_EQ(P.to_float_vector(), p);
  EXPECT_EQ(M.to_float_vector(), m);
  EXPECT_EQ(V.to_float_vector(), v);

  partrain::SgdUpdate s;
  s.decay = 5e-4f, s.rate = 0.05f, s.momentum = 0.9f, s.grad_scale = 0.5f;
  const Tensor Q = tensor_of(p0), B = tensor_of(m0);
  cpu_backend().sgd_update(Q, G, B, s);
  std::vector<float> q = p0, b = m0;
  for (std::int64_t k = 0; k < n; ++k) {
    const float d = g[k] * s.grad_scale + s.decay * q[k];
    b[k] = b[k] * s.momentum + d;
    q[k] -= s.rate * b[k];
  }
  EXPECT_EQ(Q.to_float_vector(), q);
  EXPECT_EQ(B.to_float_vector(), b);

  double sum = 0;
  for (float x : g) sum += static_cast<double>(x) * x;
  const std::vector<Tensor> gradients = {G};
  const std::vector<double> ones = {1.0};
  EXPECT_NEAR(cpu_backend().sum_of_squares(gradients, ones), sum, 1e-12 * sum);
}

TEST(Optimizer, AdamWFirstStepIsSignTimesLr) {
  // Bias correction makes the first update lr · g/(|g| + eps') ≈ lr · sign(g), whatever |g|.
  partrain::runtime::AdamW adamw({{"w", tensor_of({0.0f, 0.0f, 0.0f}), true}}, 0.9, 0.999, 1e-8, 0.0, cpu_backend());
  adamw.step(std::vector<Tensor>{tensor_of({3.0f, -1e-3f, 0.0f})}, 0.1);
  expect_close(adamw.parameter(0).value, {-0.1, 0.1, 0.0}, 1e-5, "first step");
}

TEST(Optimizer, GradScaleEqualsScaledGradients) {
  partrain::runtime::AdamW scaled({{"w", tensor_of({1.0f, 2.0f}), true}}, 0.9, 0.99, 1e-8, 0.01, cpu_backend());
  partrain::runtime::AdamW manual({{"w", tensor_of({1.0f, 2.0f}), true}}, 0.9, 0.99, 1e-8, 0.01, cpu_backend());
  for (int t = 0; t < 3; ++t) {
    const Tensor gradient = tensor_of({0.4f * (t + 1), -0.2f});
    scaled.step(std::vector<Tensor>{gradient}, 1e-2, 0.5);
    manual.step(std::vector<Tensor>{tensor_of({0.2f * (t + 1), -0.1f})}, 1e-2);
    EXPECT_EQ(gradient.to_float_vector(), (std::vector<float>{0.4f * (t + 1), -0.2f}));  // untouched
  }
  expect_close(scaled.parameter(0).value, as_double(manual.parameter(0).value.to_float_vector()), 1e-7, "scaled");
}

TEST(Optimizer, SgdMomentumMatchesPyTorchEquations) {
  const std::vector<float> initial = {1.0f, -0.5f, 0.25f, 2.0f};
  partrain::runtime::Sgd sgd({{"w", tensor_of(initial), true}, {"b", tensor_of(initial), false}}, 0.9, 0.05, cpu_backend());
  SgdReference w{0.9, 0.05, as_double(initial), {}};
  SgdReference b{0.9, 0.0, as_double(initial), {}};
  for (std::size_t t = 0; t < kGradients.size(); ++t) {
    const std::vector<Tensor> grads = {tensor_of(kGradients[t]), tensor_of(kGradients[t])};
    sgd.step(grads, kRates[t]);
    if (w.buffer.empty()) {  // the buffer starts as the first (decayed) gradient
      w.buffer.resize(4);
      b.buffer.resize(4);
      for (int k = 0; k < 4; ++k) {
        w.buffer[k] = kGradients[t][k] + 0.05 * w.p[k];
        b.buffer[k] = kGradients[t][k];
        w.p[k] -= kRates[t] * w.buffer[k];
        b.p[k] -= kRates[t] * b.buffer[k];
      }
    } else {
      w.step(as_double(kGradients[t]), kRates[t]);
      b.step(as_double(kGradients[t]), kRates[t]);
    }
    expect_close(sgd.parameter(0).value, w.p, 1e-6, "w step " + std::to_string(t));
    expect_close(sgd.parameter(1).value, b.p, 1e-6, "b step " + std::to_string(t));
    expect_close(sgd.state("w", "momentum_buffer"), w.buffer, 1e-6, "buffer step " + std::to_string(t));
  }
  EXPECT_EQ(sgd.state_names(), (std::vector<std::string>{"momentum_buffer"}));
}

TEST(Optimizer, SgdWithoutMomentumIsPlainGradientDescent) {
  partrain::runtime::Sgd sgd({{"w", tensor_of({1.0f, -2.0f}), true}}, 0.0, 0.1, cpu_backend());
  sgd.step(std::vector<Tensor>{tensor_of({0.5f, 0.5f})}, 0.1);
  // p − lr (g + wd p) = 1 − 0.1 (0.5 + 0.1), −2 − 0.1 (0.5 − 0.2)
  expect_close(sgd.parameter(0).value, {0.94, -2.03}, 1e-6, "sgd");
  EXPECT_TRUE(sgd.state_names().empty());
  EXPECT_FALSE(sgd.has_state("w"));
}

TEST(Optimizer, UndefinedGradientSkipsTheParameter) {
  partrain::runtime::AdamW adamw({{"a", tensor_of({1.0f}), true}, {"b", tensor_of({1.0f}), true}}, 0.9, 0.999, 1e-8, 0.1, cpu_backend());
  adamw.step(std::vector<Tensor>{tensor_of({1.0f}), Tensor()}, 0.1);
  EXPECT_EQ(adamw.step_count("a"), 1);
  EXPECT_EQ(adamw.step_count("b"), 0);
  EXPECT_FALSE(adamw.has_state("b"));
  EXPECT_EQ(adamw.parameter(1).value.to_float_vector(), (std::vector<float>{1.0f}));  // not even decayed
}

TEST(Optimizer, StateRoundTripsByName) {
  const std::vector<float> initial = {0.5f, -1.0f, 1.5f};
  partrain::runtime::AdamW first({{"layer.weight", tensor_of(initial), true}}, 0.9, 0.999, 1e-8, 0.01, cpu_backend());
  for (int t = 0; t < 2; ++t) first.step(std::vector<Tensor>{tensor_of({0.1f, -0.2f * t, 0.3f})}, 1e-2);
  // A second optimizer restored from the first's parameters and state continues identically.
  partrain::runtime::AdamW second({{"layer.weight", first.parameter(0).value.clone(), true}}, 0.9, 0.999, 1e-8, 0.01, cpu_backend());
  for (const std::string& name : second.state_names())
    second.set_state("layer.weight", name, first.state("layer.weight", name));
  second.set_step_count("layer.weight", first.step_count("layer.weight"));
  const std::vector<Tensor> gradient = {tensor_of({-0.5f, 0.25f, 0.125f})};
  first.step(gradient, 1e-2);
  second.step(gradient, 1e-2);
  EXPECT_EQ(first.parameter(0).value.to_float_vector(), second.parameter(0).value.to_float_vector());
  EXPECT_EQ(first.state("layer.weight", "exp_avg_sq").to_float_vector(),
            second.state("layer.weight", "exp_avg_sq").to_float_vector());
}

TEST(Optimizer, Errors) {
  partrain::runtime::AdamW adamw({{"w", tensor_of({1.0f, 2.0f}), true}}, 0.9, 0.999, 1e-8, 0.0, cpu_backend());
  EXPECT_THROW(adamw.step(std::vector<Tensor>{}, 0.1), partrain::Error);
  EXPECT_THROW(adamw.step(std::vector<Tensor>{tensor_of({1.0f})}, 0.1), partrain::Error);
  EXPECT_THROW(adamw.state("w", "exp_avg"), partrain::Error);  // no state yet
  EXPECT_THROW(adamw.set_state("w", "momentum_buffer", tensor_of({1.0f, 2.0f})), partrain::Error);
  EXPECT_THROW(adamw.set_state("w", "exp_avg", tensor_of({1.0f})), partrain::Error);
  EXPECT_THROW(adamw.step_count("v"), partrain::Error);
  EXPECT_THROW(partrain::runtime::AdamW({{"w", tensor_of({1.0f}), true}, {"w", tensor_of({1.0f}), true}}, 0.9, 0.999, 1e-8,
                               0.0, cpu_backend()),
               partrain::Error);
  EXPECT_THROW(partrain::runtime::AdamW({{"w", tensor_of({1.0f}), true}}, 1.0, 0.999, 1e-8, 0.0, cpu_backend()), partrain::Error);
  EXPECT_THROW(partrain::runtime::Sgd({{"w", tensor_of({1.0f}), true}}, -0.1, 0.0, cpu_backend()), partrain::Error);
  EXPECT_THROW(partrain::runtime::Sgd({{"w", Tensor(), true}}, 0.9, 0.0, cpu_backend()), partrain::Error);
}

TEST(Optimizer, MakeOptimizerByName) {
  const partrain::runtime::OptimizerSettings settings;
  EXPECT_EQ(std::string(partrain::runtime::make_optimizer("sgd", settings, {{"w", tensor_of({1.0f}), true}}, cpu_backend())->name()), "sgd");
  EXPECT_EQ(std::string(partrain::runtime::make_optimizer("adamw", settings, {{"w", tensor_of({1.0f}), true}}, cpu_backend())->name()), "adamw");
  EXPECT_THROW(partrain::runtime::make_optimizer("lamb", settings, {}, cpu_backend()), partrain::Error);
}

TEST(Optimizer, ClippingHelpers) {
  const std::vector<Tensor> grads = {tensor_of({3.0f, 0.0f}), Tensor(), tensor_of({4.0f})};
  EXPECT_DOUBLE_EQ(partrain::runtime::sum_of_squares(grads, cpu_backend()), 25.0);
  EXPECT_DOUBLE_EQ(partrain::runtime::clip_scale(5.0, 1.0), 1.0 / (5.0 + 1e-6));
  EXPECT_DOUBLE_EQ(partrain::runtime::clip_scale(0.5, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(partrain::runtime::clip_scale(1.0, 1.0), 1.0 / (1.0 + 1e-6));  // torch clamps the coefficient only at 1
  EXPECT_DOUBLE_EQ(partrain::runtime::clip_scale(5.0, 0.0), 1.0);                 // clipping off
  EXPECT_TRUE(std::isnan(partrain::runtime::clip_scale(std::nan(""), 1.0)));
}

// ---------------- learning-rate schedules ----------------

using partrain::runtime::LearningRateSchedule;

TEST(LearningRateSchedule, WarmupThenCosine) {
  const double lr = 1e-3, min_lr = 1e-4;
  const LearningRateSchedule schedule(lr, min_lr, 10, 110, LearningRateSchedule::Decay::Cosine);
  EXPECT_DOUBLE_EQ(schedule.at(0), 0.0);
  EXPECT_DOUBLE_EQ(schedule.at(5), lr / 2);
  EXPECT_DOUBLE_EQ(schedule.at(10), lr);                    // warm-up end
  EXPECT_NEAR(schedule.at(60), (lr + min_lr) / 2, 1e-15);   // half-way
  EXPECT_NEAR(schedule.at(35), min_lr + (lr - min_lr) * 0.5 * (1 + std::cos(std::numbers::pi / 4)), 1e-15);
  EXPECT_DOUBLE_EQ(schedule.at(110), min_lr);               // end
  EXPECT_DOUBLE_EQ(schedule.at(500), min_lr);               // past the end
  EXPECT_THROW(schedule.at(-1), partrain::Error);
}

TEST(LearningRateSchedule, LinearAndConstant) {
  const LearningRateSchedule linear(1.0, 0.0, 4, 104, LearningRateSchedule::Decay::Linear);
  EXPECT_DOUBLE_EQ(linear.at(2), 0.5);
  EXPECT_DOUBLE_EQ(linear.at(4), 1.0);
  EXPECT_DOUBLE_EQ(linear.at(29), 0.75);
  EXPECT_DOUBLE_EQ(linear.at(54), 0.5);
  EXPECT_DOUBLE_EQ(linear.at(104), 0.0);
  const LearningRateSchedule constant(2e-4, 0.0, 3, 10, LearningRateSchedule::Decay::Constant);
  EXPECT_DOUBLE_EQ(constant.at(1), 2e-4 / 3);
  EXPECT_DOUBLE_EQ(constant.at(3), 2e-4);
  EXPECT_DOUBLE_EQ(constant.at(1000), 2e-4);
  const LearningRateSchedule no_warmup(1.0, 0.5, 0, 10, LearningRateSchedule::Decay::Linear);
  EXPECT_DOUBLE_EQ(no_warmup.at(0), 1.0);
  EXPECT_DOUBLE_EQ(no_warmup.at(5), 0.75);
}

TEST(LearningRateSchedule, FromTrainConfig) {
  partrain::TrainConfig config;
  config.lr = 6e-4;
  config.min_lr = 6e-5;
  config.warmup_steps = 20;
  config.steps = 220;
  config.lr_schedule = "cosine";
  const LearningRateSchedule schedule = partrain::app::learning_rate_schedule(config);
  EXPECT_DOUBLE_EQ(schedule.at(20), 6e-4);
  EXPECT_NEAR(schedule.at(120), 3.3e-4, 1e-15);
  EXPECT_DOUBLE_EQ(schedule.at(220), 6e-5);
  config.lr_schedule = "step";
  EXPECT_THROW(partrain::app::learning_rate_schedule(config), partrain::Error);
  config.lr_schedule = "linear";
  config.min_lr = 1e-3;  // above lr
  EXPECT_THROW(partrain::app::learning_rate_schedule(config), partrain::Error);
}

}  // namespace
