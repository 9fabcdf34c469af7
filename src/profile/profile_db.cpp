#include "profile/profile_db.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/error.h"
#include "io/json_file.h"
#include <nlohmann/json.hpp>

namespace partrain::profile {

namespace {
constexpr int kProfileDbVersion = 7;  // 4: BERT's MLM loss timed on labels masked as in training; 5: caches flushed;
                                     // 6: ranks sharing cores timed by CPU time; 7: the optimizer step
                                     // with its gradients' zeroing, from cold caches
}  // namespace

std::string task_set_key(std::span<const int> tasks) {
  std::vector<int> sorted(tasks.begin(), tasks.end());
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  std::ostringstream key;
  for (std::size_t i = 0; i < sorted.size();) {
    std::size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    if (i > 0) key << ',';
    key << sorted[i];
    if (j > i) key << '-' << sorted[j];
    i = j + 1;
  }
  return key.str();
}

std::vector<int> parse_task_set_key(const std::string& key) {
  std::vector<int> tasks;
  std::istringstream in(key);
  std::string range;
  while (std::getline(in, range, ',')) {
    const std::size_t dash = range.find('-');
    try {
      std::size_t used = 0;
      const int first = std::stoi(range.substr(0, dash), &used);
      PARTRAIN_CHECK(used == (dash == std::string::npos ? range.size() : dash), "");
      int last = first;
      if (dash != std::string::npos) {
        last = std::stoi(range.substr(dash + 1), &used);
        PARTRAIN_CHECK(used == range.size() - dash - 1 && last >= first, "");
      }
      for (int t = first; t <= last; ++t) tasks.push_back(t);
    } catch (const std::exception&) {
      PARTRAIN_FAIL("ProfileDB: malformed task set key '" << key << "'");
    }
  }
  PARTRAIN_CHECK(!tasks.empty(), "ProfileDB: empty task set key");
  return tasks;
}

ProfileDB::ProfileDB(std::uint64_t graph_hash, std::string backend, std::string dtype)
    : graph_hash_(graph_hash), backend_(std::move(backend)), dtype_(std::move(dtype)) {}

void ProfileDB::insert(std::span<const int> tasks, std::int64_t batch, const Measurement& measurement) {
  PARTRAIN_CHECK(batch > 0, "ProfileDB: batch must be positive, not " << batch);
  entries_[{task_set_key(tasks), batch}] = measurement;
}

const Measurement* ProfileDB::find(std::span<const int> tasks, std::int64_t batch) const {
  auto found = entries_.find({task_set_key(tasks), batch});
  return found == entries_.end() ? nullptr : &found->second;
}

std::vector<std::int64_t> ProfileDB::batches(std::span<const int> tasks) const {
  const std::string key = task_set_key(tasks);
  std::vector<std::int64_t> result;
  for (auto entry = entries_.lower_bound({key, 0}); entry != entries_.end() && entry->first.first == key; ++entry)
    result.push_back(entry->first.second);
  return result;
}

void ProfileDB::rescale_times(double factor) {
  PARTRAIN_CHECK(factor > 0, "ProfileDB::rescale_times: the factor must be positive, not " << factor);
  for (auto& [key, measurement] : entries_) {
    measurement.forward_seconds *= factor;
    measurement.backward_seconds *= factor;
    measurement.warm_forward_seconds *= factor;
    measurement.warm_backward_seconds *= factor;
  }
  for (auto& [optimizer, seconds] : optimizer_seconds_per_byte_) seconds *= factor;
  calibration_seconds_ *= factor;
}

void ProfileDB::correct_times(
    const std::function<TimeCorrection(std::span<const int> tasks, std::int64_t batch)>& correction_of) {
  for (auto& [key, measurement] : entries_) {
    const TimeCorrection correction = correction_of(parse_task_set_key(key.first), key.second);
    PARTRAIN_CHECK(correction.forward > 0 && correction.backward > 0,
                   "ProfileDB::correct_times: factors must be positive, not " << correction.forward << " and "
                                                                              << correction.backward);
    measurement.forward_seconds *= correction.forward;
    measurement.backward_seconds *= correction.backward;
    measurement.warm_forward_seconds *= correction.forward;
    measurement.warm_backward_seconds *= correction.backward;
  }
}

void ProfileDB::merge(const ProfileDB& other) {
  PARTRAIN_CHECK(other.graph_hash_ == graph_hash_ && other.backend_ == backend_ && other.dtype_ == dtype_,
                 "ProfileDB: cannot merge measurements of another graph, backend or dtype");
  for (const auto& [key, measurement] : other.entries_) entries_[key] = measurement;
  if (!other.communication_.empty()) communication_ = other.communication_;
  if (other.cache_bytes_per_rank_ > 0) {
    cache_bytes_per_rank_ = other.cache_bytes_per_rank_;
    cache_sharing_ranks_ = other.cache_sharing_ranks_;
  }
  if (other.sharing_ranks_per_node_ > 0) set_core_sharing(other.sharing_ranks_per_node_, other.concurrent_ranks_per_node_);
  for (const auto& [optimizer, seconds] : other.optimizer_seconds_per_byte_) optimizer_seconds_per_byte_[optimizer] = seconds;
  for (const auto& [key, bytes] : other.stage_peak_bytes_) stage_peak_bytes_[key] = bytes;
}

namespace {
char hex_digit(unsigned value) { return "0123456789abcdef"[value & 15]; }
std::string hash_hex(std::uint64_t hash) {
  std::string text(16, '0');
  for (int i = 15; i >= 0; --i, hash >>= 4) text[i] = hex_digit(static_cast<unsigned>(hash));
  return text;
}
}  // namespace

nlohmann::json ProfileDB::to_json() const {
  nlohmann::json entries = nlohmann::json::array();
  for (const auto& [key, m] : entries_) {
    entries.push_back({{"tasks", key.first}, {"batch", key.second}, {"forward_seconds", m.forward_seconds},
                       {"backward_seconds", m.backward_seconds}, {"parameter_bytes", m.parameter_bytes},
                       {"activation_bytes", m.activation_bytes}, {"boundary_input_bytes", m.boundary_input_bytes},
                       {"boundary_output_bytes", m.boundary_output_bytes}, {"peak_bytes", m.peak_bytes},
                       {"warm_forward_seconds", m.warm_forward_seconds}, {"warm_backward_seconds", m.warm_backward_seconds}});
  }
  // Version 2: activation_bytes and peak_bytes count the saved tensors only (graph/saved_tensors.h).
  // Version 3: backward_seconds includes the set's input gradients (profile/profiler.cpp); older
  // caches are measured again.
  return {{"format", "partrain-profile-db"}, {"version", kProfileDbVersion}, {"graph_hash", hash_hex(graph_hash_)},
          {"backend", backend_}, {"dtype", dtype_}, {"measurements", entries},
          {"communication", communication_.to_json()},
          {"optimizer_seconds_per_byte", optimizer_seconds_per_byte_}, {"stage_peak_bytes", stage_peak_bytes_},
          {"calibration_seconds", calibration_seconds_}, {"other_load_cores", other_load_cores_},
          {"cache_bytes_per_rank", cache_bytes_per_rank_}, {"cache_sharing_ranks", cache_sharing_ranks_},
          {"sharing_ranks_per_node", sharing_ranks_per_node_}, {"concurrent_ranks_per_node", concurrent_ranks_per_node_}};
}

ProfileDB ProfileDB::from_json(const nlohmann::json& document, const std::string& source_name) {
  try {
    PARTRAIN_CHECK(document.value("format", "") == "partrain-profile-db",
                   source_name << ": not a partrain ProfileDB (key 'format' is not \"partrain-profile-db\")");
    PARTRAIN_CHECK(document.at("version").get<int>() == kProfileDbVersion,
                   source_name << ": ProfileDB version " << document.at("version") << " is not supported");
    ProfileDB db(std::stoull(document.at("graph_hash").get<std::string>(), nullptr, 16),
                 document.at("backend").get<std::string>(), document.at("dtype").get<std::string>());
    const nlohmann::json& measurements = document.at("measurements");
    PARTRAIN_CHECK(measurements.is_array(), source_name << ": key 'measurements' must be an array");
    for (std::size_t index = 0; index < measurements.size(); ++index) {
      const nlohmann::json& entry = measurements[index];
      const std::string where = "measurements[" + std::to_string(index) + "]";
      PARTRAIN_CHECK(entry.is_object(), source_name << ": " << where << " must be an object");
      // Times and sizes are never negative: a negative one would make the planner prefer that stage.
      const auto amount = [&](const char* key) {
        PARTRAIN_CHECK(entry.contains(key), source_name << ": " << where << " has no key '" << key << "'");
        const nlohmann::json& value = entry.at(key);
        PARTRAIN_CHECK(value.is_number() && value.get<double>() >= 0,
                       source_name << ": " << where << "." << key << " = " << value.dump()
                                   << " must be a non-negative number");
        return value.get<double>();
      };
      Measurement m;
      m.forward_seconds = amount("forward_seconds");
      m.backward_seconds = amount("backward_seconds");
      m.parameter_bytes = amount("parameter_bytes");
      m.activation_bytes = amount("activation_bytes");
      m.boundary_input_bytes = amount("boundary_input_bytes");
      m.boundary_output_bytes = amount("boundary_output_bytes");
      m.peak_bytes = amount("peak_bytes");
      if (entry.contains("warm_forward_seconds")) m.warm_forward_seconds = amount("warm_forward_seconds");
      if (entry.contains("warm_backward_seconds")) m.warm_backward_seconds = amount("warm_backward_seconds");
      const nlohmann::json& batch = entry.at("batch");
      PARTRAIN_CHECK(batch.is_number_integer() && batch.get<std::int64_t>() > 0,
                     source_name << ": " << where << ".batch = " << batch.dump() << " must be a positive integer");
      db.entries_[{entry.at("tasks").get<std::string>(), batch.get<std::int64_t>()}] = m;
    }
    // Per-byte and per-stage figures: non-negative numbers by name.
    const auto amounts = [&](const char* key) {
      std::map<std::string, double> result = document.at(key).get<std::map<std::string, double>>();
      for (const auto& [name, value] : result)
        PARTRAIN_CHECK(value >= 0, source_name << ": " << key << "[\"" << name << "\"] = " << value
                                               << " must be non-negative");
      return result;
    };
    if (document.contains("optimizer_seconds_per_byte"))
      db.optimizer_seconds_per_byte_ = amounts("optimizer_seconds_per_byte");
    if (document.contains("stage_peak_bytes"))  // older caches hold none: measured when needed
      db.stage_peak_bytes_ = amounts("stage_peak_bytes");
    db.calibration_seconds_ = document.value("calibration_seconds", 0.0);  // older caches: none
    PARTRAIN_CHECK(db.calibration_seconds_ >= 0, source_name << ": calibration_seconds = " << db.calibration_seconds_
                                                             << " must be non-negative");
    db.other_load_cores_ = document.value("other_load_cores", -1.0);  // older caches: not recorded
    PARTRAIN_CHECK(std::isfinite(db.other_load_cores_), source_name << ": other_load_cores must be a number");
    db.cache_bytes_per_rank_ = document.value("cache_bytes_per_rank", 0.0);
    PARTRAIN_CHECK(db.cache_bytes_per_rank_ >= 0, source_name << ": cache_bytes_per_rank = " << db.cache_bytes_per_rank_
                                                              << " must be non-negative");
    db.cache_sharing_ranks_ = document.value("cache_sharing_ranks", 1);
    PARTRAIN_CHECK(db.cache_sharing_ranks_ >= 1, source_name << ": cache_sharing_ranks = " << db.cache_sharing_ranks_
                                                             << " must be at least 1");
    db.sharing_ranks_per_node_ = document.value("sharing_ranks_per_node", 0);
    db.concurrent_ranks_per_node_ = document.value("concurrent_ranks_per_node", 0.0);
    PARTRAIN_CHECK(db.sharing_ranks_per_node_ >= 0 && db.concurrent_ranks_per_node_ >= 0 &&
                       std::isfinite(db.concurrent_ranks_per_node_),
                   source_name << ": sharing_ranks_per_node = " << db.sharing_ranks_per_node_
                               << " and concurrent_ranks_per_node = " << db.concurrent_ranks_per_node_
                               << " must be non-negative");
    if (document.contains("communication"))  // older caches hold none: measured again
      db.communication_ = CommunicationProfile::from_json(document.at("communication"), source_name);
    return db;
  } catch (const nlohmann::json::exception& error) {
    PARTRAIN_FAIL(source_name << ": malformed ProfileDB: " << error.what());
  } catch (const std::logic_error& error) {  // stoull
    PARTRAIN_FAIL(source_name << ": malformed ProfileDB graph_hash: " << error.what());
  }
}

void ProfileDB::save(const std::string& path) const { io::write_json_file(path, to_json(), "the ProfileDB"); }

ProfileDB ProfileDB::load(const std::string& path) { return from_json(io::read_json_file(path, "the ProfileDB"), path); }

std::string ProfileDB::cache_file_name(std::uint64_t graph_hash, const std::string& backend, const std::string& dtype) {
  std::string safe_backend = backend;
  for (char& c : safe_backend)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return "profile-" + hash_hex(graph_hash) + "-" + safe_backend + "-" + dtype + ".json";
}

}  // namespace partrain::profile
