#pragma once
// Learning-rate schedules (docs/architecture.md §Runtime): linear warm-up from 0 to the peak rate, then
// a cosine or linear decay to the minimum rate at the last step, or a constant rate — the shapes of
// Hugging Face's get_{cosine,linear,constant}_schedule_with_warmup with Megatron's min_lr floor.
#include <cstdint>
#include <string>

namespace partrain::runtime {

/// The learning rate as a function of the 0-based optimizer step.
class LearningRateSchedule {
 public:
  /// The shape after warm-up.
  enum class Decay { Cosine, Linear, Constant };

  /// Peak rate `lr`, minimum rate `min_lr` (reached at `total_steps`, where the decay ends),
  /// `warmup_steps` of linear warm-up, then `decay`. Throws partrain::Error for negative rates,
  /// min_lr > lr or negative step counts. (app/planning.h's learning_rate_schedule builds one from
  /// the [train] section.)
  LearningRateSchedule(double lr, double min_lr, std::int64_t warmup_steps, std::int64_t total_steps, Decay decay);

  /// The rate for `step` (0-based; same units as TrainConfig::lr):
  ///  * step < warmup_steps: lr · step / warmup_steps (0 at step 0, lr at step warmup_steps);
  ///  * then, with progress p = (step − warmup) / (total − warmup) clamped to [0, 1]:
  ///    cosine: min_lr + (lr − min_lr) · ½(1 + cos(π p)); linear: min_lr + (lr − min_lr)(1 − p);
  ///    constant: lr.
  /// Steps at or past total_steps give min_lr (cosine, linear). Throws partrain::Error for step < 0.
  double at(std::int64_t step) const;

  /// The construction parameters: peak and minimum rate, warm-up and total steps, decay shape.
  double peak() const { return lr_; }
  double minimum() const { return min_lr_; }
  std::int64_t warmup_steps() const { return warmup_steps_; }
  std::int64_t total_steps() const { return total_steps_; }
  Decay decay() const { return decay_; }

  /// Parses "cosine", "linear" or "constant"; throws partrain::Error otherwise.
  static Decay parse_decay(const std::string& name);

 private:
  double lr_, min_lr_;
  std::int64_t warmup_steps_, total_steps_;
  Decay decay_;
};

}  // namespace partrain::runtime
