// The MIP layer over CBC. Why CBC (COIN-OR Branch and Cut, Debian coinor-libcbc-dev 2.10.8) and not
// GLPK (libglpk-dev 5.0), the two MIP solvers Debian packages, measured on this project's programs
// (the same LP files, cold, 300 s; validation/README.md, "Tarnawski et al.'s integer programs"):
//  - the non-contiguous programs (§5.2, the paper's headline gains) are where the work is: their LP
//    bound is weak (the LP spreads every node over all devices and pays no communication), and
//    closing it takes cuts. CBC proves BERT-3's inference and training optima (21.91, 54.21 ms,
//    Table 1's values) in 32 s and 98 s; GLPK finds the same splits but stops at a 24% and 23% gap.
//    On the contiguous pipeline programs GLPK was about twice as fast where both prove optimality.
//  - CBC takes a MIP start: every program here starts from the DP's contiguous split, so a run cut
//    short by its time limit is never worse than the DP (glpsol takes no MIP start). CBC also
//    searches on several threads (--threads), takes a
//    wall-clock limit and a relative gap, and reports the best bound, printed as the gap.
// The C interface (Cbc_C_Interface.h) runs CBC's standalone driver (CbcMain1) with its default
// cuts and heuristics; parameters go in as the standalone solver's command-line options.
#include "partition/tarnawski/mip_solver.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <coin/Cbc_C_Interface.h>

#include "core/error.h"

