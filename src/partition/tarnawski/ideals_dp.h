#pragma once
// Tarnawski et al., "Efficient Algorithms for Device Placement of DNN Graph Operators" (NeurIPS
// 2020): the optimal contiguous split by dynamic programming over the ideals of the forward DAG
// (§5.1.1), in its training form (§5.3: each set carries the backward twins of its forward nodes).
// Cost model: ctest/data/dnn-partitioning/EXPECTED.md. Times in ms, sizes in bytes.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "partition/tarnawski/workload.h"

namespace partrain::partition {

/// How ClassGraph forms its classes.
struct ClassGraphOptions {
  /// The ideal DP's classes, simplified as the paper counts its ideals (class_simplification.h:
  /// backward-only classes mirror their backward edges, cycles of arcs are fused, trivial classes
  /// join their only neighbour). Off: colour classes only, the units of the integer programs, where
  /// fusing would restrict §5.2's non-contiguous splits.
  bool simplify = false;
  /// Memory of one accelerator (bytes), which decides whether a trivial class of non-zero size may
  /// be contracted (only with simplify).
  double accelerator_memory_bytes = std::numeric_limits<double>::infinity();
  /// With simplify: also contract trivial classes (step 4; off only to check its exactness).
  bool contract_trivial = true;
};

/// The workload after contracting colour classes: one class per colour (a backward node joins its
/// forward twin's class; a node without a colour is its own class; a class holding only backward
/// nodes acts as a zero-cost forward node). The forward DAG on classes has an arc c(u) -> c(v) for
/// every edge u -> v between forward nodes. Without options.simplify a backward-only class is
/// placed by its own edges: arcs from edges leaving forward nodes as given, then edges between
/// backward nodes reversed, each left out if it would close a cycle, and the constructor throws
/// partrain::Error if the forward arcs have a cycle. With it, classes and arcs are those of
/// simplify_classes (Tarnawski et al. §5.3 as their released DP counts ideals), always acyclic.
struct ClassGraph {
  explicit ClassGraph(const Workload& workload, const ClassGraphOptions& options = {});

  std::size_t class_count = 0;
  std::size_t colour_class_count = 0;                     // classes before simplification
  std::size_t fused_class_count = 0;                      // removed by fusing cycles (simplify)
  std::size_t contracted_class_count = 0;                 // removed as trivial (simplify)
  std::size_t words = 0;                                  // 64-bit words per class bitset
  std::vector<std::size_t> class_of_node;                 // node index -> class
  std::vector<std::vector<std::size_t>> members;          // class -> node indices
  std::vector<double> accelerator_latency_ms;             // class -> Σ fpgaLatency (fw + bw)
  std::vector<double> cpu_latency_ms;                     // class -> Σ cpuLatency
  std::vector<double> size_bytes;                         // class -> Σ size
  std::vector<int> unsupported_count;                     // class -> nodes not supported on accelerators
  std::vector<std::uint64_t> predecessor_bits;            // class -> bitset of DAG predecessors
  std::vector<std::vector<std::size_t>> successors;       // forward DAG arcs
  std::vector<std::size_t> topological_order;             // as-late-as-possible topological order (DPL)
  // Nodes that can cost communication: cost > 0 and an out-edge to another class. For node x,
  // touched classes = its own class and its heads' classes; x is paid for by a set S exactly when
  // S contains some but not all of them.
  std::vector<double> communicating_cost_ms;
  std::vector<std::size_t> communicating_node;
  std::vector<std::vector<std::size_t>> communicating_classes;

  /// comm(S) of EXPECTED.md for the class set S given as a bitset of `words` words (ms).
  double communication_ms(const std::uint64_t* set_bits) const;
};

/// A family of ideals (down-closed class sets) with its Hasse diagram: ideal i's lower neighbours
/// are the ideals obtained by removing one maximal class. Index 0 is the empty ideal, the last one
/// is the full set, and every ideal's subsets come before it.
struct IdealFamily {
  std::size_t words = 0;
  std::vector<std::uint64_t> bits;                      // ideal i: bits[i*words .. (i+1)*words)
  std::vector<std::vector<std::uint32_t>> lower_neighbours;
  std::size_t size() const { return lower_neighbours.size(); }
  const std::uint64_t* ideal(std::size_t index) const { return bits.data() + index * words; }
};

/// The error enumerate_ideals throws beyond its cap: callers that try several splits stop on it
/// (more devices cannot help) while they skip infeasible ones.
class TooManyIdealsError : public Error {
 public:
  using Error::Error;
};

/// Enumerates every ideal of the forward DAG of classes (breadth first, by size). Throws
/// TooManyIdealsError (a partrain::Error) suggesting the dpl planner when there are more than `max_ideals`.
IdealFamily enumerate_ideals(const ClassGraph& graph, std::size_t max_ideals, const std::string& source_name);

/// Options of the ideal DPs; negative values mean "the workload's".
struct PartitionOptions {
  int accelerators = -1;                 // k
  int cpus = -1;                         // l
  double accelerator_memory_bytes = -1;  // memory cap of one accelerator
  std::size_t max_ideals = 200000;      // cap of enumerate_ideals
};

/// What one device holds in a split.
struct DeviceBlock {
  bool accelerator = true;
  int device_index = 0;                // among accelerators or among CPUs, in pipeline order
  double load_ms = 0.0;                // compute + communication
  double compute_ms = 0.0;
  double communication_ms = 0.0;       // 0 on CPUs
  double size_bytes = 0.0;
  std::vector<std::size_t> nodes;      // workload node indices (forward and backward)
};

/// A split: the maximum load (ms) and the non-empty devices in pipeline order.
struct PartitionResult {
  double max_load_ms = 0.0;
  std::vector<DeviceBlock> devices;
  std::size_t ideal_count = 0;
  std::size_t class_count = 0;
};

/// The DP of §5.1.1 restricted to `family`: dp(I, a, c) = least max load of placing ideal I on a
/// accelerators and c CPUs, with the last device holding S = I \ I' for a family member I' ⊆ I.
/// Blocks whose load lower bound reaches `upper_bound_ms` are pruned (pass +inf for none; the
/// optimum is exact if it is ≤ upper_bound_ms). Throws partrain::Error when no split is feasible.
PartitionResult partition_over_ideals(const Workload& workload, const ClassGraph& graph, const IdealFamily& family,
                                      const PartitionOptions& options,
                                      double upper_bound_ms = std::numeric_limits<double>::infinity());

/// The class graph the DPs run on: ClassGraphOptions::simplify with the accelerator memory of
/// `options` (the workload's when negative). Throws partrain::Error on an empty workload.
ClassGraph dp_class_graph(const Workload& workload, const PartitionOptions& options);

/// Optimal contiguous split over all ideals (Tarnawski et al. §5.1.1, §5.3) of the simplified class
/// graph (ClassGraphOptions::simplify, with the memory the split is for), whose ideal counts are
/// those of the paper's Table 1. Uses DPL's value on the same graph as the pruning bound. Throws
/// partrain::Error if there are too many ideals or no feasible split.
PartitionResult partition_ideals(const Workload& workload, const PartitionOptions& options);

}  // namespace partrain::partition
