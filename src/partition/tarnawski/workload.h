#pragma once
// External operator/layer graphs in the JSON format of msr-fiddle/dnn-partitioning (the inputs of
// Table 1 of Tarnawski et al., NeurIPS 2020). See ctest/data/dnn-partitioning/EXPECTED.md.
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>  // declarations only: the full header costs ~3 s per translation unit

namespace partrain::partition {

/// One node of a workload graph. Latencies in ms per profiled minibatch, size in bytes.
struct WorkloadNode {
  long id = 0;                           // the file's node id
  std::string name;                      // debug name (may be empty)
  double cpu_latency_ms = 0.0;           // cpuLatency
  double accelerator_latency_ms = 0.0;   // fpgaLatency
  double size_bytes = 0.0;               // size on an accelerator
  bool supported_on_accelerator = true;  // supportedOnFpga
  bool backward = false;                 // isBackwardNode
  bool has_color_class = false;          // whether colorClass was given
  long color_class = 0;                  // colorClass: same class => same device
};

/// One edge; source/destination are indices into Workload::nodes (not file ids).
struct WorkloadEdge {
  std::size_t source = 0;
  std::size_t destination = 0;
  double cost_ms = 0.0;  // ms to move the source's output between accelerator and host
};

/// A whole workload: graph plus the device counts and accelerator memory it was published with.
struct Workload {
  std::string source;                     // file name, for messages
  double accelerator_memory_bytes = 0.0;  // maxSizePerFPGA
  int accelerators = 0;                   // maxFPGAs (k)
  int cpus = 0;                           // maxCPUs (l)
  std::vector<WorkloadNode> nodes;
  std::vector<WorkloadEdge> edges;
};

/// Converts parsed JSON into a Workload; `source_name` is used in messages. Throws partrain::Error
/// naming the source and the node/edge/key on a missing or ill-typed key, a duplicate node id or an
/// edge naming an unknown node.
Workload parse_workload(const nlohmann::json& document, const std::string& source_name);

/// Reads a dnn-partitioning JSON file. Throws partrain::Error naming the file when it cannot be
/// opened, is not JSON, or is not a valid workload (see parse_workload).
Workload read_workload(const std::string& path);

}  // namespace partrain::partition
