#pragma once
// Comparing a run's measured peak memory per stage with its plan's prediction (docs/planning.md
// §Memory), for the end-to-end memory tests. Header-only.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "graph/graph.h"
#include "partition/common/cost_model.h"

namespace partrain::testing {

/// The per-stage check: a stage's measured peak (bytes) may exceed the prediction by the relative
/// tolerance plus, on top, one sent output still in flight (at most `sent_output_bytes`): a stage
/// releases a tensor it sent once MPI reports the send complete, which for a large message waits
/// for the receiver, and on a loaded machine the next pass may allocate before that. `error` gets
/// (predicted − (measured − in-flight allowance)) / measured, and the check holds when |error| ≤
/// tolerance. So measured passes in [predicted / (1 + tolerance), (predicted + sent_output_bytes) /
/// (1 − tolerance)] and fails outside (passing_measured_range).
inline bool within_prediction(double predicted, double measured, double tolerance, double sent_output_bytes, double& error) {
  const double in_flight = std::clamp(measured - predicted * (1 + tolerance), 0.0, sent_output_bytes);
  error = (predicted - (measured - in_flight)) / measured;
  return std::abs(error) <= tolerance;
}

/// The measured peaks within_prediction accepts for `predicted`: {lowest, highest}, in bytes.
inline std::pair<double, double> passing_measured_range(double predicted, double tolerance, double sent_output_bytes) {
  return {predicted / (1 + tolerance), (predicted + sent_output_bytes) / (1 - tolerance)};
}

/// The largest activation (bytes at `batch` samples; bf16 when `mixed_precision`) crossing the
/// boundary of the task set `tasks` in either direction: what a stage holding them sends or receives.
inline double largest_boundary_bytes(const Graph& graph, const std::vector<int>& tasks, std::int64_t batch,
                                     bool mixed_precision = false) {
  std::vector<bool> inside(graph.tasks().size(), false);
  for (const int task : tasks) inside[task] = true;
  double largest = 0;
  for (const Value& value : graph.values()) {
    if (value.kind != ValueKind::Activation || value.consumers.empty()) continue;
    const bool produced_inside = value.producer >= 0 && inside[value.producer];
    bool crosses = false;
    for (const int consumer : value.consumers) crosses |= inside[consumer] != produced_inside;
    const int id = value.id;
    if (crosses) largest = std::max(largest, partition::activation_bytes_of(graph, std::span(&id, 1), batch, mixed_precision));
  }
  return largest;
}

/// Each rank's peak over the steps of `directory`/metrics.jsonl, net of what it held before its
/// stage was built (rank_peak_memory_bytes − rank_baseline_bytes); `steps` gets the line count.
inline std::vector<double> measured_rank_peaks(const std::string& directory, int& steps) {
  std::vector<double> measured;
  std::ifstream metrics(directory + "/metrics.jsonl");
  steps = 0;
  for (std::string line; std::getline(metrics, line); ++steps) {
    const nlohmann::json record = nlohmann::json::parse(line);
    const std::vector<double> peaks = record.at("rank_peak_memory_bytes").get<std::vector<double>>();
    const std::vector<double> baselines = record.at("rank_baseline_bytes").get<std::vector<double>>();
    measured.resize(std::max(measured.size(), peaks.size()), 0.0);
    for (std::size_t rank = 0; rank < peaks.size() && rank < baselines.size(); ++rank)
      measured[rank] = std::max(measured[rank], peaks[rank] - baselines[rank]);
  }
  return measured;
}

}  // namespace partrain::testing
