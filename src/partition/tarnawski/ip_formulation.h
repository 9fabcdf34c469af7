#pragma once
// Building blocks of the Tarnawski et al. integer programs shared by throughput_ip.cpp (§5.1.3,
// §5.2) and latency_ip.cpp (§4): placement variables x, communication variables, the contiguity
// family, and turning a placement into a start solution or a solution back into a placement.
// Internal to src/partition. A program places classes on "subgraphs": each is one device's whole
// set (throughput), one of a device's q time slots (latency), or one position of a pipeline
// (the pipeline-ordered throughput program).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "partition/tarnawski/ideals_dp.h"
#include "partition/tarnawski/integer_program.h"
#include "partition/tarnawski/mip_solver.h"
#include "partition/tarnawski/placement_evaluation.h"

namespace partrain::partition::ip {

/// Device counts and accelerator memory after applying the options' overrides to the workload's.
struct Devices {
  int accelerators = 0;
  int cpus = 0;
  double memory_bytes = 0.0;
  int count() const { return accelerators + cpus; }
};
Devices resolve_devices(const Workload& workload, const IntegerProgramOptions& options);

/// What each subgraph is: accelerator or CPU, and which device (accelerators 0..k-1, CPUs k..;
/// -1 for a CPU position of the pipeline program, whose CPU is numbered after solving).
struct Layout {
  std::vector<int> device;
  std::vector<char> accelerator;
  std::size_t size() const { return device.size(); }
};

/// One subgraph per device (slots = 1) or q per device: subgraph s = device × slots + slot.
Layout device_layout(const Devices& devices, int slots);

/// x[c][s] ∈ {0,1}: class c on subgraph s; -1 where c may not go (an accelerator that does not
/// support it or is too small for it).
struct Assignment {
  Layout layout;
  std::vector<std::vector<int>> x;  // [class][subgraph]
  int subgraphs() const { return static_cast<int>(layout.size()); }
  bool accelerator(int subgraph) const { return layout.accelerator[static_cast<std::size_t>(subgraph)] != 0; }
};

/// Adds x (binary, or continuous in [0, 1] when `integer` is false because other integer columns
/// determine it) with Σ_s x[c][s] = 1 per class and Σ_{s on d} size_c x[c][s] ≤ M per accelerator
/// d (in units of M in the rows, for the solver's numerics). Throws partrain::Error naming the
/// workload and a node when a class fits nowhere.
Assignment add_assignment(MipModel& model, const Workload& workload, const ClassGraph& graph, const Devices& devices,
                          Layout layout, bool integer = true);

/// y[p][s] ∈ [0,1] for communicating node p (ClassGraph::communicating_*) and accelerator
/// subgraph s: y ≥ x[own][s] − x[h][s] and y ≥ x[h][s] − x[own][s] for every class h it feeds, so
/// y = 1 when s holds some but not all of p's classes (p's output crosses s's boundary, §3).
struct Communication {
  std::vector<std::vector<int>> y;  // [communicating node][subgraph]; -1 on CPU subgraphs
};
Communication add_communication(MipModel& model, const ClassGraph& graph, const Assignment& assignment);

/// Terms of subgraph s's load: Σ p_c x[c][s] (accelerator or CPU latency) + Σ cost_p y[p][s].
std::vector<std::pair<int, double>> load_terms(const ClassGraph& graph, const Assignment& assignment,
                                               const Communication& communication, int subgraph);

/// The contiguity family for subgraph s (Definition 3.1, the paper's constraints (16)): z[c] ∈ [0,1]
/// with z[c] ≥ x[c][s], z[u] ≥ z[v] and z[v] ≤ 1 + x[v][s] − x[u][s] for every arc u → v of the
/// class DAG. z marks the classes from which s is reachable; the last row forbids leaving s and
/// coming back. z need not be integer: for integral x the rows force z to the reachability
/// indicator's bounds. Returns the z columns.
std::vector<int> add_contiguity(MipModel& model, const ClassGraph& graph, const Assignment& assignment, int subgraph);

/// Classes in `set` or from which a class of `set` is reachable (the value of z for that set).
std::vector<char> reaching(const ClassGraph& graph, const std::vector<char>& set);

/// The start vector's x, y and z entries when class c is on subgraph subgraph_of_class[c] (other
/// columns left as they are). Throws partrain::Error if a class is where it may not go.
void fill_assignment(const ClassGraph& graph, const Assignment& assignment, const std::vector<int>& subgraph_of_class,
                     std::vector<double>& values);
void fill_communication(const ClassGraph& graph, const Assignment& assignment, const Communication& communication,
                        const std::vector<int>& subgraph_of_class, std::vector<double>& values);
void fill_contiguity(const ClassGraph& graph, int subgraph, const std::vector<int>& z,
                     const std::vector<int>& subgraph_of_class, std::vector<double>& values);

/// The subgraph of every class in a solution (the x column above 1/2).
std::vector<int> subgraphs_of(const ClassGraph& graph, const Assignment& assignment, const std::vector<double>& values);

/// The contiguous split of the ideal DP (or DPL beyond options.max_ideals): the placement (one
/// slot), its devices in pipeline order in `order`, and "dp" or "dpl" in `source`. Returns false
/// when neither finds a feasible split.
bool dp_placement(const Workload& workload, const ClassGraph& graph, const Devices& devices,
                  const IntegerProgramOptions& options, Placement& placement, std::vector<int>& order, std::string& source);

/// The solver's time limit, relative gap, threads and log from the program's options (no start).
MipOptions solver_options(const IntegerProgramOptions& options);

/// Solves `model` with CBC (after writing it as LP to options.write_lp when set) and records the
/// solver's status, wall and CPU seconds and branch-and-bound nodes in `result`. Returns the solution.
MipSolution solve_program(const MipModel& model, const MipOptions& mip_options, const IntegerProgramOptions& options,
                          IntegerProgramResult& result);

}  // namespace partrain::partition::ip
