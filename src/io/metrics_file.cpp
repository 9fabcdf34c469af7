#include "io/metrics_file.h"

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace partrain::io {

std::int64_t drop_metrics_after(const std::string& path, std::int64_t last_step) {
  if (!std::filesystem::exists(path)) return 0;
  std::ifstream input(path);
  PARTRAIN_CHECK(input, path << ": cannot read");
  std::string kept;
  std::int64_t dropped = 0;
  for (std::string line; std::getline(input, line);) {
    if (line.empty()) continue;
    const nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const bool keep = record.is_object() && record.contains("step") && record.at("step").is_number_integer() &&
                      record.at("step").get<std::int64_t>() <= last_step;
    if (keep) {
      kept += line;
      kept += '\n';
    } else {
      ++dropped;
    }
  }
  PARTRAIN_CHECK(input.eof(), path << ": reading failed");
  if (dropped == 0) return 0;
  const std::string temporary = path + ".tmp";
  {
    std::ofstream output(temporary, std::ios::trunc);
    PARTRAIN_CHECK(output, temporary << ": cannot write");
    output << kept;
    output.flush();
    PARTRAIN_CHECK(output, temporary << ": writing failed");
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  PARTRAIN_CHECK(!error, path << ": cannot rename " << temporary << " into place: " << error.message());
  return dropped;
}

}  // namespace partrain::io
