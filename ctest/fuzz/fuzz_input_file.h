#pragma once
// libFuzzer inputs for readers that take a path: the bytes go to a per-process file in /dev/shm
// (or the temporary directory), rewritten for every input.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

namespace partrain::fuzz {

/// The per-process input file `partrain-fuzz-<pid>.<extension>` (not created here).
inline std::string input_path(const std::string& extension) {
  static const std::string directory =
      std::filesystem::exists("/dev/shm") ? "/dev/shm" : std::filesystem::temp_directory_path().string();
  return directory + "/partrain-fuzz-" + std::to_string(::getpid()) + "." + extension;
}

/// Writes `size` bytes to input_path(extension) and returns its path.
inline std::string write_input(const std::uint8_t* data, std::size_t size, const std::string& extension) {
  const std::string path = input_path(extension);
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (!file) return path;
  if (size > 0) std::fwrite(data, 1, size, file);
  std::fclose(file);
  return path;
}

}  // namespace partrain::fuzz
