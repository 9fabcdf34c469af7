// The throughput (max-load) integer program of Tarnawski et al. §5.1.3 (contiguous splits) and §5.2
// (non-contiguous splits), for inference and training (§5.3). The paper's formal program is its
// Appendix C, which the text we work from does not include; this is the program its main text
// describes, on the colour classes of ClassGraph (a class, i.e. a forward node with its backward
// twins, is one unit, which is the co-location constraint x_ui = x_vi of §4 and §5.3):
//
//   minimise   L
//   subject to Σ_d x[c][d] = 1                                   every class on one device
//              Σ_c m_c x[c][d] ≤ M                               accelerator memory
//              y[p][d] ≥ x[own(p)][d] − x[h][d],
//              y[p][d] ≥ x[h][d] − x[own(p)][d]   (h fed by p)   p's output crosses d's boundary
//              L ≥ Σ_c p^acc_c x[c][d] + Σ_p c_p y[p][d]         accelerator load (§5.1.1's acc(S))
//              L ≥ Σ_c p^cpu_c x[c][d]                           CPU load
//              contiguity (§5.1.3 only)
//
// x binary, y continuous in [0, 1] (integral at integral x). §5.2: "our IP natively supports the
// non-contiguous setting, by just removing the contiguity constraint". For training, §5.3 imposes
// contiguity on the forward part; with classes as units it is imposed on the class DAG, the forward
// DAG the DP runs on. Contiguity comes in two formulations (IpContiguity):
//  - reachability, the paper's family (16) on every device (ip_formulation.h, add_contiguity);
//  - pipeline (the default): the devices are positions of a pipeline, with a[c][p] = 1 when class c
//    is on a position ≤ p, binary, non-decreasing in p and down-closed (a[v][p] ≤ a[u][p] for every
//    arc u → v), and x[c][p] = a[c][p] − a[c][p−1]; so position p holds I_p \ I_{p−1} for ideals
//    I_p, which is exactly the DP's space (a split is a chain of ideals). Positions alternate a
//    group of l CPU positions and one accelerator position (l, A, l, A, ..., A, l), of which at
//    most l CPU positions are used (binary u_p ≥ x[c][p], Σ u_p ≤ l): every order of ≤ k
//    accelerator and ≤ l CPU blocks fits. This is a deviation in form, not in meaning: CBC proves
//    optimality on it where it cannot on (16) in the same time (validation/README.md), and its
//    splits are pipelines, as training plans need.
// Optional for unordered devices (break_symmetry): accelerators are interchangeable, and so are
// CPUs; device j of a kind may then hold class c only if device j−1 of that kind holds a class
// earlier in a topological order (prefix-sum columns keep the rows sparse). Every split has one
// labelling that satisfies it; CBC was slower with it on the published workloads, so it is off by
// default.
#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"
#include "partition/tarnawski/integer_program.h"
#include "partition/tarnawski/ip_formulation.h"

