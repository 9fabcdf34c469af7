#include "runtime/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace partrain::runtime {

void check_loss_scaler_settings(const LossScalerSettings& settings) {
  PARTRAIN_CHECK(settings.initial_scale > 0 && std::isfinite(settings.initial_scale),
                 "[train] initial_loss_scale = " << settings.initial_scale << ": must be positive and finite");
  PARTRAIN_CHECK(settings.growth_factor > 1 && std::isfinite(settings.growth_factor),
                 "[train] loss_scale_growth_factor = " << settings.growth_factor << ": must be greater than 1");
  PARTRAIN_CHECK(settings.backoff_factor > 0 && settings.backoff_factor < 1,
                 "[train] loss_scale_backoff_factor = " << settings.backoff_factor << ": must be in (0, 1)");
  PARTRAIN_CHECK(settings.growth_interval >= 1,
                 "[train] loss_scale_growth_interval = " << settings.growth_interval << ": must be at least 1");
  PARTRAIN_CHECK(settings.min_scale >= 0 && settings.min_scale <= settings.initial_scale,
                 "[train] min_loss_scale = " << settings.min_scale << ": must be in [0, initial_loss_scale = "
                                             << settings.initial_scale << "]");
}

LossScaler::LossScaler(const LossScalerSettings& settings) : settings_(settings), scale_(settings.initial_scale) {
  check_loss_scaler_settings(settings);
}

void LossScaler::update(bool found_overflow) {
  if (found_overflow) {
    scale_ = std::max(scale_ * settings_.backoff_factor, settings_.min_scale);
    good_steps_ = 0;
    return;
  }
  if (++good_steps_ < settings_.growth_interval) return;
  // torch._amp_update_scale_: a growth that would overflow the scale itself is not applied.
  if (std::isfinite(scale_ * settings_.growth_factor)) scale_ *= settings_.growth_factor;
  good_steps_ = 0;
}

void LossScaler::restore(double scale, std::int64_t good_steps) {
  PARTRAIN_CHECK(scale > 0 && std::isfinite(scale), "loss scale " << scale << " from the checkpoint: must be positive");
  PARTRAIN_CHECK(good_steps >= 0, "loss-scale good-step count " << good_steps << " from the checkpoint: must not be negative");
  scale_ = scale;
  good_steps_ = good_steps;
}

}  // namespace partrain::runtime
