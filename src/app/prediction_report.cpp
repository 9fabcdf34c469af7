#include "app/prediction_report.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "core/error.h"
#include "core/statistics.h"

namespace partrain::app {

double typical_step_seconds(std::vector<double> step_seconds) {
  if (step_seconds.size() > 1) step_seconds.erase(step_seconds.begin());
  return median(std::move(step_seconds));
}

std::vector<double> stage_peak_bytes(const Plan& plan, const std::vector<double>& rank_peak_bytes) {
  PARTRAIN_CHECK(static_cast<int>(rank_peak_bytes.size()) == plan.world_size,
                 "stage_peak_bytes: " << rank_peak_bytes.size() << " ranks measured, the plan has " << plan.world_size);
  std::vector<double> peaks(plan.pipeline_stages(), 0.0);
  for (int rank = 0; rank < plan.world_size; ++rank) {
    double& peak = peaks[plan.placement_of(rank).stage];
    peak = std::max(peak, rank_peak_bytes[rank]);
  }
  return peaks;
}

namespace {
std::string relative_error(double measured, double predicted) {
  if (!(predicted > 0)) return "not predicted";
  char text[32];
  std::snprintf(text, sizeof text, "%+.1f%%", 100.0 * (measured - predicted) / predicted);
  return text;
}
}  // namespace

std::string prediction_error_line(const Plan& plan, const std::vector<double>& step_seconds,
                                  const std::vector<double>& stage_peak_bytes) {
  const double measured = typical_step_seconds(step_seconds);
  const std::size_t counted = step_seconds.size() > 1 ? step_seconds.size() - 1 : step_seconds.size();
  std::ostringstream line;
  char text[200];
  if (plan.cost_model.starts_with("analytic")) {
    // Without a profile the step time was predicted for the analytic model's nominal device, not
    // for this machine: an "error" against it would be meaningless (issue 26). Memory is not
    // device-dependent, so its errors stay.
    std::snprintf(text, sizeof text,
                  "prediction: step time %.4f s for the analytic cost model's nominal device, not this machine "
                  "(measured %.4f s, median of %zu steps; [profile] enabled = true measures this machine)",
                  plan.predicted_step_seconds, measured, counted);
    line << text << "; peak memory per stage:";
  } else {
    std::snprintf(text, sizeof text, " (measured %.4f s, median of %zu steps; predicted %.4f s)", measured, counted,
                  plan.predicted_step_seconds);
    line << "prediction error: step time " << relative_error(measured, plan.predicted_step_seconds) << text
         << "; peak memory per stage:";
  }
  for (std::size_t s = 0; s < static_cast<std::size_t>(plan.pipeline_stages()) && s < stage_peak_bytes.size(); ++s) {
    const double predicted = plan.rank_memory_bytes(static_cast<int>(s));  // every model chunk of the stage
    std::snprintf(text, sizeof text, " (%.1f of %.1f MiB predicted)", stage_peak_bytes[s] / (1 << 20),
                  predicted / (1 << 20));
    line << (s ? ", " : " ") << s << " " << relative_error(stage_peak_bytes[s], predicted) << text;
  }
  return line.str();
}

}  // namespace partrain::app
