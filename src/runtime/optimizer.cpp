#include "runtime/optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace partrain::runtime {

namespace {
void check_f32_on(const Tensor& tensor, Device device, const std::string& what) {
  PARTRAIN_CHECK(tensor.defined(), what << " is undefined");
  PARTRAIN_CHECK(tensor.dtype() == DType::F32, what << " has dtype " << dtype_name(tensor.dtype()) << ", not f32");
  PARTRAIN_CHECK(tensor.device() == device, what << " is on " << tensor.device().to_string() << ", not "
                                                  << device.to_string());
}
}  // namespace

// ---------------- Optimizer ----------------

Optimizer::Optimizer(std::vector<OptimizerParameter> parameters, Backend& backend)
    : backend_(backend), parameters_(std::move(parameters)) {
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const OptimizerParameter& p = parameters_[i];
    check_f32_on(p.value, backend_.device(), "optimizer: parameter '" + p.name + "'");
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
    state.push_back(backend_.zeros(parameters_[index].value.shape()));
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
  PARTRAIN_CHECK(value.defined() && value.dtype() == DType::F32,
                 "optimizer: state '" << state_name << "' of '" << parameter_name << "' must be a defined f32 tensor");
  PARTRAIN_CHECK(value.shape() == parameters_[i].value.shape(),
                 "optimizer: state '" << state_name << "' of '" << parameter_name << "' has shape "
                                      << shape_string(value.shape()) << ", the parameter "
                                      << shape_string(parameters_[i].value.shape()));
  if (state_[i].empty()) state_[i] = make_state(i);
  backend_.copy(state_[i][k], value);
}

void Optimizer::step(std::span<const Tensor> gradients, double lr, double grad_scale) {
  PARTRAIN_CHECK(gradients.size() == parameters_.size(),
                 "optimizer: " << gradients.size() << " gradients for " << parameters_.size() << " parameters");
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const Tensor& gradient = gradients[i];
    if (!gradient.defined()) continue;
    const OptimizerParameter& p = parameters_[i];
    check_f32_on(gradient, backend_.device(), "optimizer: gradient of '" + p.name + "'");
    PARTRAIN_CHECK(gradient.shape() == p.value.shape(), "optimizer: gradient of '"
                                                            << p.name << "' has shape " << shape_string(gradient.shape())
                                                            << ", the parameter " << shape_string(p.value.shape()));
    // The state exists once the parameter was updated (or restored): PyTorch's lazy state init.
    const bool created = state_[i].empty();
    if (state_[i].empty()) state_[i] = make_state(i);
    ++steps_[i];
    update(i, gradient, static_cast<float>(grad_scale), state_[i], created, steps_[i], lr);
  }
}

// ---------------- AdamW ----------------

AdamW::AdamW(std::vector<OptimizerParameter> parameters, double beta1, double beta2, double eps, double weight_decay,
             Backend& backend)
    : Optimizer(std::move(parameters), backend), beta1_(beta1), beta2_(beta2), eps_(eps), weight_decay_(weight_decay) {
  PARTRAIN_CHECK(beta1 >= 0 && beta1 < 1, "adamw: beta1 " << beta1 << " is outside [0, 1)");
  PARTRAIN_CHECK(beta2 >= 0 && beta2 < 1, "adamw: beta2 " << beta2 << " is outside [0, 1)");
  PARTRAIN_CHECK(eps >= 0, "adamw: negative eps " << eps);
  PARTRAIN_CHECK(weight_decay >= 0, "adamw: negative weight decay " << weight_decay);
}

void AdamW::update(std::size_t index, const Tensor& gradient, float grad_scale, std::vector<Tensor>& state,
                   bool /*created*/, std::int64_t step, double lr) {
  const OptimizerParameter& p = parameter(index);
  const double decay = p.weight_decay ? weight_decay_ : 0.0;
  AdamWUpdate update;
  update.keep = static_cast<float>(1.0 - lr * decay);
  update.one_minus_beta1 = static_cast<float>(1.0 - beta1_);
  update.beta2 = static_cast<float>(beta2_);
  update.one_minus_beta2 = static_cast<float>(1.0 - beta2_);
  update.step_size = static_cast<float>(lr / (1.0 - std::pow(beta1_, static_cast<double>(step))));
  update.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(beta2_, static_cast<double>(step))));
  update.eps = static_cast<float>(eps_);
  update.grad_scale = grad_scale;
  backend().adamw_update(p.value, gradient, state[0], state[1], update);
}

// ---------------- SGD ----------------

Sgd::Sgd(std::vector<OptimizerParameter> parameters, double momentum, double weight_decay, Backend& backend)
    : Optimizer(std::move(parameters), backend), momentum_(momentum), weight_decay_(weight_decay) {
  PARTRAIN_CHECK(momentum >= 0, "sgd: negative momentum " << momentum);
  PARTRAIN_CHECK(weight_decay >= 0, "sgd: negative weight decay " << weight_decay);
}

std::vector<std::string> Sgd::state_names() const {
  if (momentum_ == 0) return {};
  return {"momentum_buffer"};
}

void Sgd::update(std::size_t index, const Tensor& gradient, float grad_scale, std::vector<Tensor>& state,
                 bool created, std::int64_t /*step*/, double lr) {
  const OptimizerParameter& p = parameter(index);
  SgdUpdate update;
  update.decay = static_cast<float>(p.weight_decay ? weight_decay_ : 0.0);
  update.rate = static_cast<float>(lr);
  update.momentum = static_cast<float>(momentum_);
  update.grad_scale = grad_scale;
  update.first = created;
  backend().sgd_update(p.value, gradient, state.empty() ? Tensor() : state[0], update);
}

// ---------------- helpers ----------------

std::unique_ptr<Optimizer> make_optimizer(const std::string& kind, const OptimizerSettings& settings,
                                          std::vector<OptimizerParameter> parameters, Backend& backend) {
  if (kind == "adamw")
    return std::make_unique<AdamW>(std::move(parameters), settings.beta1, settings.beta2, settings.eps,
                                   settings.weight_decay, backend);
  if (kind == "sgd") return std::make_unique<Sgd>(std::move(parameters), settings.momentum, settings.weight_decay, backend);
  PARTRAIN_FAIL("optimizer '" << kind << "' is unknown (adamw, sgd)");
}

double sum_of_squares(std::span<const Tensor> gradients, Backend& backend) {
  const std::vector<double> ones(gradients.size(), 1.0);
  return backend.sum_of_squares(gradients, ones);
}

double clip_scale(double global_norm, double max_norm) {
  if (max_norm <= 0) return 1.0;
  const double coefficient = max_norm / (global_norm + 1e-6);
  return std::isnan(coefficient) || coefficient < 1.0 ? coefficient : 1.0;  // torch.clamp(coef, max=1)
}

}  // namespace partrain::runtime
