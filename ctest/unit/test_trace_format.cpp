// Output formats users open in other tools: the Chrome trace written by io::write_chrome_trace must
// follow the Trace Event Format that Perfetto and chrome://tracing load (checked by a schema checker
// that is itself tested on malformed documents), and metrics.jsonl is one JSON object per line.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/chrome_trace.h"
#include "support/errors.h"

namespace partrain {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

bool is_integer(const json& value) { return value.is_number_integer() || value.is_number_unsigned(); }
bool is_time(const json& value) { return value.is_number() && std::isfinite(value.get<double>()) && value.get<double>() >= 0; }

/// Problems that keep `document` from being a Trace Event Format file as we write it (empty: none):
/// {"traceEvents": [...]} where each event has a string name, ph "X" (complete: ts and dur numbers
/// >= 0) or "M" (metadata: process_name/thread_name with a string args.name), integer pid and tid;
/// complete events of one (pid, tid) do not overlap (our actions run one after another per rank),
/// and every pid with complete events is named by a process_name event.
std::vector<std::string> trace_format_problems(const json& document) {
  std::vector<std::string> problems;
  if (!document.is_object()) return {"the document is not a JSON object"};
  if (!document.contains("traceEvents") || !document["traceEvents"].is_array())
    return {"no traceEvents array at the top level"};
  if (document.contains("displayTimeUnit") && document["displayTimeUnit"] != "ms" && document["displayTimeUnit"] != "ns")
    problems.push_back("displayTimeUnit is neither \"ms\" nor \"ns\"");
  std::map<std::pair<std::int64_t, std::int64_t>, std::vector<std::pair<double, double>>> spans;
  std::map<std::int64_t, bool> named;   // pid -> has a process_name
  const json& events = document["traceEvents"];
  for (std::size_t index = 0; index < events.size(); ++index) {
    const json& event = events[index];
    const std::string where = "event " + std::to_string(index) + ": ";
    if (!event.is_object()) {
      problems.push_back(where + "not an object");
      continue;
    }
    if (!event.contains("name") || !event["name"].is_string()) problems.push_back(where + "name is not a string");
    if (!event.contains("pid") || !is_integer(event["pid"])) problems.push_back(where + "pid is not an integer");
    if (!event.contains("tid") || !is_integer(event["tid"])) problems.push_back(where + "tid is not an integer");
    if (event.contains("cat") && !event["cat"].is_string()) problems.push_back(where + "cat is not a string");
    if (event.contains("args") && !event["args"].is_object()) problems.push_back(where + "args is not an object");
    if (!event.contains("ph") || !event["ph"].is_string()) {
      problems.push_back(where + "ph is not a string");
      continue;
    }
    const bool has_ids = event.contains("pid") && is_integer(event["pid"]) && event.contains("tid") && is_integer(event["tid"]);
    const std::string phase = event["ph"];
    if (phase == "X") {
      const bool timed = event.contains("ts") && is_time(event["ts"]) && event.contains("dur") && is_time(event["dur"]);
      if (!timed) problems.push_back(where + "complete event without numbers ts >= 0 and dur >= 0");
      if (timed && has_ids)
        spans[{event["pid"].get<std::int64_t>(), event["tid"].get<std::int64_t>()}].emplace_back(
            event["ts"].get<double>(), event["dur"].get<double>());
      if (has_ids) named.try_emplace(event["pid"].get<std::int64_t>(), false);
    } else if (phase == "M") {
      const bool naming = event.value("name", "") == "process_name" || event.value("name", "") == "thread_name";
      if (!naming) problems.push_back(where + "metadata other than process_name/thread_name");
      if (!event.contains("args") || !event["args"].is_object() || !event["args"].contains("name") ||
          !event["args"]["name"].is_string())
        problems.push_back(where + "metadata without a string args.name");
      else if (has_ids && event["name"] == "process_name")
        named[event["pid"].get<std::int64_t>()] = true;
    } else {
      problems.push_back(where + "phase \"" + phase + "\" (we write only \"X\" and \"M\")");
    }
  }
  for (auto& [thread, list] : spans) {
    std::sort(list.begin(), list.end());
    for (std::size_t i = 1; i < list.size(); ++i)
      if (list[i].first < list[i - 1].first + list[i - 1].second - 1e-3)   // 1 ns of rounding
        problems.push_back("pid " + std::to_string(thread.first) + " tid " + std::to_string(thread.second) +
                           ": complete events overlap at ts " + std::to_string(list[i].first));
  }
  for (const auto& [pid, has_name] : named)
    if (!has_name) problems.push_back("pid " + std::to_string(pid) + " has no process_name");
  return problems;
}

std::string joined(const std::vector<std::string>& problems) {
  std::ostringstream text;
  for (const std::string& problem : problems) text << problem << "\n";
  return text.str();
}

class TraceFormat : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ = fs::temp_directory_path() / ("partrain-trace-format-" + std::to_string(::getpid()));
    fs::create_directories(directory_);
  }
  void TearDown() override { fs::remove_all(directory_); }

  /// Rank r runs Forward/Backward of two microbatches, an all-reduce and the optimizer, back to back.
  static std::vector<std::vector<io::TraceEvent>> pipeline_events(int ranks) {
    std::vector<std::vector<io::TraceEvent>> by_rank(static_cast<std::size_t>(ranks));
    for (int rank = 0; rank < ranks; ++rank) {
      double clock = 10.0 * rank;
      for (std::int64_t step = 0; step < 2; ++step) {
        for (const auto& [name, category, length] :
             std::vector<std::tuple<std::string, std::string, double>>{{"Forward mb 0", "compute", 120.5},
                                                                      {"Send activations mb 0", "communication", 3.25},
                                                                      {"Forward mb 1", "compute", 118.0},
                                                                      {"Backward mb 0", "compute", 240.0},
                                                                      {"Backward mb 1", "compute", 0.0},
                                                                      {"AllReduce gradients", "communication", 31.0},
                                                                      {"Optimizer", "optimizer", 12.0}}) {
          by_rank[static_cast<std::size_t>(rank)].push_back({name, category, clock, length, step});
          clock += length;
        }
      }
    }
    return by_rank;
  }

  json write_and_read(const std::vector<std::vector<io::TraceEvent>>& events) const {
    const std::string path = (directory_ / "trace.json").string();
    io::write_chrome_trace(path, events);
    EXPECT_FALSE(fs::exists(path + ".tmp"));
    std::ifstream file(path);
    return json::parse(file);   // throws on anything that is not JSON
  }

  json valid_document() const { return write_and_read(pipeline_events(2)); }

  fs::path directory_;
};

