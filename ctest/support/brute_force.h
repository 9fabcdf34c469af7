#pragma once
// Enumeration helpers of the brute-force checks of the stage DP.
#include <functional>
#include <vector>

namespace partrain::testing {

/// Calls `visit` with every composition of `total` into `parts` positive parts appended to `current`.
inline void compositions(int total, int parts, std::vector<int>& current, const std::function<void()>& visit) {
  if (parts == 1) {
    current.push_back(total);
    visit();
    current.pop_back();
    return;
  }
  for (int first = 1; first <= total - (parts - 1); ++first) {
    current.push_back(first);
    compositions(total - first, parts - 1, current, visit);
    current.pop_back();
  }
}

}  // namespace partrain::testing
