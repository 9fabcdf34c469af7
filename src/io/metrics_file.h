#pragma once
// metrics.jsonl upkeep on resume: a run killed after its last checkpoint has logged steps past it,
// which the resumed run logs again. Before appending, the resumed run drops those rows.
#include <cstdint>
#include <string>

namespace partrain::io {

/// Rewrites the JSON-lines file `path` without its rows whose "step" is greater than `last_step`
/// (and without lines that do not parse, such as a row cut short by a kill), through `path`.tmp and
/// a rename, so a crash in between leaves the old file whole. Returns the number of lines dropped;
/// a missing file is left missing (0). Throws partrain::Error naming the file on I/O failure.
std::int64_t drop_metrics_after(const std::string& path, std::int64_t last_step);

}  // namespace partrain::io
