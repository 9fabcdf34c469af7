#include "app/optimizer_profile.h"

#include <algorithm>
#include <vector>

#include "core/statistics.h"
#include "profile/profiler.h"

namespace partrain::app {

double measure_optimizer_seconds_per_byte(Backend& backend, const std::string& optimizer,
                                          const runtime::OptimizerSettings& settings, int repeats, bool cpu_time) {
  constexpr std::int64_t kElements = 4 << 20;
  const Tensor parameter = backend.zeros({kElements});
  const Tensor gradient = backend.zeros({kElements});
  backend.fill_zero(gradient);
  std::vector<runtime::OptimizerParameter> parameters{{"profile.weight", parameter, true}};
  const std::unique_ptr<runtime::Optimizer> step = runtime::make_optimizer(optimizer, settings, std::move(parameters), backend);
  const std::vector<Tensor> gradients{gradient};
  const std::vector<double> weights{1.0};
  std::vector<double> samples;
  for (int round = 0; round <= repeats; ++round) {
    backend.synchronise();
    const double start = profile::pass_clock_seconds(cpu_time);
    // As the executor's step: the gradients' sum of squares (the global norm, also the overflow
    // check; only its time matters here), then the update. The norm's pass was 4 of ResNet's 11 ms
    // step on the CPU, unpriced.
    backend.sum_of_squares(gradients, weights);
    step->step(gradients, 1e-3, 1.0);
    backend.synchronise();
    if (round > 0) samples.push_back(profile::pass_clock_seconds(cpu_time) - start);
  }
  return median(samples) / (4.0 * kElements);
}

}  // namespace partrain::app
