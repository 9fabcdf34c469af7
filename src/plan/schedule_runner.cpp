#include "plan/schedule_runner.h"

#include <sstream>

namespace partrain {

std::string where(const Plan& plan, int rank) {
  std::ostringstream out;
  out << "rank " << rank;
  if (rank >= 0 && rank < plan.world_size) {
    const Placement place = plan.placement_of(rank);
    out << " (pipeline replica " << place.pipeline_replica << ", stage " << place.stage << ", replica " << place.replica << ")";
  }
  return out.str();
}

std::string at(const Plan& plan, const Schedule& schedule, int rank, std::size_t index) {
  std::ostringstream out;
  out << where(plan, rank) << " action #" << index << " " << schedule[rank][index].to_string();
  return out.str();
}

}  // namespace partrain
