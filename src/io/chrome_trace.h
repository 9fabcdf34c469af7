#pragma once
// Chrome trace JSON (the Trace Event Format that Perfetto and chrome://tracing open): one complete
// event ("ph": "X") per action of every rank, one process per rank.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>  // declarations only: the full header costs ~3 s per translation unit

namespace partrain::io {

/// One action as it ran (microseconds since the run started on that rank).
struct TraceEvent {
  std::string name;       // e.g. "Forward mb 3"
  std::string category;   // "compute", "communication", "optimizer"
  double start_us = 0;
  double duration_us = 0;
  std::int64_t step = 0;
  int track = 0;          // tid: 0 the schedule's actions, kGradientAllReduceTrack the all-reduce buckets
};

/// The track (Chrome trace tid) of the bucketed gradient all-reduces: they overlap the backward
/// actions of track 0, and spans of one track must nest.
inline constexpr int kGradientAllReduceTrack = 1;

/// Events of one rank as JSON (what ranks send to rank 0).
nlohmann::json trace_events_to_json(const std::vector<TraceEvent>& events);
std::vector<TraceEvent> trace_events_from_json(const nlohmann::json& document);

/// Writes {"traceEvents": [...], "displayTimeUnit": "ms"} with process names "rank N" and one
/// complete event per action (pid = rank, tid = the event's track, args.step; tracks named). `events_by_rank[r]` are rank r's.
/// Written through a temporary file and a rename. Throws partrain::Error naming the file.
void write_chrome_trace(const std::string& path, const std::vector<std::vector<TraceEvent>>& events_by_rank);

}  // namespace partrain::io
