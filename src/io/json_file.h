#pragma once
// JSON files that must never be seen half-written (plans, ProfileDBs): written to a temporary name
// and renamed into place; read with errors that name the file.
#include <string>

#include <nlohmann/json_fwd.hpp>  // declarations only: the full header costs ~3 s per translation unit

namespace partrain::io {

/// Writes `document` (indented) to `path` through `path`.tmp and a rename. `what` names the content
/// in errors ("the plan"). Throws partrain::Error naming the file.
void write_json_file(const std::string& path, const nlohmann::json& document, const std::string& what);

/// Parses the JSON file at `path`. Throws partrain::Error naming the file when it cannot be read or
/// is not JSON.
nlohmann::json read_json_file(const std::string& path, const std::string& what);

}  // namespace partrain::io
