#pragma once
// Contiguous ranges of RaNNC blocks (§III-B) and their costs, shared by the stage DP (stage_dp.cpp)
// and the interleaved chunking (interleaving.cpp): a range's tasks and its measurement at a batch,
// measured once per search.
#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "partition/common/cost_model.h"

namespace partrain::partition {

class BlockRanges {
 public:
  /// `blocks` (task ids per block, in pipeline order) and `cost` must outlive this object; check()
  /// them first.
  BlockRanges(const std::vector<std::vector<int>>& blocks, const CostModel& cost) : blocks_(blocks), cost_(cost) {}

  /// Throws partrain::Error for no blocks, an empty block or 65,536 blocks or more (the range keys
  /// hold block indices in 16 bits). Called first in the owners' constructor bodies.
  static void check(const std::vector<std::vector<int>>& blocks) {
    PARTRAIN_CHECK(!blocks.empty(), "rannc: no blocks to place");
    PARTRAIN_CHECK(blocks.size() < 65536, "rannc: too many blocks (" << blocks.size() << ")");
    for (std::size_t b = 0; b < blocks.size(); ++b) PARTRAIN_CHECK(!blocks[b].empty(), "rannc: block " << b << " is empty");
  }

  /// Each block's own tasks: those no other block holds (a task in several blocks is a cloned
  /// constant). Own sets are disjoint, so a range holds the own sets of all its blocks.
  std::vector<std::vector<int>> own_tasks() const {
    std::unordered_map<int, int> holders;
    for (const std::vector<int>& block : blocks_)
      for (int task : block) ++holders[task];
    std::vector<std::vector<int>> own(blocks_.size());
    for (std::size_t b = 0; b < blocks_.size(); ++b)
      for (int task : blocks_[b])
        if (holders[task] == 1) own[b].push_back(task);
    return own;
  }

  /// The union of blocks [b, e), ascending and distinct (a constant task may be cloned into several).
  std::vector<int> range_tasks(int b, int e) const {
    std::vector<int> tasks;
    for (int i = b; i < e; ++i) tasks.insert(tasks.end(), blocks_[i].begin(), blocks_[i].end());
    // Blocks are usually ascending id ranges: then the concatenation is sorted already.
    if (!std::is_sorted(tasks.begin(), tasks.end())) std::sort(tasks.begin(), tasks.end());
    tasks.erase(std::unique(tasks.begin(), tasks.end()), tasks.end());
    return tasks;
  }

  /// The cost model's figures of blocks [b, e) for one microbatch of `batch` samples, cached.
  const profile::Measurement& measurement(int b, int e, std::int64_t batch) {
    const std::uint64_t key = (static_cast<std::uint64_t>(b) << 48) | (static_cast<std::uint64_t>(e) << 32) |
                              static_cast<std::uint64_t>(batch);
    auto found = measurements_.find(key);
    if (found != measurements_.end()) return found->second;
    return measurements_.emplace(key, cost_.measure(range_tasks(b, e), batch)).first->second;
  }

 private:
  const std::vector<std::vector<int>>& blocks_;
  const CostModel& cost_;
  std::unordered_map<std::uint64_t, profile::Measurement> measurements_;
};

}  // namespace partrain::partition
