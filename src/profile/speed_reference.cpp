#include "profile/speed_reference.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <sstream>

#include "core/error.h"
#include "profile/machine_load.h"
#include "profile/speed_calibration.h"

namespace partrain::profile {

std::vector<SpeedReference> choose_speed_references(const ProfileDB& database, std::span<const ProfileRequest> requests,
                                                    double budget_seconds) {
  std::vector<SpeedReference> cached;
  for (const ProfileRequest& request : requests)
    if (const Measurement* m = database.find(request.tasks, request.batch))
      cached.push_back({request.tasks, request.batch, m->forward_seconds + m->backward_seconds});
  std::sort(cached.begin(), cached.end(),
            [](const SpeedReference& a, const SpeedReference& b) { return a.cached_seconds > b.cached_seconds; });
  std::vector<SpeedReference> chosen;
  double total = 0;
  for (const SpeedReference& reference : cached) {
    if (chosen.size() == 3) break;
    if (reference.cached_seconds <= 0 || total + reference.cached_seconds > budget_seconds) continue;
    chosen.push_back(reference);
    total += reference.cached_seconds;
  }
  if (chosen.empty() && !cached.empty() && cached.back().cached_seconds > 0) chosen.push_back(cached.back());
  return chosen;
}

std::string speed_references_to_text(std::span<const SpeedReference> references) {
  std::ostringstream text;
  text.precision(17);
  for (const SpeedReference& reference : references)
    text << task_set_key(reference.tasks) << ';' << reference.batch << ';' << reference.cached_seconds << '\n';
  return text.str();
}

std::vector<SpeedReference> speed_references_from_text(const std::string& text) {
  std::vector<SpeedReference> references;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    const std::size_t first = line.find(';'), second = line.find(';', first == std::string::npos ? 0 : first + 1);
    PARTRAIN_CHECK(first != std::string::npos && second != std::string::npos,
                   "speed references: malformed line '" << line << "'");
    SpeedReference reference;
    reference.tasks = parse_task_set_key(line.substr(0, first));
    try {
      reference.batch = std::stoll(line.substr(first + 1, second - first - 1));
      reference.cached_seconds = std::stod(line.substr(second + 1));
    } catch (const std::exception&) {
      PARTRAIN_FAIL("speed references: malformed line '" << line << "'");
    }
    references.push_back(std::move(reference));
  }
  return references;
}

namespace {

// This rank's measured over cached seconds of every reference, timed with the others at once, the
// references measured over and over for at least kShortestTrySeconds (long enough for the other
// load measured beside, profile/machine_load.h; the ranks may loop different counts: measuring is
// local).
double time_once(const Graph& graph, std::span<const SpeedReference> references, Backend& backend,
                 comm::Communicator& world, const ProfilerOptions& options) {
  constexpr double kShortestTrySeconds = 2 * kShortestLoadWindowSeconds;
  world.barrier();  // every rank at once: they share the node's cores, as in profiling and training
  const auto start = std::chrono::steady_clock::now();
  double measured = 0, cached = 0;
  do {
    for (const SpeedReference& reference : references) {
      const Measurement m = measure_task_set(graph, reference.tasks, reference.batch, backend, options);
      measured += m.forward_seconds + m.backward_seconds;
      cached += reference.cached_seconds;
    }
  } while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < kShortestTrySeconds);
  return world.all_reduce_scalar(measured / cached) / world.size();
}

}  // namespace

double measured_speed_ratio(const Graph& graph, std::span<const SpeedReference> references, Backend& backend,
                            comm::Communicator& world, const ProfilerOptions& options) {
  if (references.empty()) return 1.0;
  constexpr int kRetries = 2;
  double closest = time_once(graph, references, backend, world, options);
  // The same decisions on every rank: time_once returns the same value on every rank.
  for (int retry = 0; retry < kRetries && std::abs(closest - 1) > kCalibrationTolerance; ++retry) {
    const double again = time_once(graph, references, backend, world, options);
    if (std::abs(again - 1) < std::abs(closest - 1)) closest = again;
  }
  return closest;
}

}  // namespace partrain::profile
