#pragma once
// A measurement the planner needs: one convex task set at one microbatch size. Kept apart from the
// profiler and the communicator so that partition/ can name it without runtime/ or comm/ headers.
#include <cstdint>
#include <vector>

namespace partrain::profile {

struct ProfileRequest {
  std::vector<int> tasks;   // task ids of the graph (any order, no duplicates), a convex set
  std::int64_t batch = 1;   // samples per microbatch
  bool operator==(const ProfileRequest&) const = default;
};

}  // namespace partrain::profile