TEST_F(TraceFormat, WrittenTraceFollowsTheTraceEventFormat) {
  const std::vector<std::vector<io::TraceEvent>> events = pipeline_events(3);
  const json document = write_and_read(events);
  EXPECT_EQ(joined(trace_format_problems(document)), "");
  EXPECT_EQ(document.value("displayTimeUnit", ""), "ms");

  const json& list = document["traceEvents"];
  ASSERT_EQ(list.size(), 3 + 3 * events[0].size());   // a process_name per rank, an event per action
  std::map<std::int64_t, std::string> process_names;
  std::size_t complete = 0;
  for (const json& event : list) {
    if (event["ph"] == "M") {
      process_names[event["pid"].get<std::int64_t>()] = event["args"]["name"];
      continue;
    }
    const auto rank = event["pid"].get<std::size_t>();
    ASSERT_LT(rank, events.size());
    const std::size_t index = complete++ % events[0].size();
    const io::TraceEvent& expected = events[rank][index];
    EXPECT_EQ(event["name"], expected.name);
    EXPECT_EQ(event["cat"], expected.category);
    EXPECT_DOUBLE_EQ(event["ts"].get<double>(), expected.start_us);
    EXPECT_DOUBLE_EQ(event["dur"].get<double>(), expected.duration_us);
    EXPECT_EQ(event["tid"], 0);
    EXPECT_EQ(event["args"]["step"], expected.step);
  }
  EXPECT_EQ(process_names, (std::map<std::int64_t, std::string>{{0, "rank 0"}, {1, "rank 1"}, {2, "rank 2"}}));
}

