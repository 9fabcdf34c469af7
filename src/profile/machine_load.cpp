#include "profile/machine_load.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>

namespace partrain::profile {

double node_busy_cpu_seconds() {
  std::ifstream stat("/proc/stat");
  std::string line;
  if (!stat || !std::getline(stat, line) || line.rfind("cpu ", 0) != 0) return -1;
  std::istringstream fields(line.substr(4));
  double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0;
  if (!(fields >> user >> nice >> system >> idle >> iowait >> irq >> softirq)) return -1;
  const long ticks = ::sysconf(_SC_CLK_TCK);
  return ticks > 0 ? (user + nice + system + irq + softirq) / static_cast<double>(ticks) : -1;
}

double process_cpu_seconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  const auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec); };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

OtherLoadMeter::OtherLoadMeter()
    : node_busy_seconds_(node_busy_cpu_seconds()),
      process_seconds_(process_cpu_seconds()),
      start_(std::chrono::steady_clock::now()) {}

std::optional<double> OtherLoadMeter::share_of_other_load(int ranks_per_node) const {
  const double busy = node_busy_cpu_seconds();
  if (node_busy_seconds_ < 0 || busy < 0 || ranks_per_node < 1) return std::nullopt;
  const double window = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (window < kShortestLoadWindowSeconds) return std::nullopt;  // a few clock ticks: cannot tell
  const double others = (busy - node_busy_seconds_) / ranks_per_node - (process_cpu_seconds() - process_seconds_);
  return others / window;
}

double other_load_cores(const OtherLoadMeter& meter, comm::Communicator& world, int ranks_per_node) {
  const std::optional<double> share = meter.share_of_other_load(ranks_per_node);
  const double unknown = world.all_reduce_scalar(share ? 0.0 : 1.0, comm::ReduceOp::Max);
  const double sum = world.all_reduce_scalar(share.value_or(0.0));
  if (unknown > 0) return -1;
  const double nodes = static_cast<double>(world.size()) / std::max(1, ranks_per_node);
  return std::max(0.0, sum / nodes);
}

bool other_load_differs(double cached_cores, double current_cores) {
  return cached_cores >= 0 && current_cores >= 0 && std::abs(cached_cores - current_cores) >= kOtherLoadTolerance;
}

}  // namespace partrain::profile
