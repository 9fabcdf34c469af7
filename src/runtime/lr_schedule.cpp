#include "runtime/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace partrain::runtime {

LearningRateSchedule::Decay LearningRateSchedule::parse_decay(const std::string& name) {
  if (name == "cosine") return Decay::Cosine;
  if (name == "linear") return Decay::Linear;
  if (name == "constant") return Decay::Constant;
  PARTRAIN_FAIL("learning-rate schedule '" << name << "' is unknown (cosine, linear, constant)");
}

LearningRateSchedule::LearningRateSchedule(double lr, double min_lr, std::int64_t warmup_steps,
                                           std::int64_t total_steps, Decay decay)
    : lr_(lr), min_lr_(min_lr), warmup_steps_(warmup_steps), total_steps_(total_steps), decay_(decay) {
  PARTRAIN_CHECK(lr >= 0, "learning-rate schedule: negative lr " << lr);
  PARTRAIN_CHECK(min_lr >= 0 && min_lr <= lr, "learning-rate schedule: min_lr " << min_lr << " is outside [0, lr]");
  PARTRAIN_CHECK(warmup_steps >= 0, "learning-rate schedule: negative warmup_steps " << warmup_steps);
  PARTRAIN_CHECK(total_steps >= 0, "learning-rate schedule: negative steps " << total_steps);
}

double LearningRateSchedule::at(std::int64_t step) const {
  PARTRAIN_CHECK(step >= 0, "learning-rate schedule: negative step " << step);
  if (step < warmup_steps_) return lr_ * static_cast<double>(step) / static_cast<double>(warmup_steps_);
  if (decay_ == Decay::Constant) return lr_;
  const double span = static_cast<double>(std::max<std::int64_t>(1, total_steps_ - warmup_steps_));
  const double progress = std::clamp(static_cast<double>(step - warmup_steps_) / span, 0.0, 1.0);
  const double factor = decay_ == Decay::Cosine ? 0.5 * (1.0 + std::cos(std::numbers::pi * progress)) : 1.0 - progress;
  return min_lr_ + (lr_ - min_lr_) * factor;
}

}  // namespace partrain::runtime
