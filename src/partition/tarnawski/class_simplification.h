#pragma once
// The classes and forward arcs on which the ideal DP of Tarnawski et al. (NeurIPS 2020) enumerates
// ideals, simplified as the paper counts them (Table 1's "Ideals" column; §5.3 runs the DP on the
// forward part with every backward node carried by its forward twin). The reference for the counts
// is the authors' released DP (throughput-dp/dp.cpp of msr-fiddle/dnn-partitioning), which applies,
// before enumerating ideals:
//   1. colour classes: a backward node joins its forward twin's class (§5.3);
//   2. a class holding only backward nodes gets a zero-cost forward node whose arcs mirror the
//      backward edges touching it (a backward edge u -> v becomes the arc c(v) -> c(u): the backward
//      pass runs against the forward order);
//   3. classes on a cycle of arcs are fused: every ideal holds all of a cycle or none of it, so
//      the family of ideals is the same and only its representation shrinks;
//   4. trivial classes are contracted into their only neighbour: a class with zero latency on every
//      device whose arcs and edges all lead to one other class m can join m in any split without
//      raising a load (its edges to m stop being cut, nothing else changes), so some optimum keeps
//      it with m. We contract only when that argument holds exactly: the class fits wherever m is
//      (zero size, or all nodes together fit one accelerator's memory) and is supported wherever m
//      is (supported on accelerators, or m holds an unsupported node). The released code checks
//      latency and degree only; on the published workloads both give the same classes.
// Implemented from that description; no code of the release is used.
#include <cstddef>
#include <utility>
#include <vector>

#include "partition/tarnawski/workload.h"

namespace partrain::partition {

/// Colour classes (step 1): node index -> class, classes numbered by first appearance; a node
/// without a colour class is a class of its own. Sets `class_count`.
std::vector<std::size_t> colour_classes(const Workload& workload, std::size_t& class_count);

/// The simplified classes of a workload and the forward DAG on them.
struct SimplifiedClasses {
  std::size_t class_count = 0;
  std::vector<std::size_t> class_of_node;                   // node index -> class
  std::vector<std::pair<std::size_t, std::size_t>> arcs;    // forward DAG, no duplicates or loops
  std::size_t colour_class_count = 0;                       // classes after step 1
  std::size_t fused_classes = 0;                            // classes removed by step 3
  std::size_t contracted_classes = 0;                       // classes removed by step 4
};

/// Steps 1-4 above (steps 1-3 when `contract_trivial` is false) for a DP whose accelerators hold
/// `accelerator_memory_bytes` each (bytes; step 4 contracts a class of non-zero size only when every
/// node together fits in it). Never throws on a valid Workload; the arcs are acyclic by construction.
SimplifiedClasses simplify_classes(const Workload& workload, double accelerator_memory_bytes, bool contract_trivial = true);

}  // namespace partrain::partition