TEST_F(TraceFormat, RankWithoutEventsStillNamedAndValid) {
  std::vector<std::vector<io::TraceEvent>> events = pipeline_events(2);
  events.emplace_back();   // rank 2 ran nothing
  const json document = write_and_read(events);
  EXPECT_EQ(joined(trace_format_problems(document)), "");
  EXPECT_EQ(document["traceEvents"].size(), 3 + 2 * events[0].size());
  EXPECT_EQ(joined(trace_format_problems(write_and_read({}))), "");   // no ranks: an empty event list
}

TEST_F(TraceFormat, EventsSurviveTheGatherEncoding) {
  // What ranks send to rank 0 (trace_events_to_json) decodes to the same events.
  const std::vector<io::TraceEvent> events = pipeline_events(1)[0];
  const json encoded = json::parse(io::trace_events_to_json(events).dump());
  const std::vector<io::TraceEvent> decoded = io::trace_events_from_json(encoded);
  ASSERT_EQ(decoded.size(), events.size());
  for (std::size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(decoded[i].name, events[i].name);
    EXPECT_EQ(decoded[i].category, events[i].category);
    EXPECT_DOUBLE_EQ(decoded[i].start_us, events[i].start_us);
    EXPECT_DOUBLE_EQ(decoded[i].duration_us, events[i].duration_us);
    EXPECT_EQ(decoded[i].step, events[i].step);
  }
}

TEST_F(TraceFormat, WriteErrorNamesTheFile) {
  const std::string path = (directory_ / "missing-dir" / "trace.json").string();
  EXPECT_NE(testing::error_message([&] { io::write_chrome_trace(path, pipeline_events(1)); }).find(path), std::string::npos);
}

TEST_F(TraceFormat, CheckerCatchesMalformedDocuments) {
  ASSERT_EQ(joined(trace_format_problems(valid_document())), "");
  // Each mutation of the valid document must be reported with this text.
  const std::vector<std::pair<std::string, void (*)(json&)>> cases = {
      {"not a JSON object", [](json& d) { d = d["traceEvents"]; }},
      {"no traceEvents array", [](json& d) { d.erase("traceEvents"); }},
      {"no traceEvents array", [](json& d) { d["traceEvents"] = json::object(); }},
      {"displayTimeUnit", [](json& d) { d["displayTimeUnit"] = "s"; }},
      {"not an object", [](json& d) { d["traceEvents"].push_back(42); }},
      {"name is not a string", [](json& d) { d["traceEvents"][1]["name"] = 7; }},
      {"name is not a string", [](json& d) { d["traceEvents"][1].erase("name"); }},
      {"ph is not a string", [](json& d) { d["traceEvents"][1].erase("ph"); }},
      {"phase \"B\"", [](json& d) { d["traceEvents"][1]["ph"] = "B"; }},
      {"pid is not an integer", [](json& d) { d["traceEvents"][1]["pid"] = "0"; }},
      {"pid is not an integer", [](json& d) { d["traceEvents"][1]["pid"] = 0.5; }},
      {"tid is not an integer", [](json& d) { d["traceEvents"][1].erase("tid"); }},
      {"cat is not a string", [](json& d) { d["traceEvents"][1]["cat"] = json::array(); }},
      {"args is not an object", [](json& d) { d["traceEvents"][1]["args"] = 3; }},
      {"without numbers ts >= 0 and dur >= 0", [](json& d) { d["traceEvents"][1].erase("dur"); }},
      {"without numbers ts >= 0 and dur >= 0", [](json& d) { d["traceEvents"][1]["dur"] = -1.0; }},
      {"without numbers ts >= 0 and dur >= 0", [](json& d) { d["traceEvents"][1]["ts"] = "12"; }},
      {"metadata without a string args.name", [](json& d) { d["traceEvents"][0]["args"].erase("name"); }},
      {"metadata other than", [](json& d) { d["traceEvents"][0]["name"] = "process_labels"; }},
      {"pid 0 has no process_name", [](json& d) { d["traceEvents"].erase(0); }},
      {"complete events overlap", [](json& d) { d["traceEvents"][2]["ts"] = d["traceEvents"][1]["ts"].get<double>() + 1; }},
      {"complete events overlap", [](json& d) { d["traceEvents"][1]["dur"] = 1e9; }},
  };
  for (const auto& [expected, mutate] : cases) {
    json document = valid_document();
    mutate(document);
    const std::string problems = joined(trace_format_problems(document));
    EXPECT_NE(problems.find(expected), std::string::npos) << "expected \"" << expected << "\", got:\n" << problems;
  }
  // The same events on different threads, or back to back, do not overlap.
  json document = valid_document();
  document["traceEvents"][2]["tid"] = 1;
  document["traceEvents"][2]["ts"] = document["traceEvents"][1]["ts"];
  EXPECT_EQ(joined(trace_format_problems(document)), "");
}