namespace partrain::partition {

int MipModel::add_column(double lower, double upper, double objective, bool integer) {
  PARTRAIN_CHECK(!(lower > upper), "MipModel: column bounds " << lower << " > " << upper);
  column_lower_.push_back(lower);
  column_upper_.push_back(upper);
  objective_.push_back(objective);
  integer_.push_back(integer ? 1 : 0);
  return columns() - 1;
}

int MipModel::add_row(const std::vector<std::pair<int, double>>& terms, double lower, double upper) {
  PARTRAIN_CHECK(!(lower > upper), "MipModel: row bounds " << lower << " > " << upper);
  std::vector<std::pair<int, double>> sorted = terms;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  const std::size_t first = entry_column_.size();
  for (const auto& [column, coefficient] : sorted) {
    PARTRAIN_CHECK(column >= 0 && column < columns(), "MipModel: row names unknown column " << column);
    if (entry_column_.size() > first && entry_column_.back() == column) {
      entry_value_.back() += coefficient;
    } else {
      entry_column_.push_back(column);
      entry_value_.push_back(coefficient);
    }
  }
  // Drop entries that summed (or were given) as zero.
  std::size_t kept = first;
  for (std::size_t entry = first; entry < entry_column_.size(); ++entry) {
    if (entry_value_[entry] == 0.0) continue;
    entry_column_[kept] = entry_column_[entry];
    entry_value_[kept] = entry_value_[entry];
    ++kept;
  }
  entry_column_.resize(kept);
  entry_value_.resize(kept);
  row_lower_.push_back(lower);
  row_upper_.push_back(upper);
  row_start_.push_back(entry_column_.size());
  return rows() - 1;
}

int MipModel::integer_columns() const {
  return static_cast<int>(std::count(integer_.begin(), integer_.end(), 1));
}

double MipModel::row_activity(int row, const std::vector<double>& values) const {
  double total = 0.0;
  for (std::size_t entry = row_start_[static_cast<std::size_t>(row)]; entry < row_start_[static_cast<std::size_t>(row) + 1]; ++entry)
    total += entry_value_[entry] * values[static_cast<std::size_t>(entry_column_[entry])];
  return total;
}

bool MipModel::feasible(const std::vector<double>& values, double tolerance) const {
  if (values.size() != column_lower_.size()) return false;
  for (std::size_t column = 0; column < values.size(); ++column) {
    const double value = values[column];
    if (value < column_lower_[column] - tolerance || value > column_upper_[column] + tolerance) return false;
    if (integer_[column] && std::fabs(value - std::round(value)) > tolerance) return false;
  }
  for (int row = 0; row < rows(); ++row) {
    const double activity = row_activity(row, values);
    const double scale = 1.0 + std::fabs(activity);
    if (activity < row_lower_[static_cast<std::size_t>(row)] - tolerance * scale ||
        activity > row_upper_[static_cast<std::size_t>(row)] + tolerance * scale)
      return false;
  }
  return true;
}

double MipModel::objective_value(const std::vector<double>& values) const {
  double total = 0.0;
  for (std::size_t column = 0; column < objective_.size(); ++column) total += objective_[column] * values[column];
  return total;
}

const char* to_string(MipStatus status) {
  switch (status) {
    case MipStatus::optimal: return "optimal";
    case MipStatus::feasible: return "feasible (time limit)";
    case MipStatus::infeasible: return "infeasible";
    case MipStatus::no_solution: return "no solution (time limit)";
  }
  return "?";
}

std::string mip_solver_version() { return std::string("CBC ") + Cbc_getVersion(); }

namespace {

// CBC's model, deleted on every path.
struct CbcHandle {
  Cbc_Model* model = Cbc_newModel();
  ~CbcHandle() { Cbc_deleteModel(model); }
  CbcHandle() = default;
  CbcHandle(const CbcHandle&) = delete;
  CbcHandle& operator=(const CbcHandle&) = delete;
};

// CBC's "infinite" bound.
double cbc_bound(double value) {
  constexpr double big = 1e30;
  if (value == MipModel::infinity) return big;
  if (value == -MipModel::infinity) return -big;
  return value;
}

std::string number_text(double value) {
  std::ostringstream text;
  text.precision(17);
  text << value;
  return text.str();
}

// Loads `model` into `cbc`: row-major entries to CBC's compressed sparse columns.
void load(const MipModel& model, Cbc_Model* cbc) {
  const int columns = model.columns();
  const int rows = model.rows();

  // Row-major entries to column-major (compressed sparse column) for Cbc_loadProblem.
  std::vector<CoinBigIndex> column_start(static_cast<std::size_t>(columns) + 1, 0);
  std::vector<int> row_index;
  std::vector<double> element;
  {
    const auto& entry_column = model.entry_column();
    const auto& entry_value = model.entry_value();
    const auto& row_start = model.row_start();
    for (int column : entry_column) ++column_start[static_cast<std::size_t>(column) + 1];
    for (std::size_t column = 0; column < static_cast<std::size_t>(columns); ++column) column_start[column + 1] += column_start[column];
    row_index.resize(entry_column.size());
    element.resize(entry_column.size());
    std::vector<CoinBigIndex> fill(column_start.begin(), column_start.end() - 1);
    for (int row = 0; row < rows; ++row)
      for (std::size_t entry = row_start[static_cast<std::size_t>(row)]; entry < row_start[static_cast<std::size_t>(row) + 1]; ++entry) {
        const auto position = static_cast<std::size_t>(fill[static_cast<std::size_t>(entry_column[entry])]++);
        row_index[position] = row;
        element[position] = entry_value[entry];
      }
  }
  std::vector<double> column_lower, column_upper, row_lower, row_upper;
  for (int column = 0; column < columns; ++column) {
    column_lower.push_back(cbc_bound(model.column_lower()[static_cast<std::size_t>(column)]));
    column_upper.push_back(cbc_bound(model.column_upper()[static_cast<std::size_t>(column)]));
  }
  for (int row = 0; row < rows; ++row) {
    row_lower.push_back(cbc_bound(model.row_lower()[static_cast<std::size_t>(row)]));
    row_upper.push_back(cbc_bound(model.row_upper()[static_cast<std::size_t>(row)]));
  }

  Cbc_loadProblem(cbc, columns, rows, column_start.data(), row_index.data(), element.data(), column_lower.data(),
                  column_upper.data(), model.objective().data(), row_lower.data(), row_upper.data());
  for (int column = 0; column < columns; ++column)
    if (model.integer()[static_cast<std::size_t>(column)]) Cbc_setInteger(cbc, column);
  Cbc_setObjSense(cbc, 1.0);  // minimise
}

}  // namespace

void write_mip_lp(const MipModel& model, const std::string& path) {
  CbcHandle cbc;
  load(model, cbc.model);
  std::string stem = path;
  if (stem.size() > 3 && stem.compare(stem.size() - 3, 3, ".lp") == 0) stem.resize(stem.size() - 3);
  std::filesystem::remove(stem + ".lp");
  Cbc_writeLp(cbc.model, stem.c_str());  // appends ".lp"
  std::ifstream written(stem + ".lp");
  PARTRAIN_CHECK(written.good(), "cannot write the integer program to '" << stem << ".lp'");
}

MipSolution solve_mip(const MipModel& model, const MipOptions& options) {
  PARTRAIN_CHECK(options.time_limit_seconds > 0.0, "MIP time limit must be positive, got " << options.time_limit_seconds);
  PARTRAIN_CHECK(options.relative_gap >= 0.0, "MIP relative gap must be non-negative, got " << options.relative_gap);
  PARTRAIN_CHECK(options.start.empty() || options.start.size() == static_cast<std::size_t>(model.columns()),
                 "MIP start has " << options.start.size() << " values for " << model.columns() << " columns");
  const int columns = model.columns();
  CbcHandle cbc;
  load(model, cbc.model);
  // The standalone driver's options (CbcMain1 resets the CbcModel's own settings to its defaults).
  Cbc_setLogLevel(cbc.model, options.log ? 1 : 0);  // also quiets the LP path (no integer columns)
  Cbc_setParameter(cbc.model, "log", options.log ? "1" : "0");
  Cbc_setParameter(cbc.model, "timeMode", "elapsed");
  Cbc_setParameter(cbc.model, "seconds", number_text(options.time_limit_seconds).c_str());
  Cbc_setParameter(cbc.model, "ratioGap", number_text(options.relative_gap).c_str());
  if (options.threads > 1) Cbc_setParameter(cbc.model, "threads", std::to_string(options.threads).c_str());
  if (!options.start.empty()) {
    std::vector<int> indices(static_cast<std::size_t>(columns));
    for (int column = 0; column < columns; ++column) indices[static_cast<std::size_t>(column)] = column;
    Cbc_setMIPStartI(cbc.model, columns, indices.data(), options.start.data());
  }

  const auto started = std::chrono::steady_clock::now();
  const std::clock_t cpu_started = std::clock();
  Cbc_solve(cbc.model);
  MipSolution solution;
  solution.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  solution.cpu_seconds = static_cast<double>(std::clock() - cpu_started) / CLOCKS_PER_SEC;
  solution.nodes = Cbc_getNodeCount(cbc.model);
  PARTRAIN_CHECK(!Cbc_isAbandoned(cbc.model), "CBC abandoned the search (numerical difficulties) after "
                                                  << solution.seconds << " s");
  const bool linear = model.integer_columns() == 0;  // CBC solves it as an LP and keeps no "best" solution
  const double* best = Cbc_bestSolution(cbc.model);
  if (best == nullptr && linear && Cbc_isProvenOptimal(cbc.model)) best = Cbc_getColSolution(cbc.model);
  if (Cbc_isProvenInfeasible(cbc.model) && best == nullptr) {
    solution.status = MipStatus::infeasible;
    return solution;
  }
  if (best == nullptr) {
    solution.status = MipStatus::no_solution;
    solution.bound = Cbc_getBestPossibleObjValue(cbc.model);
    return solution;
  }
  solution.values.assign(best, best + columns);
  solution.objective = model.objective_value(solution.values);
  solution.bound = linear ? solution.objective : std::min(Cbc_getBestPossibleObjValue(cbc.model), solution.objective);
  solution.gap = std::max(0.0, solution.objective - solution.bound) / std::max(std::fabs(solution.objective), 1e-12);
  solution.status = Cbc_isProvenOptimal(cbc.model) ? MipStatus::optimal : MipStatus::feasible;
  return solution;
}

}  // namespace partrain::partition
