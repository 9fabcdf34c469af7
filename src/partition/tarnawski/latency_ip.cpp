// The latency-minimisation integer program of Tarnawski et al. §4 (single-stream inference). The
// paper gives its formal program in Appendix A, which the text we work from does not include; this
// is the program its §4 bullets describe, on colour classes (ClassGraph):
//  - x[c][s] binary: class c on subgraph s = (device d, slot j), q slots per device (§4: "every
//    accelerator holds up to q contiguous subgraphs"; q = 1 is a contiguous split); every class
//    once, accelerator memory summed over a device's slots;
//  - y[p][s] (CommIn/CommOut of §4 in one variable): p's output crosses s's boundary, costing c_p
//    on an accelerator (reading or writing RAM); CPUs pay nothing (§3);
//  - every subgraph is contiguous (the constraint family (16), ip_formulation.h);
//  - Start_s, Finish_s: "for each subgraph, variables that control the time period during which it
//    is processing": Finish_s ≥ Start_s + load_s (communication in, compute, communication out);
//    Start_s ≥ Latency_u − H(1 − x[v][s]) − H x[u][s] for every class arc u → v (s waits for each
//    input from outside); slots of a device in order, Start_{d,j+1} ≥ Finish_{d,j} ("their
//    processing times in our schedule do not overlap");
//  - Latency_c ≥ Finish_s − H(1 − x[c][s]): c's output is in RAM when its subgraph finishes;
//  - minimise T ≥ Latency_c for every c.
// Two valid additions make the LP bound useful: Latency_v ≥ Latency_u for every arc u → v, and
// Latency_c ≥ the longest path to c at each class's fastest device time (the classes of a path run
// one after another). H bounds every time in an optimal schedule: the latency of the best start
// (everything on one CPU, everything on one accelerator, and with warm_start the DP's throughput
// split), else the sum of all compute and communication. Training graphs (backward nodes) are refused: their single-stream
// schedule (Figure 2b) needs a forward and a backward subgraph per device.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>

#include "core/error.h"
#include "partition/tarnawski/integer_program.h"
#include "partition/tarnawski/ip_formulation.h"