/// Problems of one metrics.jsonl line (empty: none): a JSON object with an integer step >= 1 and
/// numbers loss (finite) and lr, and numbers (or null) for every other key.
std::vector<std::string> metrics_line_problems(const std::string& line) {
  if (line.find('\n') != std::string::npos) return {"the record spans lines"};
  json record;
  try {
    record = json::parse(line);
  } catch (const json::parse_error& error) {
    return {std::string("not JSON: ") + error.what()};
  }
  if (!record.is_object()) return {"not a JSON object"};
  std::vector<std::string> problems;
  if (!record.contains("step") || !is_integer(record["step"]) || record["step"].get<std::int64_t>() < 1)
    problems.push_back("step is not an integer >= 1");
  if (!record.contains("loss") || !record["loss"].is_number() || !std::isfinite(record["loss"].get<double>()))
    problems.push_back("loss is not a finite number");
  if (!record.contains("lr") || !record["lr"].is_number()) problems.push_back("lr is not a number");
  for (const auto& [key, value] : record.items())
    if (!value.is_number() && !value.is_null()) problems.push_back(key + " is not a number");
  return problems;
}

TEST(MetricsFormat, OneObjectPerLineWithStepLossLr) {
  // A line of a real bert-tiny run on 4 ranks (and one with a held-out evaluation).
  const std::string real =
      R"({"grad_norm":2.50808703773796,"loss":9.719381332397461,"lr":0.0,"peak_memory_bytes":60270080.0,)"
      R"("samples_per_second":16.68518485813688,"seconds":0.958934535999298,"step":1,"tflops":0.009617926385755652,)"
      R"("tokens_per_second":1067.8518309207602})";
  EXPECT_EQ(joined(metrics_line_problems(real)), "");
  json evaluated = json::parse(real);
  evaluated["step"] = 40;
  evaluated["eval_loss"] = 7.25;
  EXPECT_EQ(joined(metrics_line_problems(evaluated.dump())), "");

  EXPECT_NE(joined(metrics_line_problems(json::parse(real).dump(2))).find("spans lines"), std::string::npos);
  EXPECT_NE(joined(metrics_line_problems("[1, 2]")).find("not a JSON object"), std::string::npos);
  EXPECT_NE(joined(metrics_line_problems("{\"step\": 1, \"loss\": 2,")).find("not JSON"), std::string::npos);
  json bad = json::parse(real);
  bad.erase("lr");
  EXPECT_NE(joined(metrics_line_problems(bad.dump())).find("lr is not a number"), std::string::npos);
  bad = json::parse(real);
  bad["step"] = 0;
  EXPECT_NE(joined(metrics_line_problems(bad.dump())).find("step is not an integer"), std::string::npos);
  bad = json::parse(real);
  bad["loss"] = nullptr;   // what nlohmann::json writes for a NaN loss
  EXPECT_NE(joined(metrics_line_problems(bad.dump())).find("loss is not a finite number"), std::string::npos);
}

}  // namespace
}  // namespace partrain
