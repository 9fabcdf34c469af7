#include "partition/tarnawski/dpl.h"

#include "core/error.h"

namespace partrain::partition {

IdealFamily prefix_ideals(const ClassGraph& graph, const std::vector<std::size_t>& order) {
  PARTRAIN_CHECK(order.size() == graph.class_count, "prefix_ideals: the order must list every class once");
  IdealFamily family;
  family.words = graph.words;
  family.bits.assign((order.size() + 1) * graph.words, 0);
  family.lower_neighbours.resize(order.size() + 1);
  for (std::size_t length = 1; length <= order.size(); ++length) {
    std::uint64_t* bits = family.bits.data() + length * graph.words;
    std::copy(bits - graph.words, bits, bits);
    bits[order[length - 1] >> 6] |= std::uint64_t{1} << (order[length - 1] & 63);
    family.lower_neighbours[length].push_back(static_cast<std::uint32_t>(length - 1));
  }
  return family;
}

PartitionResult partition_linearised(const Workload& workload, const PartitionOptions& options) {
  const ClassGraph graph = dp_class_graph(workload, options);  // the DP's classes, as the released DPL
  return partition_over_ideals(workload, graph, prefix_ideals(graph, graph.topological_order), options);
}

}  // namespace partrain::partition
