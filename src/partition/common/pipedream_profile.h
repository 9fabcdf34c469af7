#pragma once
// PipeDream per-layer profiles (msr-fiddle/pipedream `graph.txt`, copied into
// ctest/data/pipedream-profiles; format in its FORMAT.md): real measured forward/backward times,
// activation and parameter sizes of the layers of VGG-16, ResNet-50, AlexNet, GNMT, ... . They let
// the planners be tested on real layer costs: `layer_chain_graph` turns a profile into a partrain
// Graph with one task per profile node, and `make_layer_profile_cost_model` answers the planners'
// cost queries from the profile's figures.
#include <cstdint>
#include <istream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "graph/graph.h"
#include "partition/common/cost_model.h"

namespace partrain::partition {

/// One node (layer) of a PipeDream profile. Times in ms and sizes in bytes for the profiled minibatch.
struct PipeDreamNode {
  std::string id;                 // "node11"
  std::string description;        // module description, e.g. "Conv2d(128, 256, kernel_size=(3, 3), ...)"
  double forward_ms = 0;          // forward_compute_time
  double backward_ms = 0;         // backward_compute_time
  double activation_bytes = 0;    // activation_size (a list [a1; a2] is summed)
  double parameter_bytes = 0;     // parameter_size
  int stage_id = -1;              // "-- stage_id=N" of *_partitioned.txt files, -1 when absent
  int line = 0;                   // 1-based line of the node in the file
};

/// A parsed profile: nodes in file order, edges as (source, destination) indices into `nodes`.
struct PipeDreamProfile {
  std::string source;                           // file name, for messages
  std::vector<PipeDreamNode> nodes;
  std::vector<std::pair<int, int>> edges;
  /// Node index by id; -1 when absent.
  int find(const std::string& id) const;
  /// A topological order of the node indices (Kahn's algorithm; ties broken by the number in the
  /// node id, "node9" before "node10", then by file order). Throws partrain::Error naming the source
  /// on a cycle.
  std::vector<int> topological_order() const;
};

/// Parses the text of a graph.txt; `source_name` names it in errors. Throws partrain::Error naming
/// the source and line for a malformed node line (missing " -- " parts, a missing or non-numeric
/// forward_compute_time / backward_compute_time / activation_size / parameter_size), a duplicate
/// node id, or an edge naming an unknown node.
PipeDreamProfile parse_pipedream_profile(std::istream& input, const std::string& source_name);

/// Reads a graph.txt file (see parse_pipedream_profile). Throws partrain::Error naming the file when
/// it cannot be opened or is malformed.
PipeDreamProfile read_pipedream_profile(const std::string& path);

/// A partrain Graph with one task per profile node, tasks in `profile.topological_order()` (task id
/// i is node topological_order()[i]) and named after the node ids. Shapes are tiny so inference
/// works: one input x [B, 1]; a node without predecessors is Relu(x), a node with one predecessor is
/// Relu of it (or a Slice back to width 1 after a Concat), a node with several is their Concat along
/// axis 1; nodes without successors are graph outputs. The graph's own FLOPs and bytes are
/// meaningless: cost comes from make_layer_profile_cost_model.
Graph layer_chain_graph(const PipeDreamProfile& profile);

/// A CostModel answering from the profile's measurements for tasks of layer_chain_graph(profile):
/// for a task set at `batch` samples, forward/backward seconds = Σ node ms / 1000 · batch /
/// profiled_batch, activation bytes = Σ activation_size · batch / profiled_batch, parameter bytes =
/// Σ parameter_size, boundary input/output bytes = the scaled activation_size of the nodes whose
/// output crosses the set's boundary (each producer counted once), peak = activation + the largest
/// single node's scaled activation. Transfers and all-reduce as in the analytic model (DeviceSpec
/// bandwidths). `profiled_batch` is the profile's minibatch (128 for ResNet/VGG, 256 for AlexNet).
/// Throws partrain::Error for a non-positive profiled batch, or (from measure) for task ids outside
/// the graph. The profile is copied.
std::unique_ptr<CostModel> make_layer_profile_cost_model(const PipeDreamProfile& profile, const DeviceSpec& device,
                                                         std::int64_t profiled_batch);

}  // namespace partrain::partition
