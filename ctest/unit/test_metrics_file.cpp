// metrics.jsonl on resume (io/metrics_file.h): rows past the resumed step and a torn last row go,
// the rest stays byte for byte; a missing file stays missing.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "io/metrics_file.h"

namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& path) {
  std::ifstream file(path);
  return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}

class MetricsFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ = fs::temp_directory_path() / ("partrain-metrics-" + std::to_string(::getpid()));
    fs::create_directories(directory_);
  }
  void TearDown() override { fs::remove_all(directory_); }
  fs::path directory_;
};

TEST_F(MetricsFileTest, DropsRowsPastTheStepAndATornRow) {
  const fs::path path = directory_ / "metrics.jsonl";
  std::string kept;
  for (int step = 1; step <= 5; ++step)
    kept += "{\"step\":" + std::to_string(step) + ",\"loss\":" + std::to_string(10 - step) + "}\n";
  std::ofstream(path) << kept << "{\"step\":6,\"loss\":4}\n{\"step\":7,\"loss\":3}\n{\"step\":8,\"lo";
  EXPECT_EQ(partrain::io::drop_metrics_after(path.string(), 5), 3);
  EXPECT_EQ(read_text(path), kept);
  EXPECT_FALSE(fs::exists(path.string() + ".tmp"));
  EXPECT_EQ(partrain::io::drop_metrics_after(path.string(), 5), 0);  // nothing left to drop
  EXPECT_EQ(read_text(path), kept);
  EXPECT_EQ(partrain::io::drop_metrics_after(path.string(), 2), 3);
  EXPECT_EQ(read_text(path), "{\"step\":1,\"loss\":9}\n{\"step\":2,\"loss\":8}\n");
}

TEST_F(MetricsFileTest, MissingFileStaysMissing) {
  const fs::path path = directory_ / "none.jsonl";
  EXPECT_EQ(partrain::io::drop_metrics_after(path.string(), 3), 0);
  EXPECT_FALSE(fs::exists(path));
}

}  // namespace
