#pragma once
// Evaluation of a placement of a workload's colour classes on devices, independent of how it was
// found (DP, integer program, brute force): the max-load of Tarnawski et al. §5 (throughput), the
// latency of §4's single-stream schedule, and the contiguity of Definition 3.1. Times in ms, sizes
// in bytes; cost model of ctest/data/dnn-partitioning/EXPECTED.md.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "partition/tarnawski/ideals_dp.h"
#include "partition/tarnawski/workload.h"

namespace partrain::partition {

/// Devices 0..accelerators-1 are accelerators, then `cpus` CPUs. A subgraph is a (device, slot)
/// pair; slots of one device run one after the other (§4 with q subgraphs per device; q = 1 for
/// contiguous splits and for throughput, where slots do not matter).
struct Placement {
  int accelerators = 0;
  int cpus = 0;
  int slots = 1;                       // subgraphs per device (q)
  std::vector<int> device_of_class;    // class -> device
  std::vector<int> slot_of_class;      // class -> slot (empty: all 0)

  int devices() const { return accelerators + cpus; }
  bool is_accelerator(int device) const { return device < accelerators; }
  int slot(std::size_t cls) const { return slot_of_class.empty() ? 0 : slot_of_class[cls]; }
};

/// One non-empty subgraph of a placement with its costs (load = compute + communication on an
/// accelerator, compute on a CPU) and, for latency, its place in the schedule.
struct SubgraphCost {
  DeviceBlock block;        // device, nodes, load, compute, communication, size
  int slot = 0;
  double start_ms = 0.0;    // latency schedule: when its inputs are all in RAM
  double finish_ms = 0.0;   // start + load
};

/// Whether the class set (bitset of graph.words words) is contiguous (Definition 3.1) in the
/// forward DAG of classes: no class outside it is reachable from it and reaches it.
bool class_set_contiguous(const ClassGraph& graph, const std::vector<std::uint64_t>& set_bits);

/// The non-empty subgraphs of `placement` with their loads, in device then slot order. Throws
/// partrain::Error if a class is on no valid device or slot.
std::vector<SubgraphCost> placement_subgraphs(const ClassGraph& graph, const Placement& placement);

/// Whether every accelerator subgraph fits `memory_bytes` (sum over the device's slots) and holds
/// only supported nodes.
bool placement_fits(const ClassGraph& graph, const Placement& placement, double memory_bytes);

/// Max-load objective (§5.1, §5.3): the largest device load, summing a device's slots (ms).
double placement_max_load(const ClassGraph& graph, const Placement& placement);

/// Whether each device's classes (each slot's, when slots > 1) are contiguous.
bool placement_contiguous(const ClassGraph& graph, const Placement& placement);

/// The single-stream latency schedule of §4: a subgraph starts when the outputs of every class
/// outside it that feeds it are in RAM and after the previous slot of its device finishes, then
/// runs uninterrupted for its load (communication in, compute, communication out); a class's output
/// is in RAM when its subgraph finishes. Fills start_ms/finish_ms of `subgraphs` (from
/// placement_subgraphs) and returns the latency (the last finish, ms), or +infinity when the
/// subgraphs depend on each other in a cycle (no such schedule).
double schedule_latency(const Workload& workload, const ClassGraph& graph, const Placement& placement,
                        std::vector<SubgraphCost>& subgraphs);

/// The device sets of a placement (slots ignored) as DeviceBlocks in pipeline order: a topological
/// order of the sets along the class DAG, smallest device first among the ready ones; sets on a
/// cycle follow in device order. Empty devices are left out.
std::vector<DeviceBlock> pipeline_blocks(const ClassGraph& graph, const Placement& placement);

/// Whether every arc of the class DAG goes forward or stays within a set in the order of `blocks`
/// (from pipeline_blocks): the split is a pipeline, as a training plan's stages must be.
bool placement_pipeline_ordered(const ClassGraph& graph, const Placement& placement, const std::vector<DeviceBlock>& blocks);

}  // namespace partrain::partition
