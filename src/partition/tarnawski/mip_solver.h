#pragma once
// A thin mixed-integer programming layer over COIN-OR CBC (Debian coinor-libcbc-dev), used by the
// integer programs of Tarnawski et al. (partition/tarnawski/integer_program.h). The model is built here as a
// sparse matrix and handed to CBC in one piece; nothing of CBC leaks into this header.
#include <cstddef>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace partrain::partition {

/// A mixed-integer linear program: minimise Σ objective_j x_j subject to
/// row_lower_i ≤ Σ_j a_ij x_j ≤ row_upper_i and column_lower_j ≤ x_j ≤ column_upper_j, with some
/// columns integer. Use ±MipModel::infinity for a missing bound.
class MipModel {
 public:
  static constexpr double infinity = std::numeric_limits<double>::infinity();

  /// Adds a column (variable) and returns its index.
  int add_column(double lower, double upper, double objective, bool integer);
  /// Adds a binary column (0 ≤ x ≤ 1, integer) and returns its index.
  int add_binary(double objective = 0.0) { return add_column(0.0, 1.0, objective, true); }
  /// Adds the row lower ≤ Σ coefficient · x[column] ≤ upper over (column, coefficient) terms and
  /// returns its index. Repeated columns are summed; zero coefficients are dropped. Throws
  /// partrain::Error on an unknown column or lower > upper.
  int add_row(const std::vector<std::pair<int, double>>& terms, double lower, double upper);

  int columns() const { return static_cast<int>(column_lower_.size()); }
  int rows() const { return static_cast<int>(row_lower_.size()); }
  int integer_columns() const;
  std::size_t nonzeros() const { return entry_value_.size(); }

  /// Σ a_ij x_j of row i at the point `values` (one value per column).
  double row_activity(int row, const std::vector<double>& values) const;
  /// Whether `values` satisfies every bound, row and integrality within `tolerance` (absolute).
  bool feasible(const std::vector<double>& values, double tolerance = 1e-6) const;
  /// Objective value at `values`.
  double objective_value(const std::vector<double>& values) const;

  // The storage, read by the solver: per column, per row, and the row-major entries.
  const std::vector<double>& column_lower() const { return column_lower_; }
  const std::vector<double>& column_upper() const { return column_upper_; }
  const std::vector<double>& objective() const { return objective_; }
  const std::vector<char>& integer() const { return integer_; }
  const std::vector<double>& row_lower() const { return row_lower_; }
  const std::vector<double>& row_upper() const { return row_upper_; }
  const std::vector<std::size_t>& row_start() const { return row_start_; }
  const std::vector<int>& entry_column() const { return entry_column_; }
  const std::vector<double>& entry_value() const { return entry_value_; }

 private:
  std::vector<double> column_lower_, column_upper_, objective_;
  std::vector<char> integer_;
  std::vector<double> row_lower_, row_upper_;
  std::vector<std::size_t> row_start_{0};  // row i's entries: [row_start_[i], row_start_[i+1])
  std::vector<int> entry_column_;
  std::vector<double> entry_value_;
};

/// How long and how far to search.
struct MipOptions {
  double time_limit_seconds = 60.0;  // wall clock; the best solution found by then is returned (CBC
                                     // checks it between steps: a long root LP or start repair on a
                                     // loaded machine can overrun it)
  double relative_gap = 1e-6;        // stop once (incumbent − bound) ≤ relative_gap × |incumbent|
  int threads = 1;                   // CBC branch-and-cut threads (1: serial, deterministic)
  bool log = false;                  // CBC's own progress log on stdout
  std::vector<double> start;         // a solution to start from (one value per column), or empty
};

enum class MipStatus {
  optimal,      // search finished: the incumbent is within relative_gap of the bound
  feasible,     // stopped by the time limit with a solution; `gap` says how far from proven
  infeasible,   // proven to have no solution
  no_solution,  // stopped by the time limit before finding any solution
};

/// "optimal", "feasible (time limit)", "infeasible", "no solution (time limit)".
const char* to_string(MipStatus status);

/// What the solver found.
struct MipSolution {
  MipStatus status = MipStatus::no_solution;
  double objective = std::numeric_limits<double>::infinity();  // of the incumbent
  double bound = -std::numeric_limits<double>::infinity();     // best proven lower bound
  double gap = std::numeric_limits<double>::infinity();        // (objective − bound) / |objective|
  std::vector<double> values;                                   // the incumbent (empty without one)
  double seconds = 0.0;                                         // wall time of the solve
  double cpu_seconds = 0.0;                                     // CPU time of the process meanwhile
  long nodes = 0;                                               // branch-and-bound nodes
  bool has_solution() const { return status == MipStatus::optimal || status == MipStatus::feasible; }
};

/// Solves `model` (minimisation) with CBC. The start solution, if given, must have one value per
/// column; CBC checks and repairs it. Throws partrain::Error on a malformed start or when CBC
/// abandons the search (numerical trouble).
MipSolution solve_mip(const MipModel& model, const MipOptions& options);

/// Writes `model` in CPLEX LP format to `path` (through CBC's writer), for other solvers (the paper
/// used Gurobi) or inspection; "path.lp" when `path` has no ".lp" suffix. Throws partrain::Error
/// when the file cannot be written.
void write_mip_lp(const MipModel& model, const std::string& path);

/// The CBC version string (e.g. "CBC 2.10.8").
std::string mip_solver_version();

}  // namespace partrain::partition
