#include "core/units.h"

#include <cctype>
#include <cmath>
#include <string>

#include "core/error.h"

namespace partrain {

std::uint64_t parse_memory_size(const std::string& text) {
  std::size_t position = 0;
  while (position < text.size() && std::isspace(static_cast<unsigned char>(text[position]))) ++position;
  const std::size_t number_begin = position;
  bool seen_digit = false;
  bool seen_point = false;
  while (position < text.size()) {
    const char character = text[position];
    if (std::isdigit(static_cast<unsigned char>(character))) {
      seen_digit = true;
    } else if (character == '.' && !seen_point) {
      seen_point = true;
    } else {
      break;
    }
    ++position;
  }
  PARTRAIN_CHECK(seen_digit, "bad memory size '" << text << "': expected a number such as 8GiB, 512MiB, 16GB or 1024");
  const double number = std::stod(text.substr(number_begin, position - number_begin));
  std::string unit;
  for (; position < text.size(); ++position) {
    const char character = text[position];
    if (std::isspace(static_cast<unsigned char>(character))) continue;
    unit += static_cast<char>(std::tolower(static_cast<unsigned char>(character)));
  }
  double multiplier = 0.0;
  if (unit.empty() || unit == "b") multiplier = 1.0;
  else if (unit == "kb") multiplier = 1e3;
  else if (unit == "mb") multiplier = 1e6;
  else if (unit == "gb") multiplier = 1e9;
  else if (unit == "tb") multiplier = 1e12;
  else if (unit == "kib") multiplier = 1024.0;
  else if (unit == "mib") multiplier = 1024.0 * 1024.0;
  else if (unit == "gib") multiplier = 1024.0 * 1024.0 * 1024.0;
  else if (unit == "tib") multiplier = 1024.0 * 1024.0 * 1024.0 * 1024.0;
  PARTRAIN_CHECK(multiplier > 0.0, "bad memory size '" << text << "': unknown unit '" << unit
                                                       << "' (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)");
  const double bytes = number * multiplier;
  PARTRAIN_CHECK(bytes < 1.8e19, "bad memory size '" << text << "': too large");
  return static_cast<std::uint64_t>(std::llround(bytes));
}

}  // namespace partrain
