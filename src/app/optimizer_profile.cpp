#include "app/optimizer_profile.h"

#include <algorithm>
#include <vector>

#include "core/statistics.h"
#include "profile/profiler.h"

namespace partrain::app {

double measure_optimizer_seconds_per_byte(Backend& backend, const std::string& optimizer,
                                          const runtime::OptimizerSettings& settings, int repeats, bool cpu_time,
                                          DType working) {
  constexpr std::int64_t kElements = 4 << 20;
  const Tensor parameter = backend.zeros({kElements});
  const Tensor gradient = backend.zeros({kElements});
  backend.fill_zero(gradient);
  std::vector<runtime::OptimizerParameter> parameters{{"profile.weight", parameter, true}};
  const std::unique_ptr<runtime::Optimizer> step = runtime::make_optimizer(optimizer, settings, std::move(parameters), backend);
  const std::vector<Tensor> gradients{gradient};
  const std::vector<double> weights{1.0};
  std::vector<double> samples;
  // Each part starts with cold caches, as in training, where the forward and backward between the
  // gradients' zeroing and the update stream the activations through them.
  const auto cold_start = [&backend, cpu_time] {
    backend.flush_caches();
    backend.synchronise();
    return profile::pass_clock_seconds(cpu_time);
  };
  for (int round = 0; round <= repeats; ++round) {
    // As the executor's step: its gradients zeroed where the step begins (1 of ResNet-tiny's 25 ms
    // on the CPU, unpriced before), then the gradients' sum of squares (the global norm, also the
    // overflow check; only its time matters here) and the update.
    double start = cold_start();
    backend.fill_zero(gradient);
    backend.synchronise();
    double seconds = profile::pass_clock_seconds(cpu_time) - start;
    start = cold_start();
    backend.sum_of_squares(gradients, weights);
    step->step(gradients, 1e-3, 1.0);
    // Mixed precision: the 16-bit working copy made again from the updated master.
    if (working != DType::F32) to_dtype(parameter, working, backend);
    backend.synchronise();
    seconds += profile::pass_clock_seconds(cpu_time) - start;
    if (round > 0) samples.push_back(seconds);
  }
  return median(samples) / (4.0 * kElements);
}

}  // namespace partrain::app