namespace partrain::partition {
namespace {

using ip::Devices;

// The schedule's latency of `placement` (inf when it has no schedule or does not fit).
double latency_of(const Workload& workload, const ClassGraph& graph, const Placement& placement, const Devices& devices) {
  if (!placement_fits(graph, placement, devices.memory_bytes)) return std::numeric_limits<double>::infinity();
  if (!placement_contiguous(graph, placement)) return std::numeric_limits<double>::infinity();
  std::vector<SubgraphCost> subgraphs = placement_subgraphs(graph, placement);
  return schedule_latency(workload, graph, placement, subgraphs);
}

// Refuses training graphs (see the top of the file) and fewer than one subgraph per device.
void check_latency_inputs(const Workload& workload, int slots) {
  for (const WorkloadNode& node : workload.nodes)
    PARTRAIN_CHECK(!node.backward, workload.source << ": the latency program (§4) is for inference workloads, but node "
                                                   << node.id << " is a backward node; use --objective throughput for training");
  PARTRAIN_CHECK(slots >= 1, "subgraphs per device must be at least 1, got " << slots);
}

// The best start placement and its schedule's latency (inf when no candidate has a schedule).
struct LatencyStart {
  Placement placement;
  double latency_ms = std::numeric_limits<double>::infinity();
  std::string source;
};

// The start candidates, each with one slot per device: everything on one CPU, everything on one
// accelerator, and with warm_start the DP's throughput split; the one of lowest latency.
LatencyStart best_start(const Workload& workload, const ClassGraph& graph, const Devices& devices,
                        const IntegerProgramOptions& options) {
  const int slots = options.subgraphs_per_device;
  const std::size_t classes = graph.class_count;
  LatencyStart best;
  auto consider = [&](Placement candidate, const std::string& source) {
    candidate.slots = slots;
    candidate.slot_of_class.assign(classes, 0);
    const double latency = latency_of(workload, graph, candidate, devices);
    if (latency < best.latency_ms) {
      best.latency_ms = latency;
      best.placement = std::move(candidate);
      best.source = source;
    }
  };
  Placement single;
  single.accelerators = devices.accelerators;
  single.cpus = devices.cpus;
  if (devices.cpus > 0) {
    single.device_of_class.assign(classes, devices.accelerators);
    consider(single, "single device");
  }
  if (devices.accelerators > 0) {
    single.device_of_class.assign(classes, 0);
    consider(single, "single device");
  }
  Placement split;
  std::vector<int> split_order;
  std::string split_source;
  if (options.warm_start && ip::dp_placement(workload, graph, devices, options, split, split_order, split_source))
    consider(split, split_source);
  return best;
}

// H: every time of an optimal schedule is at most the best start's latency, else at most the sum of
// all compute and communication (with a margin for rounding).
double time_horizon(const ClassGraph& graph, double start_latency_ms) {
  double horizon = 0.0;
  for (std::size_t c = 0; c < graph.class_count; ++c)
    horizon += std::max(graph.accelerator_latency_ms[c], graph.cpu_latency_ms[c]);
  for (std::size_t p = 0; p < graph.communicating_node.size(); ++p)
    horizon += graph.communicating_cost_ms[p] * static_cast<double>(graph.communicating_classes[p].size());
  if (std::isfinite(start_latency_ms)) horizon = std::min(horizon, start_latency_ms);
  return horizon * (1.0 + 1e-6) + 1e-6;
}

// Class-level data dependencies (zero-cost edges too), in order, and each class's predecessors.
struct ClassArcs {
  std::set<std::pair<std::size_t, std::size_t>> arcs;
  std::vector<std::vector<std::size_t>> predecessors;
};

ClassArcs class_arcs(const Workload& workload, const ClassGraph& graph) {
  ClassArcs result;
  result.predecessors.resize(graph.class_count);
  for (const WorkloadEdge& edge : workload.edges) {
    const std::size_t from = graph.class_of_node[edge.source];
    const std::size_t to = graph.class_of_node[edge.destination];
    if (from != to && result.arcs.emplace(from, to).second) result.predecessors[to].push_back(from);
  }
  return result;
}

// Per class, the earliest time its output can be in RAM: the longest path to it with every class at
// its fastest device's time. The classes of a path run one after another (within a subgraph, or in
// subgraphs that wait for each other), so Latency_c ≥ earliest[c]: the bound that makes the LP
// useful (the big-M rows alone give almost nothing).
std::vector<double> earliest_finish(const ClassGraph& graph, const Devices& devices, const ClassArcs& arcs) {
  std::vector<double> earliest(graph.class_count, 0.0);
  for (std::size_t c : graph.topological_order) {  // the forward DAG holds every arc of an inference graph
    const bool on_accelerator = devices.accelerators > 0 && graph.unsupported_count[c] == 0 &&
                                graph.size_bytes[c] <= devices.memory_bytes;
    double fastest = std::numeric_limits<double>::infinity();
    if (on_accelerator) fastest = graph.accelerator_latency_ms[c];
    if (devices.cpus > 0) fastest = std::min(fastest, graph.cpu_latency_ms[c]);
    if (!std::isfinite(fastest)) fastest = 0.0;  // fits nowhere: add_assignment says so
    double ready = 0.0;
    for (std::size_t u : arcs.predecessors[c]) ready = std::max(ready, earliest[u]);
    earliest[c] = ready + fastest;
  }
  return earliest;
}

// The program's columns (§4): T, x, y, the contiguity z of every subgraph, Start_s and Finish_s of
// every subgraph, Latency_c of every class.
struct LatencyColumns {
  int total = -1;
  ip::Assignment assignment;
  ip::Communication communication;
  std::vector<std::vector<int>> contiguity;  // [subgraph][class]
  std::vector<int> start, finish;            // [subgraph]
  std::vector<int> latency;                  // [class]
};

// Start_s, Finish_s ∈ [0, H] with Finish_s ≥ Start_s + load_s, and Start_{d,j+1} ≥ Finish_{d,j} for
// the slots of a device (§4: "their processing times in our schedule do not overlap").
void add_subgraph_times(MipModel& model, const ClassGraph& graph, int slots, double horizon, LatencyColumns& columns) {
  const int subgraphs = columns.assignment.subgraphs();
  columns.start.resize(static_cast<std::size_t>(subgraphs));
  columns.finish.resize(static_cast<std::size_t>(subgraphs));
  for (int s = 0; s < subgraphs; ++s) {
    const auto index = static_cast<std::size_t>(s);
    columns.start[index] = model.add_column(0.0, horizon, 0.0, false);
    columns.finish[index] = model.add_column(0.0, horizon, 0.0, false);
    std::vector<std::pair<int, double>> terms;
    for (const auto& [column, coefficient] : ip::load_terms(graph, columns.assignment, columns.communication, s))
      terms.emplace_back(column, -coefficient);
    terms.emplace_back(columns.finish[index], 1.0);
    terms.emplace_back(columns.start[index], -1.0);
    model.add_row(terms, 0.0, MipModel::infinity);  // Finish − Start − load ≥ 0
    if (s % slots != 0)                            // slots of a device one after the other
      model.add_row({{columns.start[index], 1.0}, {columns.finish[index - 1], -1.0}}, 0.0, MipModel::infinity);
  }
}

// Latency_c ∈ [earliest[c], H] with T ≥ Latency_c (§4's objective) and Latency_c ≥ Finish_s − H(1 −
// x[c][s]): c's output is in RAM when its subgraph finishes.
void add_class_latencies(MipModel& model, const std::vector<double>& earliest, double horizon, LatencyColumns& columns) {
  const std::size_t classes = earliest.size();
  const int subgraphs = columns.assignment.subgraphs();
  columns.latency.resize(classes);
  for (std::size_t c = 0; c < classes; ++c) {
    columns.latency[c] = model.add_column(std::min(earliest[c], horizon), horizon, 0.0, false);
    model.add_row({{columns.total, 1.0}, {columns.latency[c], -1.0}}, 0.0, MipModel::infinity);  // T ≥ Latency_c
    for (int s = 0; s < subgraphs; ++s) {
      const int x = columns.assignment.x[c][static_cast<std::size_t>(s)];
      if (x < 0) continue;  // Latency_c ≥ Finish_s − H (1 − x)
      model.add_row({{columns.latency[c], 1.0}, {columns.finish[static_cast<std::size_t>(s)], -1.0}, {x, -horizon}}, -horizon,
                    MipModel::infinity);
    }
  }
}

// Per class arc u → v: Latency_v ≥ Latency_u (the valid addition), then Start_s ≥ Latency_u −
// H(1 − x[v][s]) − H x[u][s] (§4: s waits for each input from outside).
void add_arc_waits(MipModel& model, const ClassArcs& arcs, double horizon, const LatencyColumns& columns) {
  const std::vector<int>& latency = columns.latency;
  for (const auto& [u, v] : arcs.arcs)  // Latency_v ≥ Latency_u: v's subgraph is u's or waits for u
    model.add_row({{latency[v], 1.0}, {latency[u], -1.0}}, 0.0, MipModel::infinity);
  for (const auto& [u, v] : arcs.arcs)
    for (int s = 0; s < columns.assignment.subgraphs(); ++s) {
      const int x_v = columns.assignment.x[v][static_cast<std::size_t>(s)];
      if (x_v < 0) continue;  // Start_s ≥ Latency_u − H (1 − x_v) − H x_u
      std::vector<std::pair<int, double>> terms{{columns.start[static_cast<std::size_t>(s)], 1.0}, {latency[u], -1.0}, {x_v, -horizon}};
      const int x_u = columns.assignment.x[u][static_cast<std::size_t>(s)];
      if (x_u >= 0) terms.emplace_back(x_u, horizon);
      model.add_row(terms, -horizon, MipModel::infinity);
    }
}

// The whole program of §4 (see the top of the file), columns and rows in this order.
LatencyColumns add_latency_program(MipModel& model, const Workload& workload, const ClassGraph& graph, const Devices& devices,
                                   int slots, double horizon, const ClassArcs& arcs, const std::vector<double>& earliest) {
  LatencyColumns columns;
  columns.total = model.add_column(0.0, horizon, 1.0, false);  // minimise T
  columns.assignment = ip::add_assignment(model, workload, graph, devices, ip::device_layout(devices, slots));
  columns.communication = ip::add_communication(model, graph, columns.assignment);
  for (int s = 0; s < columns.assignment.subgraphs(); ++s)
    columns.contiguity.push_back(ip::add_contiguity(model, graph, columns.assignment, s));
  add_subgraph_times(model, graph, slots, horizon, columns);
  add_class_latencies(model, earliest, horizon, columns);
  add_arc_waits(model, arcs, horizon, columns);
  return columns;
}

// The start vector: x, y and z of the start placement, Start_s and Finish_s from its schedule (an
// empty slot starts and ends where the previous one ended), Latency_c its subgraph's finish, T its
// latency. Throws partrain::Error if it violates the program.
std::vector<double> start_values(const MipModel& model, const Workload& workload, const ClassGraph& graph,
                                 const Devices& devices, int slots, const LatencyColumns& columns, const LatencyStart& start) {
  const std::size_t classes = graph.class_count;
  const int subgraphs = columns.assignment.subgraphs();
  const Placement& placement = start.placement;
  std::vector<double> values(static_cast<std::size_t>(model.columns()), 0.0);
  std::vector<int> subgraph_of_class(classes);
  for (std::size_t c = 0; c < classes; ++c) subgraph_of_class[c] = placement.device_of_class[c] * slots + placement.slot(c);
  ip::fill_assignment(graph, columns.assignment, subgraph_of_class, values);
  ip::fill_communication(graph, columns.assignment, columns.communication, subgraph_of_class, values);
  for (int s = 0; s < subgraphs; ++s)
    ip::fill_contiguity(graph, s, columns.contiguity[static_cast<std::size_t>(s)], subgraph_of_class, values);
  std::vector<SubgraphCost> scheduled = placement_subgraphs(graph, placement);
  schedule_latency(workload, graph, placement, scheduled);
  std::vector<double> start_time(static_cast<std::size_t>(subgraphs), -1.0), finish_time(static_cast<std::size_t>(subgraphs), -1.0);
  for (const SubgraphCost& subgraph : scheduled) {
    const int device = subgraph.block.accelerator ? subgraph.block.device_index : devices.accelerators + subgraph.block.device_index;
    const auto s = static_cast<std::size_t>(device * slots + subgraph.slot);
    start_time[s] = subgraph.start_ms;
    finish_time[s] = subgraph.finish_ms;
  }
  for (int s = 0; s < subgraphs; ++s) {  // an empty slot starts and ends where the previous one ended
    auto index = static_cast<std::size_t>(s);
    if (start_time[index] < 0) start_time[index] = finish_time[index] = s % slots == 0 ? 0.0 : finish_time[index - 1];
    values[static_cast<std::size_t>(columns.start[index])] = start_time[index];
    values[static_cast<std::size_t>(columns.finish[index])] = finish_time[index];
  }
  for (std::size_t c = 0; c < classes; ++c)
    values[static_cast<std::size_t>(columns.latency[c])] =
        finish_time[static_cast<std::size_t>(placement.device_of_class[c] * slots + placement.slot(c))];
  values[static_cast<std::size_t>(columns.total)] = start.latency_ms;
  PARTRAIN_CHECK(model.feasible(values, 1e-6), "internal error: the start schedule violates the latency program");
  return values;
}

// The solution's placement (subgraph s = device × slots + slot), its subgraphs in order of start,
// their schedule's latency, the bound and the gap, into `result`.
void read_solution(const Workload& workload, const ClassGraph& graph, const Devices& devices, int slots,
                   const ip::Assignment& assignment, const MipSolution& solution, IntegerProgramResult& result) {
  result.placement.accelerators = devices.accelerators;
  result.placement.cpus = devices.cpus;
  result.placement.slots = slots;
  for (int s : ip::subgraphs_of(graph, assignment, solution.values)) {
    result.placement.device_of_class.push_back(s / slots);
    result.placement.slot_of_class.push_back(s % slots);
  }
  PARTRAIN_CHECK(placement_fits(graph, result.placement, devices.memory_bytes),
                 "internal error: the MIP solution does not fit the accelerators");
  result.placement_contiguous = placement_contiguous(graph, result.placement);
  PARTRAIN_CHECK(result.placement_contiguous, "internal error: the latency program returned a non-contiguous subgraph");
  result.subgraphs = placement_subgraphs(graph, result.placement);
  result.objective_ms = schedule_latency(workload, graph, result.placement, result.subgraphs);
  PARTRAIN_CHECK(std::isfinite(result.objective_ms), "internal error: the latency program's subgraphs have no schedule");
  std::stable_sort(result.subgraphs.begin(), result.subgraphs.end(),
                   [](const SubgraphCost& a, const SubgraphCost& b) { return a.start_ms < b.start_ms; });
  result.bound_ms = std::min(solution.bound, result.objective_ms);
  result.gap = result.objective_ms > 0 ? (result.objective_ms - result.bound_ms) / result.objective_ms : 0.0;
  result.pipeline_ordered = true;  // a schedule exists: the subgraphs' dependencies are acyclic
}

}  // namespace

IntegerProgramResult solve_latency_ip(const Workload& workload, const IntegerProgramOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  const int slots = options.subgraphs_per_device;
  check_latency_inputs(workload, slots);
  const ClassGraph graph(workload);
  const Devices devices = ip::resolve_devices(workload, options);
  const LatencyStart start = best_start(workload, graph, devices, options);
  const double horizon = time_horizon(graph, start.latency_ms);
  const ClassArcs arcs = class_arcs(workload, graph);
  const std::vector<double> earliest = earliest_finish(graph, devices, arcs);

  MipModel model;
  const LatencyColumns columns = add_latency_program(model, workload, graph, devices, slots, horizon, arcs, earliest);
  IntegerProgramResult result;
  result.objective = IpObjective::latency;
  result.contiguous_program = true;
  result.class_count = graph.class_count;
  result.variables = model.columns();
  result.integer_variables = model.integer_columns();
  result.constraints = model.rows();

  MipOptions mip_options = ip::solver_options(options);
  if (std::isfinite(start.latency_ms)) {
    result.start_ms = start.latency_ms;
    result.start_source = start.source;
    mip_options.start = start_values(model, workload, graph, devices, slots, columns, start);
  }
  const MipSolution solution = ip::solve_program(model, mip_options, options, result);
  PARTRAIN_CHECK(solution.status != MipStatus::infeasible,
                 workload.source << ": no feasible placement on " << devices.accelerators << " accelerators of "
                                 << devices.memory_bytes << " bytes and " << devices.cpus
                                 << " CPUs; allow CPUs (--cpus) or give more accelerators or memory");
  PARTRAIN_CHECK(solution.has_solution(), workload.source << ": the solver found no placement within the time limit of "
                                                          << options.time_limit_seconds << " s (raise --time-limit)");
  read_solution(workload, graph, devices, slots, columns.assignment, solution, result);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

}  // namespace partrain::partition
