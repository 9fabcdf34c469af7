#include "graph/op_profile.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <vector>

#include "core/error.h"

namespace partrain {

namespace {
thread_local OpProfile* active_profile = nullptr;

const char* direction_name(OpProfile::Direction direction) {
  return direction == OpProfile::Direction::Forward ? "forward" : "backward";
}
}  // namespace

void OpProfile::record(OpType op, Direction direction, double seconds) {
  Entry& entry = entries_[{std::string(op_name(op)), direction_name(direction)}];
  entry.seconds += seconds;
  ++entry.calls;
}

std::map<std::pair<std::string, std::string>, OpProfile::Entry> OpProfile::entries() const { return entries_; }

double OpProfile::total_seconds() const {
  double total = 0.0;
  for (const auto& [key, entry] : entries_) total += entry.seconds;
  return total;
}

std::string OpProfile::format(double step_seconds) const {
  std::vector<std::pair<std::pair<std::string, std::string>, Entry>> rows(entries_.begin(), entries_.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof line, "  %-24s %-9s %10s %9s %7s\n", "op", "direction", "seconds", "calls", "share");
  out << line;
  for (const auto& [key, entry] : rows) {
    if (step_seconds > 0)
      std::snprintf(line, sizeof line, "  %-24s %-9s %10.4f %9lld %6.1f%%\n", key.first.c_str(), key.second.c_str(),
                    entry.seconds, entry.calls, 100.0 * entry.seconds / step_seconds);
    else
      std::snprintf(line, sizeof line, "  %-24s %-9s %10.4f %9lld %7s\n", key.first.c_str(), key.second.c_str(),
                    entry.seconds, entry.calls, "");
    out << line;
  }
  const double total = total_seconds();
  if (step_seconds > 0)
    std::snprintf(line, sizeof line, "  %-24s %-9s %10.4f %9s %6.1f%% of %.4f s in steps\n", "all ops", "", total, "",
                  100.0 * total / step_seconds, step_seconds);
  else
    std::snprintf(line, sizeof line, "  %-24s %-9s %10.4f\n", "all ops", "", total);
  out << line;
  return out.str();
}

std::string OpProfile::serialise() const {
  std::ostringstream out;
  out.precision(17);
  for (const auto& [key, entry] : entries_)
    out << key.first << ' ' << key.second << ' ' << entry.seconds << ' ' << entry.calls << '\n';
  return out.str();
}

OpProfile OpProfile::deserialise(const std::string& text) {
  OpProfile profile;
  std::istringstream in(text);
  std::string op, direction;
  Entry entry;
  while (in >> op >> direction >> entry.seconds >> entry.calls) profile.entries_[{op, direction}] = entry;
  PARTRAIN_CHECK(in.eof(), "op profile: malformed serialisation");
  return profile;
}

OpProfile* active_op_profile() { return active_profile; }

ScopedOpProfile::ScopedOpProfile(OpProfile* profile) : previous_(active_profile) { active_profile = profile; }
ScopedOpProfile::~ScopedOpProfile() { active_profile = previous_; }

}  // namespace partrain
