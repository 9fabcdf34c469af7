#pragma once
// Dynamic loss scaling for fp16 mixed precision (Micikevicius et al. 2018 §3.2; the state machine of
// PyTorch's torch.amp.GradScaler and Megatron-LM's DynamicGradScaler without hysteresis). The
// backward starts from the loss times scale(), so that small gradients stay representable in fp16;
// the gradients are divided by it again before clipping and the optimizer. A step whose gradients
// hold an inf or NaN anywhere is skipped on every rank and the scale backed off; after
// growth_interval consecutive steps without one the scale grows.
#include <cstdint>

namespace partrain::runtime {

/// The settings of [train] initial_loss_scale, loss_scale_growth_factor,
/// loss_scale_backoff_factor, loss_scale_growth_interval and min_loss_scale (PyTorch's defaults).
struct LossScalerSettings {
  double initial_scale = 65536.0;      // 2^16, GradScaler's init_scale
  double growth_factor = 2.0;          // > 1
  double backoff_factor = 0.5;         // in (0, 1)
  std::int64_t growth_interval = 2000; // consecutive good steps before the scale grows (>= 1)
  double min_scale = 0.0;              // the back-off never goes below it (0: no floor, as PyTorch)
};

class LossScaler {
 public:
  /// Throws partrain::Error for settings out of range (naming the [train] key).
  explicit LossScaler(const LossScalerSettings& settings);

  /// The factor the backward's seed is multiplied by this step.
  double scale() const { return scale_; }
  /// Consecutive steps without overflow since the scale last changed (GradScaler's growth tracker).
  std::int64_t good_steps() const { return good_steps_; }

  /// After a step: an overflow multiplies the scale by backoff_factor (not below min_scale) and
  /// restarts the count; otherwise the count grows, and at growth_interval the scale is multiplied
  /// by growth_factor (unless that is no longer finite) and the count restarts.
  void update(bool found_overflow);
  /// Sets the state a checkpoint saved. Throws partrain::Error for a scale that is not positive
  /// and finite or a negative count.
  void restore(double scale, std::int64_t good_steps);

 private:
  LossScalerSettings settings_;
  double scale_;
  std::int64_t good_steps_ = 0;
};

/// Throws partrain::Error naming the [train] key of the first setting out of range: a scale that is
/// not positive, a growth factor <= 1, a back-off factor outside (0, 1), a growth interval < 1, a
/// negative minimum or one above the initial scale.
void check_loss_scaler_settings(const LossScalerSettings& settings);

}  // namespace partrain::runtime
