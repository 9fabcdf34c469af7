#include "runtime/optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "io/config.h"

namespace partrain {

namespace {
void check_host_f32(const Tensor& tensor, const std::string& what) {
  PARTRAIN_CHECK(tensor.defined(), what << " is undefined");
  PARTRAIN_CHECK(tensor.dtype() == DType::F32, what << " has dtype " << dtype_name(tensor.dtype()) << ", not f32");
  PARTRAIN_CHECK(tensor.device().is_cpu(), what << " is on " << tensor.device().to_string() << ", not the host");
}
}  // namespace

// ---------------- Optimizer ----------------

Optimizer::Optimizer(std::vector<OptimizerParameter> parameters) : parameters_(std::move(parameters)) {
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const OptimizerParameter& p = parameters_[i];
    check_host_f32(p.value, "optimizer: parameter '" + p.name + "'");
    PARTRAIN_CHECK(index_.emplace(p.name, i).second, "optimizer: parameter '" << p.name << "' is given twice");
  }
  state_.resize(parameters_.size());
  steps_.assign(parameters_.size(), 0);
}

std::size_t Optimizer::index_of(const std::string& parameter_name) const {
  auto it = index_.find(parameter_name);
  PARTRAIN_CHECK(it != index_.end(), "optimizer: no parameter '" << parameter_name << "'");
  return it->second;
}

std::int64_t Optimizer::step_count(const std::string& parameter_name) const {
  return steps_[index_of(parameter_name)];
}

void Optimizer::set_step_count(const std::string& parameter_name, std::int64_t steps) {
  PARTRAIN_CHECK(steps >= 0, "optimizer: negative step count " << steps << " for '" << parameter_name << "'");
  steps_[index_of(parameter_name)] = steps;
}

bool Optimizer::has_state(const std::string& parameter_name) const {
  return !state_[index_of(parameter_name)].empty();
}

std::size_t Optimizer::state_index(const std::string& state_name) const {
  const std::vector<std::string> names = state_names();
  auto it = std::find(names.begin(), names.end(), state_name);
  PARTRAIN_CHECK(it != names.end(), "optimizer " << name() << ": no state '" << state_name << "'");
  return static_cast<std::size_t>(it - names.begin());
}

std::vector<Tensor> Optimizer::make_state(std::size_t index) const {
  std::vector<Tensor> state;
  for (std::size_t k = 0; k < state_names().size(); ++k)
    state.push_back(Tensor::zeros(parameters_[index].value.shape()));
  return state;
}

Tensor Optimizer::state(const std::string& parameter_name, const std::string& state_name) const {
  const std::size_t i = index_of(parameter_name);
  const std::size_t k = state_index(state_name);
  PARTRAIN_CHECK(!state_[i].empty(), "optimizer: parameter '" << parameter_name << "' has no state yet");
  return state_[i][k];
}

void Optimizer::set_state(const std::string& parameter_name, const std::string& state_name, const Tensor& value) {
  const std::size_t i = index_of(parameter_name);
  const std::size_t k = state_index(state_name);
  check_host_f32(value, "optimizer: state '" + state_name + "' of '" + parameter_name + "'");
  PARTRAIN_CHECK(value.shape() == parameters_[i].value.shape(),
                 "optimizer: state '" << state_name << "' of '" << parameter_name << "' has shape "
                                      << shape_string(value.shape()) << ", the parameter "
                                      << shape_string(parameters_[i].value.shape()));
  if (state_[i].empty()) state_[i] = make_state(i);
  std::copy(value.data<float>(), value.data<float>() + value.numel(), state_[i][k].data<float>());
}

void Optimizer::step(std::span<const Tensor> gradients, double lr, double grad_scale) {
  PARTRAIN_CHECK(gradients.size() == parameters_.size(),
                 "optimizer: " << gradients.size() << " gradients for " << parameters_.size() << " parameters");
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const Tensor& gradient = gradients[i];
    if (!gradient.defined()) continue;
    const OptimizerParameter& p = parameters_[i];
    check_host_f32(gradient, "optimizer: gradient of '" + p.name + "'");
    PARTRAIN_CHECK(gradient.shape() == p.value.shape(), "optimizer: gradient of '"
                                                            << p.name << "' has shape " << shape_string(gradient.shape())
                                                            << ", the parameter " << shape_string(p.value.shape()));
    // The state exists once the parameter was updated (or restored): PyTorch's lazy state init.
    const bool created = state_[i].empty();
    if (state_[i].empty()) state_[i] = make_state(i);
    ++steps_[i];
    update(i, gradient.data<float>(), static_cast<float>(grad_scale), state_[i], created, steps_[i], lr);
  }
}

// ---------------- AdamW ----------------

