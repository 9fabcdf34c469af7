#pragma once
// Parsing of human-written quantities (memory sizes) from the command line and config files.
#include <cstdint>
#include <string>

namespace partrain {

/// Parses a memory size into bytes: a non-negative number (decimals allowed) followed by an optional
/// unit, case-insensitive: B; KB, MB, GB, TB (powers of 1000); KiB, MiB, GiB, TiB (powers of 1024).
/// Plain numbers are bytes. Examples: "8GiB" = 8·2^30, "512MiB", "16GB" = 16·10^9, "1024".
/// Throws partrain::Error naming the text when it is empty, malformed, negative or has an unknown unit.
std::uint64_t parse_memory_size(const std::string& text);

}  // namespace partrain
