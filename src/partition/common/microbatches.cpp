// The planners' reference microbatch count and per-replica microbatch size. See microbatches.h.
#include "partition/common/microbatches.h"

#include <algorithm>

namespace partrain::partition {

int planning_microbatches(const PlannerOptions& options, int stages, const std::vector<int>& replicas) {
  if (options.microbatches > 0) return options.microbatches;
  int devices = 0, widest = 1;
  for (int r : replicas) {
    devices += r;
    widest = std::max(widest, r);
  }
  const std::int64_t copies = devices > 0 && options.world_size % devices == 0 ? options.world_size / devices : 1;
  int chosen = 0, largest = 0;
  for (int m = 1; m <= std::max(1, options.max_microbatches); m *= 2) {
    const std::int64_t per_step = copies * m;
    if (options.global_batch % per_step != 0 || options.global_batch / per_step < widest) continue;
    largest = m;
    if (chosen == 0 && m >= stages) chosen = m;
  }
  if (chosen > 0) return chosen;
  return largest > 0 ? largest : 1;
}

std::int64_t replica_microbatch(const PlannerOptions& options, int stage_replicas, const std::vector<int>& replicas,
                                int microbatches) {
  int devices = 0;
  for (int r : replicas) devices += r;
  const std::int64_t copies = devices > 0 && options.world_size % devices == 0 ? options.world_size / devices : 1;
  const std::int64_t microbatch = std::max<std::int64_t>(1, options.global_batch / (copies * std::max(1, microbatches)));
  const std::int64_t share = std::max(1, stage_replicas);
  return std::max<std::int64_t>(1, (microbatch + share - 1) / share);
}

}  // namespace partrain::partition