namespace partrain::partition {
namespace {

using ip::Assignment;
using ip::Communication;
using ip::Devices;
using ip::Layout;

// Rank of every class in the graph's topological order.
std::vector<std::size_t> topological_rank(const ClassGraph& graph) {
  std::vector<std::size_t> rank(graph.class_count);
  for (std::size_t position = 0; position < graph.topological_order.size(); ++position)
    rank[graph.topological_order[position]] = position;
  return rank;
}

// The pipeline program's positions: l CPU positions, an accelerator, l CPU positions, ..., an
// accelerator, l CPU positions (accelerator j is device j; CPUs are numbered after solving).
Layout pipeline_layout(const Devices& devices) {
  Layout layout;
  auto cpu_group = [&] {
    for (int cpu = 0; cpu < devices.cpus; ++cpu) {
      layout.device.push_back(-1);
      layout.accelerator.push_back(0);
    }
  };
  cpu_group();
  for (int accelerator = 0; accelerator < devices.accelerators; ++accelerator) {
    layout.device.push_back(accelerator);
    layout.accelerator.push_back(1);
    cpu_group();
  }
  return layout;
}

// Positions of a pipeline order of devices (accelerators 0..k-1, CPUs k..): each device takes the
// next free position of its kind, in order.
std::vector<int> embed_in_pipeline(const Layout& layout, const std::vector<int>& order, const Devices& devices) {
  std::vector<int> position_of(static_cast<std::size_t>(devices.count()), -1);
  std::size_t next = 0;
  for (int device : order) {
    const bool accelerator = device < devices.accelerators;
    while (next < layout.size() && (layout.accelerator[next] != 0) != accelerator) ++next;
    PARTRAIN_CHECK(next < layout.size(), "internal error: the DP's split does not fit the pipeline positions");
    position_of[static_cast<std::size_t>(device)] = static_cast<int>(next++);
  }
  return position_of;
}

// prefix[r] = Σ_{r' ≤ r} x[order[r']][previous] for the topological order of classes.
struct PrefixColumns {
  int previous = 0;
  std::vector<int> prefix;
};

// Symmetry-breaking rows for the interchangeable devices first..first+count-1 (one subgraph each).
void add_symmetry_rows(MipModel& model, const ClassGraph& graph, const Assignment& assignment, int first, int count,
                       std::vector<PrefixColumns>& prefix_columns) {
  const std::vector<std::size_t>& order = graph.topological_order;
  for (int j = 1; j < count; ++j) {
    const auto previous = static_cast<std::size_t>(first + j - 1);
    const auto current = static_cast<std::size_t>(first + j);
    std::vector<int> prefix(order.size(), -1);  // the last class needs none
    for (std::size_t r = 0; r + 1 < order.size(); ++r) {
      prefix[r] = model.add_column(0.0, static_cast<double>(r + 1), 0.0, false);
      std::vector<std::pair<int, double>> terms{{prefix[r], 1.0}};
      if (r > 0) terms.emplace_back(prefix[r - 1], -1.0);
      const int x = assignment.x[order[r]][previous];
      if (x >= 0) terms.emplace_back(x, -1.0);
      model.add_row(terms, 0.0, 0.0);
    }
    for (std::size_t r = 0; r < order.size(); ++r) {
      const int x = assignment.x[order[r]][current];
      if (x < 0) continue;
      if (r == 0) {
        model.add_row({{x, 1.0}}, -MipModel::infinity, 0.0);
      } else {
        model.add_row({{x, 1.0}, {prefix[r - 1], -1.0}}, -MipModel::infinity, 0.0);
      }
    }
    prefix_columns.push_back({static_cast<int>(previous), std::move(prefix)});
  }
}

// Relabels devices of each kind so that the symmetry rows hold: non-empty devices first, by the
// smallest topological rank of their classes.
void canonical_labels(const ClassGraph& graph, Placement& placement) {
  const std::vector<std::size_t> rank = topological_rank(graph);
  auto relabel = [&](int first, int count) {
    std::vector<std::pair<std::size_t, int>> smallest;  // (min rank, device)
    for (int device = first; device < first + count; ++device) {
      std::size_t best = graph.class_count;
      for (std::size_t c = 0; c < graph.class_count; ++c)
        if (placement.device_of_class[c] == device) best = std::min(best, rank[c]);
      smallest.emplace_back(best, device);
    }
    std::sort(smallest.begin(), smallest.end());
    std::vector<int> new_label(static_cast<std::size_t>(placement.devices()), -1);
    for (int j = 0; j < count; ++j) new_label[static_cast<std::size_t>(smallest[static_cast<std::size_t>(j)].second)] = first + j;
    for (int& device : placement.device_of_class)
      if (device >= first && device < first + count) device = new_label[static_cast<std::size_t>(device)];
  };
  relabel(0, placement.accelerators);
  relabel(placement.accelerators, placement.cpus);
}

// The classes the program runs on. The contiguous programs run on the DP's classes
// (class_simplification.h: cycles of arcs fused and trivial classes contracted, both exact for
// contiguous splits), so that the pipeline program's space is exactly the DP's; §5.2's program on
// the colour classes, where fusing a cycle that runs through a backward-only class's mirrored arcs
// would forbid non-contiguous splits.
ClassGraph throughput_class_graph(const Workload& workload, const IntegerProgramOptions& options, const Devices& devices) {
  ClassGraphOptions graph_options;
  graph_options.simplify = options.contiguous;
  graph_options.accelerator_memory_bytes = devices.memory_bytes;
  return ClassGraph(workload, graph_options);
}

// Which formulation of the program (see the top of the file).
struct ThroughputForm {
  bool pipeline = false;      // contiguity by pipeline positions
  bool reachability = false;  // contiguity by the family (16)
  bool symmetry = false;      // symmetry-breaking rows
};

// The program's columns: L, x, y, and those of the formulation's contiguity and symmetry rows.
struct ThroughputColumns {
  int max_load = -1;
  Assignment assignment;
  Communication communication;
  std::vector<std::vector<int>> contiguity;  // reachability: z [subgraph][class]
  std::vector<std::vector<int>> before;      // pipeline: a[c][p] for positions 0..P-2 (a[c][P-1] = 1)
  std::vector<int> cpu_used;                 // pipeline: u[p] for CPU positions, else -1 [subgraph]
  std::vector<PrefixColumns> prefix_columns;  // symmetry
};

// L ≥ Σ_c p_c x[c][s] + Σ_p c_p y[p][s] for every subgraph (§5.1.1's acc(S) on accelerators,
// cpu(S) on CPUs).
void add_load_rows(MipModel& model, const ClassGraph& graph, const ThroughputColumns& columns) {
  for (int s = 0; s < columns.assignment.subgraphs(); ++s) {
    std::vector<std::pair<int, double>> terms = ip::load_terms(graph, columns.assignment, columns.communication, s);
    terms.emplace_back(columns.max_load, -1.0);
    model.add_row(terms, -MipModel::infinity, 0.0);  // load(s) − L ≤ 0
  }
}

// The pipeline contiguity (top of the file): binary a[c][p] non-decreasing in p, x[c][p] = a[c][p] −
// a[c][p−1], and a[v][p] ≤ a[u][p] for every arc u → v (each position's prefix is an ideal, §5.1.1).
void add_pipeline_order(MipModel& model, const ClassGraph& graph, ThroughputColumns& columns) {
  const int last = columns.assignment.subgraphs() - 1;
  std::vector<std::vector<int>>& before = columns.before;
  before.assign(graph.class_count, std::vector<int>(static_cast<std::size_t>(std::max(last, 0)), -1));
  for (std::size_t c = 0; c < graph.class_count; ++c)
    for (int p = 0; p < last; ++p) {
      before[c][static_cast<std::size_t>(p)] = model.add_binary();
      if (p > 0)  // a[c][p] ≥ a[c][p−1]
        model.add_row({{before[c][static_cast<std::size_t>(p)], 1.0}, {before[c][static_cast<std::size_t>(p - 1)], -1.0}}, 0.0,
                      MipModel::infinity);
    }
  for (std::size_t c = 0; c < graph.class_count; ++c)
    for (int p = 0; p <= last; ++p) {  // x[c][p] − a[c][p] + a[c][p−1] = 0 (x absent: 0)
      std::vector<std::pair<int, double>> terms;
      const int x = columns.assignment.x[c][static_cast<std::size_t>(p)];
      if (x >= 0) terms.emplace_back(x, 1.0);
      double right = 0.0;
      if (p < last) {
        terms.emplace_back(before[c][static_cast<std::size_t>(p)], -1.0);
      } else {
        right = 1.0;  // a[c][last] = 1 moves to the right-hand side
      }
      if (p > 0) terms.emplace_back(before[c][static_cast<std::size_t>(p - 1)], 1.0);
      model.add_row(terms, right, right);
    }
  for (std::size_t u = 0; u < graph.class_count; ++u)
    for (std::size_t v : graph.successors[u])
      for (int p = 0; p < last; ++p)  // a[v][p] ≤ a[u][p]
        model.add_row({{before[v][static_cast<std::size_t>(p)], 1.0}, {before[u][static_cast<std::size_t>(p)], -1.0}},
                      -MipModel::infinity, 0.0);
}

// At most l of the pipeline's CPU positions used: binary u[p] ≥ x[c][p], Σ_p u[p] ≤ l.
void add_cpu_limit(MipModel& model, const ClassGraph& graph, const Devices& devices, ThroughputColumns& columns) {
  std::vector<std::pair<int, double>> used;
  for (int p = 0; p < columns.assignment.subgraphs(); ++p) {
    if (columns.assignment.accelerator(p)) continue;
    const auto position = static_cast<std::size_t>(p);
    columns.cpu_used[position] = model.add_binary();
    used.emplace_back(columns.cpu_used[position], 1.0);
    for (std::size_t c = 0; c < graph.class_count; ++c)  // x[c][p] ≤ u[p]
      model.add_row({{columns.assignment.x[c][position], 1.0}, {columns.cpu_used[position], -1.0}}, -MipModel::infinity, 0.0);
  }
  model.add_row(used, -MipModel::infinity, devices.cpus);  // at most l CPUs
}

// The whole program (top of the file), columns and rows in this order: L, x with §5.1.3's
// assignment and memory rows, y, the load rows, then the form's contiguity and symmetry rows.
ThroughputColumns add_throughput_program(MipModel& model, const Workload& workload, const ClassGraph& graph,
                                         const Devices& devices, const ThroughputForm& form) {
  ThroughputColumns columns;
  columns.max_load = model.add_column(0.0, MipModel::infinity, 1.0, false);  // minimise L
  columns.assignment = ip::add_assignment(model, workload, graph, devices,
                                          form.pipeline ? pipeline_layout(devices) : ip::device_layout(devices, 1),
                                          /*integer=*/!form.pipeline);
  const int subgraphs = columns.assignment.subgraphs();
  columns.communication = ip::add_communication(model, graph, columns.assignment);
  add_load_rows(model, graph, columns);
  if (form.reachability)
    for (int s = 0; s < subgraphs; ++s) columns.contiguity.push_back(ip::add_contiguity(model, graph, columns.assignment, s));
  columns.cpu_used.assign(static_cast<std::size_t>(subgraphs), -1);
  if (form.pipeline) {
    add_pipeline_order(model, graph, columns);
    if (devices.cpus > 0) add_cpu_limit(model, graph, devices, columns);
  }
  if (form.symmetry) {
    add_symmetry_rows(model, graph, columns.assignment, 0, devices.accelerators, columns.prefix_columns);
    add_symmetry_rows(model, graph, columns.assignment, devices.accelerators, devices.cpus, columns.prefix_columns);
  }
  return columns;
}

// The start vector of the DP's split `start` (devices in pipeline order `order`): its subgraphs
// (pipeline positions, or devices relabelled for the symmetry rows), then every column family, L
// the largest load. Throws partrain::Error if it violates the program.
std::vector<double> start_values(const MipModel& model, const ClassGraph& graph, const Devices& devices,
                                 const ThroughputForm& form, const ThroughputColumns& columns, Placement start,
                                 const std::vector<int>& order) {
  const Assignment& assignment = columns.assignment;
  std::vector<int> subgraph_of_class(graph.class_count);
  if (form.pipeline) {
    const std::vector<int> position = embed_in_pipeline(assignment.layout, order, devices);
    for (std::size_t c = 0; c < graph.class_count; ++c)
      subgraph_of_class[c] = position[static_cast<std::size_t>(start.device_of_class[c])];
  } else {
    if (form.symmetry) canonical_labels(graph, start);
    subgraph_of_class = start.device_of_class;
  }
  std::vector<double> values(static_cast<std::size_t>(model.columns()), 0.0);
  ip::fill_assignment(graph, assignment, subgraph_of_class, values);
  ip::fill_communication(graph, assignment, columns.communication, subgraph_of_class, values);
  for (std::size_t s = 0; s < columns.contiguity.size(); ++s)
    ip::fill_contiguity(graph, static_cast<int>(s), columns.contiguity[s], subgraph_of_class, values);
  for (std::size_t c = 0; c < columns.before.size(); ++c)
    for (std::size_t p = 0; p < columns.before[c].size(); ++p)
      values[static_cast<std::size_t>(columns.before[c][p])] = subgraph_of_class[c] <= static_cast<int>(p) ? 1.0 : 0.0;
  for (std::size_t c = 0; c < graph.class_count; ++c) {
    const int used = columns.cpu_used[static_cast<std::size_t>(subgraph_of_class[c])];
    if (used >= 0) values[static_cast<std::size_t>(used)] = 1.0;
  }
  for (const PrefixColumns& prefix : columns.prefix_columns) {
    double running = 0.0;
    for (std::size_t r = 0; r + 1 < prefix.prefix.size(); ++r) {
      running += start.device_of_class[graph.topological_order[r]] == prefix.previous ? 1.0 : 0.0;
      values[static_cast<std::size_t>(prefix.prefix[r])] = running;
    }
  }
  const auto max_load = static_cast<std::size_t>(columns.max_load);
  for (int s = 0; s < assignment.subgraphs(); ++s) {
    double load = 0.0;
    for (const auto& [column, coefficient] : ip::load_terms(graph, assignment, columns.communication, s))
      load += coefficient * values[static_cast<std::size_t>(column)];
    values[max_load] = std::max(values[max_load], load);
  }
  PARTRAIN_CHECK(model.feasible(values, 1e-6), "internal error: the DP's split violates the throughput program");
  return values;
}

// Subgraphs back to devices: a pipeline's used CPU positions become CPUs accelerators,
// accelerators + 1, ... in order. Returns every class's device.
std::vector<int> devices_of_solution(const ClassGraph& graph, const Devices& devices, const Assignment& assignment,
                                     const MipSolution& solution) {
  const std::vector<int> subgraph_of_class = ip::subgraphs_of(graph, assignment, solution.values);
  std::vector<int> device_of_subgraph = assignment.layout.device;
  std::vector<char> used(static_cast<std::size_t>(assignment.subgraphs()), 0);
  for (int s : subgraph_of_class) used[static_cast<std::size_t>(s)] = 1;
  int next_cpu = devices.accelerators;
  for (int s = 0; s < assignment.subgraphs(); ++s)
    if (device_of_subgraph[static_cast<std::size_t>(s)] < 0 && used[static_cast<std::size_t>(s)])
      device_of_subgraph[static_cast<std::size_t>(s)] = next_cpu++;
  PARTRAIN_CHECK(next_cpu <= devices.count(), "internal error: the pipeline program uses more CPUs than it has");
  std::vector<int> device_of_class;
  for (int s : subgraph_of_class) device_of_class.push_back(device_of_subgraph[static_cast<std::size_t>(s)]);
  return device_of_class;
}

// The solution's placement, its max load, bound and gap, and its blocks in pipeline order, into
// `result`; checks that it fits and, where the program asks, that it is contiguous and a pipeline.
void read_solution(const ClassGraph& graph, const Devices& devices, const IntegerProgramOptions& options,
                   const ThroughputForm& form, const Assignment& assignment, const MipSolution& solution,
                   IntegerProgramResult& result) {
  result.placement.accelerators = devices.accelerators;
  result.placement.cpus = devices.cpus;
  result.placement.device_of_class = devices_of_solution(graph, devices, assignment, solution);
  result.objective_ms = placement_max_load(graph, result.placement);
  PARTRAIN_CHECK(placement_fits(graph, result.placement, devices.memory_bytes),
                 "internal error: the MIP solution does not fit the accelerators");
  result.placement_contiguous = placement_contiguous(graph, result.placement);
  PARTRAIN_CHECK(!options.contiguous || result.placement_contiguous,
                 "internal error: the contiguous program returned a non-contiguous split");
  result.bound_ms = std::min(solution.bound, result.objective_ms);
  result.gap = result.objective_ms > 0 ? (result.objective_ms - result.bound_ms) / result.objective_ms : 0.0;
  const std::vector<DeviceBlock> blocks = pipeline_blocks(graph, result.placement);
  result.pipeline_ordered = placement_pipeline_ordered(graph, result.placement, blocks);
  PARTRAIN_CHECK(!form.pipeline || result.pipeline_ordered, "internal error: the pipeline program returned an unordered split");
  for (const DeviceBlock& block : blocks) {
    SubgraphCost subgraph;
    subgraph.block = block;
    result.subgraphs.push_back(std::move(subgraph));
  }
}

}  // namespace

IntegerProgramResult solve_throughput_ip(const Workload& workload, const IntegerProgramOptions& options) {
  const auto started = std::chrono::steady_clock::now();
  const Devices devices = ip::resolve_devices(workload, options);
  const ClassGraph graph = throughput_class_graph(workload, options, devices);
  ThroughputForm form;
  form.pipeline = options.contiguous && options.contiguity == IpContiguity::pipeline;
  form.reachability = options.contiguous && options.contiguity == IpContiguity::reachability;
  form.symmetry = options.break_symmetry && !form.pipeline;

  MipModel model;
  const ThroughputColumns columns = add_throughput_program(model, workload, graph, devices, form);
  IntegerProgramResult result;
  result.objective = IpObjective::throughput;
  result.contiguous_program = options.contiguous;
  result.class_count = graph.class_count;
  result.variables = model.columns();
  result.integer_variables = model.integer_columns();
  result.constraints = model.rows();

  MipOptions mip_options = ip::solver_options(options);
  Placement start;
  std::vector<int> order;
  if (options.warm_start && ip::dp_placement(workload, graph, devices, options, start, order, result.start_source)) {
    result.start_ms = placement_max_load(graph, start);
    mip_options.start = start_values(model, graph, devices, form, columns, std::move(start), order);
  }
  const MipSolution solution = ip::solve_program(model, mip_options, options, result);
  PARTRAIN_CHECK(solution.status != MipStatus::infeasible,
                 workload.source << ": no feasible " << (options.contiguous ? "contiguous " : "") << "split on "
                                 << devices.accelerators << " accelerators of " << devices.memory_bytes << " bytes and "
                                 << devices.cpus << " CPUs; allow CPUs (--cpus) or give more accelerators or memory");
  PARTRAIN_CHECK(solution.has_solution(),
                 workload.source << ": the solver found no split within the time limit of " << options.time_limit_seconds
                                 << " s (raise --time-limit)");
  read_solution(graph, devices, options, form, columns.assignment, solution, result);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

}  // namespace partrain::partition
