#include "partition/tarnawski/workload.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <unordered_map>

#include "core/error.h"
#include <nlohmann/json.hpp>

namespace partrain::partition {
namespace {

using nlohmann::json;

const json& require_key(const json& object, const char* key, const std::string& where) {
  PARTRAIN_CHECK(object.is_object(), where << ": expected a JSON object");
  auto found = object.find(key);
  PARTRAIN_CHECK(found != object.end(), where << ": missing key '" << key << "'");
  return *found;
}

double number_of(const json& value, const char* key, const std::string& where) {
  PARTRAIN_CHECK(value.is_number(), where << ": key '" << key << "' must be a number, got " << value.dump());
  return value.get<double>();
}

// 0/1 or true/false.
bool flag_of(const json& value, const char* key, const std::string& where) {
  if (value.is_boolean()) return value.get<bool>();
  PARTRAIN_CHECK(value.is_number(), where << ": key '" << key << "' must be 0/1 or a boolean, got " << value.dump());
  return value.get<double>() != 0.0;
}

long integer_of(const json& value, const char* key, const std::string& where) {
  const double number = number_of(value, key, where);
  // Range first: casting a double outside long's range is undefined behaviour.
  PARTRAIN_CHECK(std::abs(number) <= 9007199254740992.0,  // 2^53: every integer up to it is exact
                 where << ": key '" << key << "' must be an integer of magnitude at most 2^53, got " << value.dump());
  PARTRAIN_CHECK(number == static_cast<double>(static_cast<long>(number)),
                 where << ": key '" << key << "' must be an integer, got " << value.dump());
  return static_cast<long>(number);
}

// A device count: an integer that fits an int (a larger one would wrap when narrowed).
int device_count_of(const json& value, const char* key, const std::string& where) {
  const long count = integer_of(value, key, where);
  PARTRAIN_CHECK(count <= std::numeric_limits<int>::max(), where << ": key '" << key << "' = " << count << " is too large");
  return static_cast<int>(count);
}

}  // namespace

Workload parse_workload(const json& document, const std::string& source_name) {
  Workload workload;
  workload.source = source_name;
  workload.accelerator_memory_bytes =
      number_of(require_key(document, "maxSizePerFPGA", source_name), "maxSizePerFPGA", source_name);
  workload.accelerators = device_count_of(require_key(document, "maxFPGAs", source_name), "maxFPGAs", source_name);
  workload.cpus = device_count_of(require_key(document, "maxCPUs", source_name), "maxCPUs", source_name);
  PARTRAIN_CHECK(workload.accelerators >= 0 && workload.cpus >= 0,
                 source_name << ": maxFPGAs and maxCPUs must be non-negative");
  PARTRAIN_CHECK(workload.accelerator_memory_bytes >= 0,
                 source_name << ": key 'maxSizePerFPGA' must be non-negative, got " << workload.accelerator_memory_bytes);
  const json& nodes = require_key(document, "nodes", source_name);
  PARTRAIN_CHECK(nodes.is_array(), source_name << ": key 'nodes' must be an array");
  std::unordered_map<long, std::size_t> index_of_id;
  for (std::size_t position = 0; position < nodes.size(); ++position) {
    const json& entry = nodes[position];
    std::string where = source_name + ": node #" + std::to_string(position);
    WorkloadNode node;
    node.id = integer_of(require_key(entry, "id", where), "id", where);
    where = source_name + ": node " + std::to_string(node.id);
    if (auto name = entry.find("name"); name != entry.end() && name->is_string()) node.name = name->get<std::string>();
    node.cpu_latency_ms = number_of(require_key(entry, "cpuLatency", where), "cpuLatency", where);
    node.accelerator_latency_ms = number_of(require_key(entry, "fpgaLatency", where), "fpgaLatency", where);
    node.size_bytes = number_of(require_key(entry, "size", where), "size", where);
    node.supported_on_accelerator = flag_of(require_key(entry, "supportedOnFpga", where), "supportedOnFpga", where);
    node.backward = flag_of(require_key(entry, "isBackwardNode", where), "isBackwardNode", where);
    if (auto color = entry.find("colorClass"); color != entry.end() && !color->is_null()) {
      node.has_color_class = true;
      node.color_class = integer_of(*color, "colorClass", where);
    }
    PARTRAIN_CHECK(node.cpu_latency_ms >= 0.0 && node.accelerator_latency_ms >= 0.0 && node.size_bytes >= 0.0,
                   where << ": latencies and size must be non-negative");
    PARTRAIN_CHECK(index_of_id.emplace(node.id, workload.nodes.size()).second, where << ": duplicate node id");
    workload.nodes.push_back(std::move(node));
  }
  const json& edges = require_key(document, "edges", source_name);
  PARTRAIN_CHECK(edges.is_array(), source_name << ": key 'edges' must be an array");
  for (std::size_t position = 0; position < edges.size(); ++position) {
    const json& entry = edges[position];
    const std::string where = source_name + ": edge #" + std::to_string(position);
    const long source_id = integer_of(require_key(entry, "sourceId", where), "sourceId", where);
    const long destination_id = integer_of(require_key(entry, "destId", where), "destId", where);
    WorkloadEdge edge;
    edge.cost_ms = number_of(require_key(entry, "cost", where), "cost", where);
    PARTRAIN_CHECK(edge.cost_ms >= 0.0, where << ": cost must be non-negative");
    auto source = index_of_id.find(source_id);
    PARTRAIN_CHECK(source != index_of_id.end(), where << " (" << source_id << " -> " << destination_id
                                                      << "): unknown source node " << source_id);
    auto destination = index_of_id.find(destination_id);
    PARTRAIN_CHECK(destination != index_of_id.end(), where << " (" << source_id << " -> " << destination_id
                                                           << "): unknown destination node " << destination_id);
    edge.source = source->second;
    edge.destination = destination->second;
    workload.edges.push_back(edge);
  }
  return workload;
}

Workload read_workload(const std::string& path) {
  std::ifstream stream(path);
  PARTRAIN_CHECK(stream.good(), "cannot open workload file '" << path << "'");
  json document;
  try {
    document = json::parse(stream);
  } catch (const json::exception& error) {
    PARTRAIN_FAIL(path << ": not valid JSON: " << error.what());
  }
  return parse_workload(document, path);
}

}  // namespace partrain::partition
