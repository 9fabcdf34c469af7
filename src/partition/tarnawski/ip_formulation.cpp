#include "partition/tarnawski/ip_formulation.h"

#include <algorithm>

#include "core/error.h"
#include "partition/tarnawski/dpl.h"

namespace partrain::partition::ip {
namespace {

// Memory rows are in units of the accelerator memory (right-hand side 1), whatever the byte counts.
// CBC accepts rows violated by up to its primal tolerance (1e-7), so the right-hand side is lowered
// by 2e-7: a solution it returns then fits exactly (placements within 2e-7 of the memory, 3.4 KB of
// 16 GiB, are given up).
constexpr double memory_slack = 2e-7;

}  // namespace

Devices resolve_devices(const Workload& workload, const IntegerProgramOptions& options) {
  Devices devices;
  devices.accelerators = options.accelerators >= 0 ? options.accelerators : workload.accelerators;
  devices.cpus = options.cpus >= 0 ? options.cpus : workload.cpus;
  devices.memory_bytes = options.accelerator_memory_bytes >= 0 ? options.accelerator_memory_bytes
                                                               : workload.accelerator_memory_bytes;
  PARTRAIN_CHECK(devices.count() > 0, workload.source << ": the integer program needs at least one device (accelerators "
                                                      << devices.accelerators << ", CPUs " << devices.cpus << ")");
  return devices;
}

Layout device_layout(const Devices& devices, int slots) {
  Layout layout;
  for (int device = 0; device < devices.count(); ++device)
    for (int slot = 0; slot < slots; ++slot) {
      layout.device.push_back(device);
      layout.accelerator.push_back(device < devices.accelerators ? 1 : 0);
    }
  return layout;
}

Assignment add_assignment(MipModel& model, const Workload& workload, const ClassGraph& graph, const Devices& devices,
                          Layout layout, bool integer) {
  Assignment assignment;
  assignment.layout = std::move(layout);
  const int subgraphs = assignment.subgraphs();
  assignment.x.assign(graph.class_count, std::vector<int>(static_cast<std::size_t>(subgraphs), -1));
  for (std::size_t c = 0; c < graph.class_count; ++c) {
    const bool fits_accelerator = graph.unsupported_count[c] == 0 && graph.size_bytes[c] <= devices.memory_bytes;
    std::vector<std::pair<int, double>> once;
    for (int s = 0; s < subgraphs; ++s) {
      if (assignment.accelerator(s) && !fits_accelerator) continue;
      assignment.x[c][static_cast<std::size_t>(s)] = model.add_column(0.0, 1.0, 0.0, integer);
      once.emplace_back(assignment.x[c][static_cast<std::size_t>(s)], 1.0);
    }
    if (once.empty()) {
      const WorkloadNode& node = workload.nodes[graph.members[c].front()];
      PARTRAIN_FAIL(workload.source << ": node " << node.id << (node.name.empty() ? "" : " (") << node.name
                                    << (node.name.empty() ? "" : ")") << " and its colour class (" << graph.size_bytes[c] << " bytes"
                                    << (graph.unsupported_count[c] > 0 ? ", not supported on accelerators" : "")
                                    << ") fit on no device: " << devices.cpus << " CPUs and accelerators of "
                                    << devices.memory_bytes << " bytes; allow a CPU (--cpus) or give more accelerator memory (--device-memory)");
    }
    model.add_row(once, 1.0, 1.0);
  }
  // Memory per accelerator, summed over its subgraphs; left out when everything fits on one.
  double total_size = 0.0;
  for (std::size_t c = 0; c < graph.class_count; ++c) total_size += graph.size_bytes[c];
  if (total_size > devices.memory_bytes) {
    for (int device = 0; device < devices.accelerators; ++device) {
      std::vector<std::pair<int, double>> terms;
      for (int s = 0; s < subgraphs; ++s) {
        if (!assignment.accelerator(s) || assignment.layout.device[static_cast<std::size_t>(s)] != device) continue;
        for (std::size_t c = 0; c < graph.class_count; ++c) {
          const int column = assignment.x[c][static_cast<std::size_t>(s)];
          if (column >= 0 && graph.size_bytes[c] > 0) terms.emplace_back(column, graph.size_bytes[c] / devices.memory_bytes);
        }
      }
      if (!terms.empty()) model.add_row(terms, -MipModel::infinity, 1.0 - memory_slack);
    }
  }
  return assignment;
}

Communication add_communication(MipModel& model, const ClassGraph& graph, const Assignment& assignment) {
  Communication communication;
  const std::size_t producers = graph.communicating_node.size();
  communication.y.assign(producers, std::vector<int>(static_cast<std::size_t>(assignment.subgraphs()), -1));
  for (std::size_t p = 0; p < producers; ++p) {
    const std::size_t own = graph.class_of_node[graph.communicating_node[p]];
    for (int s = 0; s < assignment.subgraphs(); ++s) {
      if (!assignment.accelerator(s)) continue;
      const int own_x = assignment.x[own][static_cast<std::size_t>(s)];
      int column = -1;
      for (std::size_t head : graph.communicating_classes[p]) {
        if (head == own) continue;
        const int head_x = assignment.x[head][static_cast<std::size_t>(s)];
        if (own_x < 0 && head_x < 0) continue;
        if (column < 0) column = model.add_column(0.0, 1.0, 0.0, false);
        // y ≥ x_own − x_head (own inside, head outside: the output leaves s) and
        // y ≥ x_head − x_own (head inside, own outside: the output enters s).
        std::vector<std::pair<int, double>> out{{column, 1.0}}, in{{column, 1.0}};
        if (own_x >= 0) { out.emplace_back(own_x, -1.0); in.emplace_back(own_x, 1.0); }
        if (head_x >= 0) { out.emplace_back(head_x, 1.0); in.emplace_back(head_x, -1.0); }
        if (own_x >= 0) model.add_row(out, 0.0, MipModel::infinity);
        if (head_x >= 0) model.add_row(in, 0.0, MipModel::infinity);
      }
      communication.y[p][static_cast<std::size_t>(s)] = column;
    }
  }
  return communication;
}

std::vector<std::pair<int, double>> load_terms(const ClassGraph& graph, const Assignment& assignment,
                                               const Communication& communication, int subgraph) {
  std::vector<std::pair<int, double>> terms;
  const bool accelerator = assignment.accelerator(subgraph);
  for (std::size_t c = 0; c < graph.class_count; ++c) {
    const int column = assignment.x[c][static_cast<std::size_t>(subgraph)];
    const double time = accelerator ? graph.accelerator_latency_ms[c] : graph.cpu_latency_ms[c];
    if (column >= 0 && time != 0.0) terms.emplace_back(column, time);
  }
  if (accelerator)
    for (std::size_t p = 0; p < communication.y.size(); ++p) {
      const int column = communication.y[p][static_cast<std::size_t>(subgraph)];
      if (column >= 0) terms.emplace_back(column, graph.communicating_cost_ms[p]);
    }
  return terms;
}

std::vector<int> add_contiguity(MipModel& model, const ClassGraph& graph, const Assignment& assignment, int subgraph) {
  std::vector<int> z(graph.class_count);
  for (std::size_t c = 0; c < graph.class_count; ++c) {
    z[c] = model.add_column(0.0, 1.0, 0.0, false);
    const int x = assignment.x[c][static_cast<std::size_t>(subgraph)];
    if (x >= 0) model.add_row({{z[c], 1.0}, {x, -1.0}}, 0.0, MipModel::infinity);  // z_c ≥ x_c
  }
  for (std::size_t u = 0; u < graph.class_count; ++u)
    for (std::size_t v : graph.successors[u]) {
      model.add_row({{z[u], 1.0}, {z[v], -1.0}}, 0.0, MipModel::infinity);  // z_u ≥ z_v
      const int x_u = assignment.x[u][static_cast<std::size_t>(subgraph)];
      if (x_u < 0) continue;  // u never in s: nothing can leave s through u -> v
      const int x_v = assignment.x[v][static_cast<std::size_t>(subgraph)];
      std::vector<std::pair<int, double>> terms{{z[v], 1.0}, {x_u, 1.0}};
      if (x_v >= 0) terms.emplace_back(x_v, -1.0);
      model.add_row(terms, -MipModel::infinity, 1.0);  // z_v ≤ 1 + x_v − x_u
    }
  return z;
}

std::vector<char> reaching(const ClassGraph& graph, const std::vector<char>& set) {
  std::vector<std::vector<std::size_t>> predecessors(graph.class_count);
  for (std::size_t from = 0; from < graph.class_count; ++from)
    for (std::size_t to : graph.successors[from]) predecessors[to].push_back(from);
  std::vector<char> result = set;
  std::vector<std::size_t> pending;
  for (std::size_t c = 0; c < graph.class_count; ++c)
    if (set[c]) pending.push_back(c);
  while (!pending.empty()) {
    const std::size_t c = pending.back();
    pending.pop_back();
    for (std::size_t from : predecessors[c])
      if (!result[from]) {
        result[from] = 1;
        pending.push_back(from);
      }
  }
  return result;
}

void fill_assignment(const ClassGraph& graph, const Assignment& assignment, const std::vector<int>& subgraph_of_class,
                     std::vector<double>& values) {
  for (std::size_t c = 0; c < graph.class_count; ++c) {
    for (int column : assignment.x[c])
      if (column >= 0) values.at(static_cast<std::size_t>(column)) = 0.0;
    const int column = assignment.x[c].at(static_cast<std::size_t>(subgraph_of_class[c]));
    PARTRAIN_CHECK(column >= 0, "internal error: the start placement puts class " << c << " where it may not go");
    values.at(static_cast<std::size_t>(column)) = 1.0;
  }
}

void fill_communication(const ClassGraph& graph, const Assignment& assignment, const Communication& communication,
                        const std::vector<int>& subgraph_of_class, std::vector<double>& values) {
  for (std::size_t p = 0; p < communication.y.size(); ++p)
    for (int s = 0; s < assignment.subgraphs(); ++s) {
      const int column = communication.y[p][static_cast<std::size_t>(s)];
      if (column < 0) continue;
      std::size_t inside = 0;
      for (std::size_t c : graph.communicating_classes[p]) inside += subgraph_of_class[c] == s;
      values.at(static_cast<std::size_t>(column)) =
          inside > 0 && inside < graph.communicating_classes[p].size() ? 1.0 : 0.0;
    }
}

void fill_contiguity(const ClassGraph& graph, int subgraph, const std::vector<int>& z,
                     const std::vector<int>& subgraph_of_class, std::vector<double>& values) {
  std::vector<char> set(graph.class_count, 0);
  for (std::size_t c = 0; c < graph.class_count; ++c) set[c] = subgraph_of_class[c] == subgraph;
  const std::vector<char> reach = reaching(graph, set);
  for (std::size_t c = 0; c < graph.class_count; ++c) values.at(static_cast<std::size_t>(z[c])) = reach[c] ? 1.0 : 0.0;
}

std::vector<int> subgraphs_of(const ClassGraph& graph, const Assignment& assignment, const std::vector<double>& values) {
  std::vector<int> subgraph_of_class(graph.class_count, -1);
  for (std::size_t c = 0; c < graph.class_count; ++c) {
    double best_value = -1.0;
    for (int s = 0; s < assignment.subgraphs(); ++s) {
      const int column = assignment.x[c][static_cast<std::size_t>(s)];
      if (column >= 0 && values[static_cast<std::size_t>(column)] > best_value) {
        best_value = values[static_cast<std::size_t>(column)];
        subgraph_of_class[c] = s;
      }
    }
    PARTRAIN_CHECK(best_value > 0.5, "internal error: the MIP solution places class " << c << " nowhere");
  }
  return subgraph_of_class;
}

bool dp_placement(const Workload& workload, const ClassGraph& graph, const Devices& devices,
                  const IntegerProgramOptions& options, Placement& placement, std::vector<int>& order, std::string& source) {
  PartitionOptions dp_options;
  dp_options.accelerators = devices.accelerators;
  dp_options.cpus = devices.cpus;
  dp_options.accelerator_memory_bytes = devices.memory_bytes;
  dp_options.max_ideals = options.max_ideals;
  PartitionResult split;
  try {
    try {
      split = partition_ideals(workload, dp_options);
      source = "dp";
    } catch (const TooManyIdealsError&) {
      split = partition_linearised(workload, dp_options);
      source = "dpl";
    }
  } catch (const Error&) {
    return false;  // no feasible contiguous split
  }
  placement = Placement{};
  placement.accelerators = devices.accelerators;
  placement.cpus = devices.cpus;
  placement.device_of_class.assign(graph.class_count, -1);
  order.clear();
  for (const DeviceBlock& block : split.devices) {  // in pipeline order
    const int device = block.accelerator ? block.device_index : devices.accelerators + block.device_index;
    order.push_back(device);
    for (std::size_t node : block.nodes) placement.device_of_class[graph.class_of_node[node]] = device;
  }
  for (int device : placement.device_of_class)
    PARTRAIN_CHECK(device >= 0, "internal error: the DP's split leaves a class unplaced");
  return true;
}

MipOptions solver_options(const IntegerProgramOptions& options) {
  MipOptions mip_options;
  mip_options.time_limit_seconds = options.time_limit_seconds;
  mip_options.relative_gap = options.relative_gap;
  mip_options.threads = options.threads;
  mip_options.log = options.log;
  return mip_options;
}

MipSolution solve_program(const MipModel& model, const MipOptions& mip_options, const IntegerProgramOptions& options,
                          IntegerProgramResult& result) {
  if (!options.write_lp.empty()) write_mip_lp(model, options.write_lp);
  MipSolution solution = solve_mip(model, mip_options);
  result.status = solution.status;
  result.solver_seconds = solution.seconds;
  result.solver_cpu_seconds = solution.cpu_seconds;
  result.nodes = solution.nodes;
  return solution;
}

}  // namespace partrain::partition::ip
