#pragma once
// Optimizers over f32 tensors on one backend (docs/architecture.md §Runtime): AdamW and SGD with
// momentum, with the update equations of torch.optim.AdamW and torch.optim.SGD, plus the clipping
// helpers of torch.nn.utils.clip_grad_norm_. Each rank's optimizer holds only its stage's parameters;
// the state is reachable by parameter name for checkpoints (/optim/<param name>/{exp_avg,exp_avg_sq}).
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/tensor.h"

namespace partrain::runtime {


/// A parameter the optimizer updates in place.
struct OptimizerParameter {
  std::string name;        // the model's parameter name (unique within the optimizer)
  Tensor value;            // f32 tensor on the optimizer's backend, updated in place by step()
  bool weight_decay = true;  // false: no weight decay for this parameter (biases, LayerNorm)
};

/// The interface of AdamW and SGD. State is created lazily on a parameter's first update, as in
/// PyTorch; a parameter with an undefined gradient is skipped (its state and step count unchanged).
class Optimizer {
 public:
  /// The updates run on `backend` (kernels/<backend> adamw_update / sgd_update), where every
  /// parameter, gradient and state tensor lives. Throws partrain::Error for an undefined or non-f32
  /// parameter, one on another device, or a repeated name.
  explicit Optimizer(std::vector<OptimizerParameter> parameters, Backend& backend);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// One update with learning rate `lr`. gradients[i] belongs to parameter i (same shape, f32 on the
  /// backend's device, or undefined: skipped). Every gradient element is multiplied by `grad_scale` first (gradient
  /// clipping's clip_scale, or 1/loss scale); the gradient tensors are not modified. Throws
  /// partrain::Error on a count or shape mismatch.
  void step(std::span<const Tensor> gradients, double lr, double grad_scale = 1.0);

  /// "adamw" or "sgd".
  virtual const char* name() const = 0;
  /// Names of the per-parameter state tensors: {"exp_avg", "exp_avg_sq"} or {"momentum_buffer"}.
  virtual std::vector<std::string> state_names() const = 0;

  /// Number of parameters, and parameter `index` (in construction order; throws std::out_of_range).
  std::size_t size() const { return parameters_.size(); }
  const OptimizerParameter& parameter(std::size_t index) const { return parameters_.at(index); }
  /// Index of the named parameter; throws partrain::Error for an unknown name.
  std::size_t index_of(const std::string& parameter_name) const;

  /// Updates applied to the parameter so far (PyTorch's per-parameter state['step']).
  std::int64_t step_count(const std::string& parameter_name) const;
  /// Restores the step count (checkpoints); throws partrain::Error for a negative count or unknown name.
  void set_step_count(const std::string& parameter_name, std::int64_t steps);
  /// True once the parameter has state (after its first update or set_state).
  bool has_state(const std::string& parameter_name) const;
  /// The state tensor (shared storage: writes go to the optimizer). Throws partrain::Error for an
  /// unknown parameter or state name, or a parameter without state yet.
  Tensor state(const std::string& parameter_name, const std::string& state_name) const;
  /// Copies `value` (same shape as the parameter, f32, on the host or the backend's device) into the named state, creating the
  /// parameter's state (zeros elsewhere) if needed. Throws partrain::Error on unknown names or shape.
  void set_state(const std::string& parameter_name, const std::string& state_name, const Tensor& value);

 protected:
  /// Applies one update to parameter `index`; `state` holds its tensors in state_names() order,
  /// `created` is true when they were just made (zeros) by this step, `step` is the step count after
  /// incrementing (1 on the first update).
  virtual void update(std::size_t index, const Tensor& gradient, float grad_scale, std::vector<Tensor>& state,
                      bool created, std::int64_t step, double lr) = 0;
  Backend& backend() const { return backend_; }

 private:
  Backend& backend_;
  std::vector<OptimizerParameter> parameters_;
  std::map<std::string, std::size_t> index_;
  std::vector<std::vector<Tensor>> state_;  // per parameter; empty until created
  std::vector<std::int64_t> steps_;
  std::vector<Tensor> make_state(std::size_t index) const;
  std::size_t state_index(const std::string& state_name) const;
};

/// torch.optim.AdamW (amsgrad off): per element, with g the scaled gradient and t the step count,
///   p ← p·(1 − lr·wd);  m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²;
///   p ← p − lr/(1−β1ᵗ) · m / (√v / √(1−β2ᵗ) + eps).
class AdamW final : public Optimizer {
 public:
  /// Throws partrain::Error for betas outside [0, 1), a negative eps or weight decay.
  AdamW(std::vector<OptimizerParameter> parameters, double beta1, double beta2, double eps, double weight_decay,
        Backend& backend);
  const char* name() const override { return "adamw"; }
  /// {"exp_avg", "exp_avg_sq"}.
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq"}; }

 protected:
  void update(std::size_t index, const Tensor& gradient, float grad_scale, std::vector<Tensor>& state, bool created,
              std::int64_t step, double lr) override;

 private:
  double beta1_, beta2_, eps_, weight_decay_;
};

/// torch.optim.SGD with momentum (no dampening, no Nesterov): per element,
///   d ← g + wd·p;  buf ← d on the first update, else buf ← momentum·buf + d;  p ← p − lr·buf.
/// With momentum 0 no buffer is kept (p ← p − lr·d).
class Sgd final : public Optimizer {
 public:
  /// Throws partrain::Error for a negative momentum or weight decay.
  Sgd(std::vector<OptimizerParameter> parameters, double momentum, double weight_decay, Backend& backend);
  const char* name() const override { return "sgd"; }
  /// {"momentum_buffer"}, or none when momentum is 0.
  std::vector<std::string> state_names() const override;

 protected:
  void update(std::size_t index, const Tensor& gradient, float grad_scale, std::vector<Tensor>& state, bool created,
              std::int64_t step, double lr) override;

 private:
  double momentum_, weight_decay_;
};

/// Hyper-parameters of the optimizers. Which optimizer runs is the Plan's choice (its state is part
/// of the memory the plan was made for); these only tune it.
struct OptimizerSettings {
  double beta1 = 0.9;          // AdamW
  double beta2 = 0.999;        // AdamW
  double eps = 1e-8;           // AdamW
  double weight_decay = 0.01;  // decoupled (AdamW) / L2 added to the gradient (SGD)
  double momentum = 0.9;       // SGD
};

/// The optimizer `kind` names ("adamw": beta1, beta2, eps, weight_decay; "sgd": momentum,
/// weight_decay) over `parameters` on `backend`. Throws partrain::Error for another name.
std::unique_ptr<Optimizer> make_optimizer(const std::string& kind, const OptimizerSettings& settings,
                                          std::vector<OptimizerParameter> parameters, Backend& backend);

/// Σ of squared elements over the (defined, float) gradients on `backend`, accumulated in double:
/// this rank's share of the squared global gradient norm (sum it over the stages, then take the root).
double sum_of_squares(std::span<const Tensor> gradients, Backend& backend);

/// The factor torch.nn.utils.clip_grad_norm_ multiplies every gradient by:
/// min(1, max_norm / (global_norm + 1e-6)). Returns 1 when max_norm <= 0 (clipping off); a
/// non-finite global_norm gives a non-finite factor (as in PyTorch without error_if_nonfinite).
double clip_scale(double global_norm, double max_norm);

}  // namespace partrain::runtime