AdamW::AdamW(std::vector<OptimizerParameter> parameters, double beta1, double beta2, double eps, double weight_decay)
    : Optimizer(std::move(parameters)), beta1_(beta1), beta2_(beta2), eps_(eps), weight_decay_(weight_decay) {
  PARTRAIN_CHECK(beta1 >= 0 && beta1 < 1, "adamw: beta1 " << beta1 << " is outside [0, 1)");
  PARTRAIN_CHECK(beta2 >= 0 && beta2 < 1, "adamw: beta2 " << beta2 << " is outside [0, 1)");
  PARTRAIN_CHECK(eps >= 0, "adamw: negative eps " << eps);
  PARTRAIN_CHECK(weight_decay >= 0, "adamw: negative weight decay " << weight_decay);
}

void AdamW::update(std::size_t index, const float* gradient, float grad_scale, std::vector<Tensor>& state,
                   bool /*created*/, std::int64_t step, double lr) {
  const OptimizerParameter& p = parameter(index);
  float* value = p.value.data<float>();
  float* exp_avg = state[0].data<float>();
  float* exp_avg_sq = state[1].data<float>();
  const std::int64_t n = p.value.numel();
  const double decay = p.weight_decay ? weight_decay_ : 0.0;
  const float keep = static_cast<float>(1.0 - lr * decay);
  const float one_minus_beta1 = static_cast<float>(1.0 - beta1_);
  const float beta2 = static_cast<float>(beta2_), one_minus_beta2 = static_cast<float>(1.0 - beta2_);
  const double bias_correction1 = 1.0 - std::pow(beta1_, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(beta2_, static_cast<double>(step));
  const float step_size = static_cast<float>(lr / bias_correction1);
  const float bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  const float eps = static_cast<float>(eps_);
#pragma omp parallel for schedule(static) if (n >= 32768)
  for (std::int64_t k = 0; k < n; ++k) {
    const float g = gradient[k] * grad_scale;
    value[k] *= keep;
    exp_avg[k] += one_minus_beta1 * (g - exp_avg[k]);  // torch lerp_(grad, 1 - beta1)
    exp_avg_sq[k] = exp_avg_sq[k] * beta2 + one_minus_beta2 * g * g;
    const float denom = std::sqrt(exp_avg_sq[k]) / bias_correction2_sqrt + eps;
    value[k] -= step_size * exp_avg[k] / denom;
  }
}

// ---------------- SGD ----------------

Sgd::Sgd(std::vector<OptimizerParameter> parameters, double momentum, double weight_decay)
    : Optimizer(std::move(parameters)), momentum_(momentum), weight_decay_(weight_decay) {
  PARTRAIN_CHECK(momentum >= 0, "sgd: negative momentum " << momentum);
  PARTRAIN_CHECK(weight_decay >= 0, "sgd: negative weight decay " << weight_decay);
}

std::vector<std::string> Sgd::state_names() const {
  if (momentum_ == 0) return {};
  return {"momentum_buffer"};
}

void Sgd::update(std::size_t index, const float* gradient, float grad_scale, std::vector<Tensor>& state,
                 bool created, std::int64_t /*step*/, double lr) {
  const OptimizerParameter& p = parameter(index);
  float* value = p.value.data<float>();
  const std::int64_t n = p.value.numel();
  const float decay = static_cast<float>(p.weight_decay ? weight_decay_ : 0.0);
  const float rate = static_cast<float>(lr);
  const float momentum = static_cast<float>(momentum_);
  float* buffer = state.empty() ? nullptr : state[0].data<float>();
#pragma omp parallel for schedule(static) if (n >= 32768)
  for (std::int64_t k = 0; k < n; ++k) {
    float d = gradient[k] * grad_scale;
    if (decay != 0.0f) d += decay * value[k];
    if (buffer) {
      buffer[k] = created ? d : buffer[k] * momentum + d;
      d = buffer[k];
    }
    value[k] -= rate * d;
  }
}

// ---------------- helpers ----------------

std::unique_ptr<Optimizer> make_optimizer(const TrainConfig& config, std::vector<OptimizerParameter> parameters) {
  if (config.optimizer == "adamw")
    return std::make_unique<AdamW>(std::move(parameters), config.beta1, config.beta2, config.eps, config.weight_decay);
  if (config.optimizer == "sgd")
    return std::make_unique<Sgd>(std::move(parameters), config.momentum, config.weight_decay);
  PARTRAIN_FAIL("optimizer '" << config.optimizer << "' is unknown (adamw, sgd)");
}

double sum_of_squares(std::span<const Tensor> gradients) {
  double total = 0;
  for (const Tensor& gradient : gradients) {
    if (!gradient.defined()) continue;
    check_host_f32(gradient, "sum_of_squares: a gradient");
    const float* data = gradient.data<float>();
    const std::int64_t n = gradient.numel();
    double sum = 0;
#pragma omp parallel for reduction(+ : sum) schedule(static) if (n >= 32768)
    for (std::int64_t k = 0; k < n; ++k) sum += static_cast<double>(data[k]) * data[k];
    total += sum;
  }
  return total;
}

double clip_scale(double global_norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const double coefficient = max_norm / (global_norm + 1e-6);
  return std::isnan(coefficient) || coefficient < 1.0 ? coefficient : 1.0;  // torch.clamp(coef, max=1)
}

}  // namespace partrain
