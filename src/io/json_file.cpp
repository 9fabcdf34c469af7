#include "io/json_file.h"

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include <nlohmann/json.hpp>

namespace partrain::io {

void write_json_file(const std::string& path, const nlohmann::json& document, const std::string& what) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream file(temporary, std::ios::binary | std::ios::trunc);
    PARTRAIN_CHECK(file, temporary << ": cannot write " << what);
    file << document.dump(1) << '\n';
    file.close();
    PARTRAIN_CHECK(file, temporary << ": writing " << what << " failed");
  }
  std::error_code error;
  std::filesystem::rename(temporary, path, error);
  PARTRAIN_CHECK(!error, path << ": cannot rename " << what << " into place: " << error.message());
}

nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  std::ifstream file(path, std::ios::binary);
  PARTRAIN_CHECK(file, path << ": cannot read " << what);
  try {
    return nlohmann::json::parse(file);
  } catch (const nlohmann::json::exception& error) {
    PARTRAIN_FAIL(path << ": " << what << " is not JSON: " << error.what());
  }
}

}  // namespace partrain::io
