#include "io/chrome_trace.h"

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include <nlohmann/json.hpp>

namespace partrain::io {

nlohmann::json trace_events_to_json(const std::vector<TraceEvent>& events) {
  nlohmann::json list = nlohmann::json::array();
  for (const TraceEvent& event : events)
    list.push_back({event.name, event.category, event.start_us, event.duration_us, event.step, event.track});
  return list;
}

std::vector<TraceEvent> trace_events_from_json(const nlohmann::json& document) {
  std::vector<TraceEvent> events;
  for (const nlohmann::json& entry : document)
    events.push_back({entry.at(0).get<std::string>(), entry.at(1).get<std::string>(), entry.at(2).get<double>(),
                      entry.at(3).get<double>(), entry.at(4).get<std::int64_t>(),
                      entry.size() > 5 ? entry.at(5).get<int>() : 0});
  return events;
}

void write_chrome_trace(const std::string& path, const std::vector<std::vector<TraceEvent>>& events_by_rank) {
  nlohmann::json events = nlohmann::json::array();
  for (std::size_t rank = 0; rank < events_by_rank.size(); ++rank) {
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rank}, {"tid", 0},
                      {"args", {{"name", "rank " + std::to_string(rank)}}}});
    bool all_reduce_track = false;
    for (const TraceEvent& event : events_by_rank[rank]) {
      events.push_back({{"name", event.name}, {"cat", event.category}, {"ph", "X"}, {"ts", event.start_us},
                        {"dur", event.duration_us}, {"pid", rank}, {"tid", event.track}, {"args", {{"step", event.step}}}});
      all_reduce_track = all_reduce_track || event.track == kGradientAllReduceTrack;
    }
    if (all_reduce_track)
      events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank}, {"tid", kGradientAllReduceTrack},
                        {"args", {{"name", "gradient all-reduce"}}}});
  }
  const std::string temporary = path + ".tmp";
  {
    std::ofstream file(temporary, std::ios::trunc);
    PARTRAIN_CHECK(file, temporary << ": cannot write the trace");
    file << nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump() << '\n';
    PARTRAIN_CHECK(file, temporary << ": writing the trace failed");
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  PARTRAIN_CHECK(!error, path << ": cannot rename the trace into place: " << error.message());
}

}  // namespace partrain::io
