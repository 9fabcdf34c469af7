#pragma once
// The integer programs of Tarnawski et al., "Efficient Algorithms for Device Placement of DNN Graph
// Operators" (NeurIPS 2020), solved with CBC (partition/tarnawski/mip_solver.h):
//  - throughput (max-load) for pipelined inference and training: §5.1.3, contiguous splits (every
//    device set satisfies Definition 3.1: either the paper's per-device constraint family (16), or,
//    by default, devices in pipeline order, which is exactly the DP's space), and §5.2,
//    non-contiguous splits (the same program without contiguity); training graphs keep each colour
//    class (a forward node and its backward twins) on one device, §5.3;
//  - latency for single-stream inference, §4: each device runs q contiguous subgraphs one after
//    another, each uninterrupted once all its inputs are in RAM (q = 1: a contiguous split).
// Both place k accelerators (memory limit, communication through RAM) and l CPUs (no memory limit,
// no communication cost), on the colour classes of ClassGraph (as the DP does). The paper's formal
// programs are its appendices A and C, which the text we have does not include; the programs here
// follow its main text and are written out in throughput_ip.cpp and latency_ip.cpp (and
// validation/README.md). Times in ms, sizes in bytes.
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "partition/tarnawski/ideals_dp.h"
#include "partition/tarnawski/mip_solver.h"
#include "partition/tarnawski/placement_evaluation.h"
#include "partition/tarnawski/workload.h"

namespace partrain::partition {

enum class IpObjective { throughput, latency };

/// How the contiguous throughput program (§5.1.3) imposes contiguity.
enum class IpContiguity {
  /// Devices in pipeline order with cumulative "class on a device ≤ p" variables, down-closed along
  /// the class DAG: every device holds I_p \ I_{p−1} for ideals I_p, the DP's space exactly. CBC
  /// solves it far faster than the paper's family (validation/README.md).
  pipeline,
  /// The paper's contiguity constraints (16) on each device separately (Definition 3.1): also
  /// admits contiguous sets whose device order has a cycle (pipelined as in §5.2).
  reachability,
};

/// "throughput" or "latency"; throws partrain::Error naming `flag` for anything else.
IpObjective parse_ip_objective(const std::string& text, const std::string& flag);

struct IntegerProgramOptions {
  IpObjective objective = IpObjective::throughput;
  bool contiguous = false;                // throughput: §5.1.3 (true) or §5.2 (false)
  IpContiguity contiguity = IpContiguity::pipeline;  // throughput, contiguous: the formulation
  int subgraphs_per_device = 1;           // latency: q contiguous subgraphs per device (§4)
  int accelerators = -1;                  // k; negative: the workload's
  int cpus = -1;                          // l; negative: the workload's
  double accelerator_memory_bytes = -1;   // negative: the workload's
  double time_limit_seconds = 60.0;       // wall clock for the MIP search
  double relative_gap = 1e-4;             // stop once (incumbent − bound) ≤ gap × incumbent
  int threads = 1;                        // CBC threads
  bool warm_start = true;                 // start from the DP's contiguous split (DPL beyond max_ideals);
                                          // latency always also tries everything on one device
  bool break_symmetry = false;            // throughput, unordered devices: order identical ones (throughput_ip.cpp)
  std::size_t max_ideals = 200000;        // cap of the warm start's DP
  bool log = false;                       // CBC's log on stdout
  std::string write_lp;                   // write the program here (LP format) before solving; "": no
};

/// What the program found. `objective_ms` is recomputed from the placement with
/// placement_evaluation.h (max-load or schedule latency), never read from the solver.
struct IntegerProgramResult {
  IpObjective objective = IpObjective::throughput;
  bool contiguous_program = false;        // whether contiguity was imposed
  MipStatus status = MipStatus::no_solution;
  double objective_ms = std::numeric_limits<double>::infinity();
  double bound_ms = 0.0;                  // proven lower bound on the program's optimum
  double gap = std::numeric_limits<double>::infinity();  // (objective − bound) / objective
  double start_ms = std::numeric_limits<double>::infinity();  // value of the warm start (inf: none)
  std::string start_source;               // "dp", "dpl", "single device" or "" (no start)
  double solver_seconds = 0.0;            // CBC alone, wall clock
  double solver_cpu_seconds = 0.0;        // CBC alone, CPU time (differs from wall on a loaded machine)
  double seconds = 0.0;                   // building, warm start, solving, evaluating
  long nodes = 0;                         // branch-and-bound nodes
  int variables = 0, integer_variables = 0, constraints = 0;
  std::size_t class_count = 0;
  Placement placement;                    // class -> device (and slot)
  std::vector<SubgraphCost> subgraphs;    // non-empty subgraphs: throughput in pipeline order
                                          // (pipeline_blocks), latency by start time
  bool placement_contiguous = false;      // every device's (slot's) class set contiguous
  bool pipeline_ordered = false;          // the device sets can be ordered so all edges go forward
};

/// The throughput (max-load) program of §5.1.3 (options.contiguous) or §5.2. Throws
/// partrain::Error when it is infeasible (naming the device counts and memory), or when the time
/// limit passes before any solution (naming --time-limit); a solution cut short by the time limit
/// is returned with status feasible and its gap.
IntegerProgramResult solve_throughput_ip(const Workload& workload, const IntegerProgramOptions& options);

/// The latency program of §4 for inference workloads (no backward nodes). Throws partrain::Error on
/// a training workload, when infeasible, or when no solution is found within the time limit.
IntegerProgramResult solve_latency_ip(const Workload& workload, const IntegerProgramOptions& options);

/// Dispatches on options.objective.
IntegerProgramResult solve_integer_program(const Workload& workload, const IntegerProgramOptions& options);

}  // namespace partrain::partition
