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

}  // namespace

IntegerProgramResult solve_latency_ip(const Workload& workload, const IntegerProgramOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  for (const WorkloadNode& node : workload.nodes)
    PARTRAIN_CHECK(!node.backward, workload.source << ": the latency program (§4) is for inference workloads, but node "
                                                   << node.id << " is a backward node; use --objective throughput for training");
  const int slots = options.subgraphs_per_device;
  PARTRAIN_CHECK(slots >= 1, "subgraphs per device must be at least 1, got " << slots);
  const ClassGraph graph(workload);
  const Devices devices = ip::resolve_devices(workload, options);
  const std::size_t classes = graph.class_count;

  // Start candidates, each with one slot per device.
  Placement best_start;
  double best_latency = std::numeric_limits<double>::infinity();
  std::string best_source;
  auto consider = [&](Placement candidate, const std::string& source) {
    candidate.slots = slots;
    candidate.slot_of_class.assign(classes, 0);
    const double latency = latency_of(workload, graph, candidate, devices);
    if (latency < best_latency) {
      best_latency = latency;
      best_start = std::move(candidate);
      best_source = source;
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

  // H: every time of an optimal schedule is at most the best start's latency.
  double horizon = 0.0;
  for (std::size_t c = 0; c < classes; ++c) horizon += std::max(graph.accelerator_latency_ms[c], graph.cpu_latency_ms[c]);
  for (std::size_t p = 0; p < graph.communicating_node.size(); ++p)
    horizon += graph.communicating_cost_ms[p] * static_cast<double>(graph.communicating_classes[p].size());
  if (std::isfinite(best_latency)) horizon = std::min(horizon, best_latency);
  horizon = horizon * (1.0 + 1e-6) + 1e-6;

  // Class-level data dependencies (zero-cost edges too) and, per class, the earliest time its
  // output can be in RAM: the longest path to it with every class at its fastest device's time.
  // The classes of a path run one after another (within a subgraph, or in subgraphs that wait for
  // each other), so Latency_c ≥ earliest[c]: the bound that makes the LP useful (the big-M rows
  // alone give almost nothing).
  std::set<std::pair<std::size_t, std::size_t>> arcs;
  std::vector<std::vector<std::size_t>> predecessors(classes);
  for (const WorkloadEdge& edge : workload.edges) {
    const std::size_t from = graph.class_of_node[edge.source];
    const std::size_t to = graph.class_of_node[edge.destination];
    if (from != to && arcs.emplace(from, to).second) predecessors[to].push_back(from);
  }
  std::vector<double> earliest(classes, 0.0);
  for (std::size_t c : graph.topological_order) {  // the forward DAG holds every arc of an inference graph
    const bool on_accelerator = devices.accelerators > 0 && graph.unsupported_count[c] == 0 &&
                                graph.size_bytes[c] <= devices.memory_bytes;
    double fastest = std::numeric_limits<double>::infinity();
    if (on_accelerator) fastest = graph.accelerator_latency_ms[c];
    if (devices.cpus > 0) fastest = std::min(fastest, graph.cpu_latency_ms[c]);
    if (!std::isfinite(fastest)) fastest = 0.0;  // fits nowhere: add_assignment says so
    double ready = 0.0;
    for (std::size_t u : predecessors[c]) ready = std::max(ready, earliest[u]);
    earliest[c] = ready + fastest;
  }

  MipModel model;
  const int total = model.add_column(0.0, horizon, 1.0, false);
  const ip::Assignment assignment = ip::add_assignment(model, workload, graph, devices, ip::device_layout(devices, slots));
  const ip::Communication communication = ip::add_communication(model, graph, assignment);
  const int subgraphs = assignment.subgraphs();
  std::vector<std::vector<int>> contiguity;
  for (int s = 0; s < subgraphs; ++s) contiguity.push_back(ip::add_contiguity(model, graph, assignment, s));
  std::vector<int> start(static_cast<std::size_t>(subgraphs)), finish(static_cast<std::size_t>(subgraphs));
  for (int s = 0; s < subgraphs; ++s) {
    start[static_cast<std::size_t>(s)] = model.add_column(0.0, horizon, 0.0, false);
    finish[static_cast<std::size_t>(s)] = model.add_column(0.0, horizon, 0.0, false);
    std::vector<std::pair<int, double>> terms;
    for (const auto& [column, coefficient] : ip::load_terms(graph, assignment, communication, s)) terms.emplace_back(column, -coefficient);
    terms.emplace_back(finish[static_cast<std::size_t>(s)], 1.0);
    terms.emplace_back(start[static_cast<std::size_t>(s)], -1.0);
    model.add_row(terms, 0.0, MipModel::infinity);  // Finish − Start − load ≥ 0
    if (s % slots != 0)                            // slots of a device one after the other
      model.add_row({{start[static_cast<std::size_t>(s)], 1.0}, {finish[static_cast<std::size_t>(s - 1)], -1.0}}, 0.0,
                    MipModel::infinity);
  }
  std::vector<int> latency(classes);
  for (std::size_t c = 0; c < classes; ++c) {
    latency[c] = model.add_column(std::min(earliest[c], horizon), horizon, 0.0, false);
    model.add_row({{total, 1.0}, {latency[c], -1.0}}, 0.0, MipModel::infinity);  // T ≥ Latency_c
    for (int s = 0; s < subgraphs; ++s) {
      const int x = assignment.x[c][static_cast<std::size_t>(s)];
      if (x < 0) continue;  // Latency_c ≥ Finish_s − H (1 − x)
      model.add_row({{latency[c], 1.0}, {finish[static_cast<std::size_t>(s)], -1.0}, {x, -horizon}}, -horizon,
                    MipModel::infinity);
    }
  }
  for (const auto& [u, v] : arcs)  // Latency_v ≥ Latency_u: v's subgraph is u's or waits for u
    model.add_row({{latency[v], 1.0}, {latency[u], -1.0}}, 0.0, MipModel::infinity);
  for (const auto& [u, v] : arcs)
    for (int s = 0; s < subgraphs; ++s) {
      const int x_v = assignment.x[v][static_cast<std::size_t>(s)];
      if (x_v < 0) continue;  // Start_s ≥ Latency_u − H (1 − x_v) − H x_u
      std::vector<std::pair<int, double>> terms{{start[static_cast<std::size_t>(s)], 1.0}, {latency[u], -1.0}, {x_v, -horizon}};
      const int x_u = assignment.x[u][static_cast<std::size_t>(s)];
      if (x_u >= 0) terms.emplace_back(x_u, horizon);
      model.add_row(terms, -horizon, MipModel::infinity);
    }

  IntegerProgramResult result;
  result.objective = IpObjective::latency;
  result.contiguous_program = true;
  result.class_count = classes;
  result.variables = model.columns();
  result.integer_variables = model.integer_columns();
  result.constraints = model.rows();

  MipOptions mip_options = ip::solver_options(options);
  if (std::isfinite(best_latency)) {
    result.start_ms = best_latency;
    result.start_source = best_source;
    std::vector<double> values(static_cast<std::size_t>(model.columns()), 0.0);
    std::vector<int> subgraph_of_class(classes);
    for (std::size_t c = 0; c < classes; ++c) subgraph_of_class[c] = best_start.device_of_class[c] * slots + best_start.slot(c);
    ip::fill_assignment(graph, assignment, subgraph_of_class, values);
    ip::fill_communication(graph, assignment, communication, subgraph_of_class, values);
    for (int s = 0; s < subgraphs; ++s)
      ip::fill_contiguity(graph, s, contiguity[static_cast<std::size_t>(s)], subgraph_of_class, values);
    std::vector<SubgraphCost> scheduled = placement_subgraphs(graph, best_start);
    schedule_latency(workload, graph, best_start, scheduled);
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
      values[static_cast<std::size_t>(start[index])] = start_time[index];
      values[static_cast<std::size_t>(finish[index])] = finish_time[index];
    }
    for (std::size_t c = 0; c < classes; ++c)
      values[static_cast<std::size_t>(latency[c])] =
          finish_time[static_cast<std::size_t>(best_start.device_of_class[c] * slots + best_start.slot(c))];
    values[static_cast<std::size_t>(total)] = best_latency;
    PARTRAIN_CHECK(model.feasible(values, 1e-6), "internal error: the start schedule violates the latency program");
    mip_options.start = std::move(values);
  }

  const MipSolution solution = ip::solve_program(model, mip_options, options, result);
  PARTRAIN_CHECK(solution.status != MipStatus::infeasible,
                 workload.source << ": no feasible placement on " << devices.accelerators << " accelerators of "
                                 << devices.memory_bytes << " bytes and " << devices.cpus
                                 << " CPUs; allow CPUs (--cpus) or give more accelerators or memory");
  PARTRAIN_CHECK(solution.has_solution(), workload.source << ": the solver found no placement within the time limit of "
                                                          << options.time_limit_seconds << " s (raise --time-limit)");
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
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

}  // namespace partrain::partition
