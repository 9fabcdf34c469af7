// Checkpoint files on one rank (MPI singleton): damage detection (truncated, bit-flipped, missing
// dataset), --resume latest skipping damaged files, listing, and readability by h5dump.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "comm/mpi_communicator.h"
#include "support/mpi_environment.h"
#include "core/error.h"
#include "core/tensor.h"
#include "io/checkpoint.h"

namespace partrain::io {
namespace {
namespace fs = std::filesystem;

using testing::MpiEnvironment;
[[maybe_unused]] ::testing::Environment* const g_mpi_environment =
    ::testing::AddGlobalTestEnvironment(new MpiEnvironment);

constexpr std::int64_t kBigRows = 4, kBigColumns = 300000;  // 4.8 MB: most of the file

class CheckpointFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ = (fs::temp_directory_path() / ("partrain-ckpt-files-" + std::to_string(::getpid()) + "-" +
                                               ::testing::UnitTest::GetInstance()->current_test_info()->name()))
                     .string();
    fs::remove_all(directory_);
  }
  void TearDown() override { fs::remove_all(directory_); }

  std::string write(std::int64_t step, int keep = 0) {
    std::vector<float> big(static_cast<std::size_t>(kBigRows * kBigColumns));
    for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i % 1000) * 0.5f;
    std::vector<CheckpointTensor> tensors = {
        {"model/big", {kBigRows, kBigColumns}, Tensor::from_vector(Shape{kBigRows, kBigColumns}, big)},
        {"model/small.bias", {3}, Tensor::from_vector(Shape{3}, std::vector<float>{1.0f, 2.0f, 3.0f})},
        {"optim/small.bias/exp_avg", {3}, Tensor::full({3}, 0.5)},
    };
    CheckpointInfo info;
    info.step = step;
    info.optimizer = "adamw";
    info.config_toml = "[train]\nsteps = 10\n";
    info.plan_json = "{\"stages\": 1}";
    return write_checkpoint(MpiEnvironment::world(), directory_, info, tensors, keep);
  }

  static void truncate_to_half(const std::string& path) { fs::resize_file(path, fs::file_size(path) / 2); }

  /// Flips one bit in the middle of the first stored chunk of `dataset` (located with
  /// H5Dget_chunk_info, so the damage is inside that dataset's data, not in metadata).
  static void flip_bit_in(const std::string& path, const std::string& dataset) {
    haddr_t address = HADDR_UNDEF;
    hsize_t size = 0;
    {
      const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
      ASSERT_GE(file, 0);
      const hid_t data = H5Dopen2(file, dataset.c_str(), H5P_DEFAULT);
      ASSERT_GE(data, 0);
      const hid_t space = H5Dget_space(data);
      hsize_t offset[2] = {0, 0};
      unsigned filter_mask = 0;
      ASSERT_GE(H5Dget_chunk_info(data, space, 0, offset, &filter_mask, &address, &size), 0);
      H5Sclose(space);
      H5Dclose(data);
      H5Fclose(file);
    }
    ASSERT_NE(address, HADDR_UNDEF);
    ASSERT_GT(size, 16u);
    std::fstream stream(path, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(stream.good());
    const auto position = static_cast<std::streamoff>(address + size / 2);
    stream.seekg(position);
    char byte = 0;
    stream.read(&byte, 1);
    byte = static_cast<char>(byte ^ 0x10);
    stream.seekp(position);
    stream.write(&byte, 1);
    ASSERT_TRUE(stream.good());
  }

  template <typename Body>
  static std::string error_of(Body&& body) {
    try {
      body();
    } catch (const Error& error) {
      return error.what();
    }
    ADD_FAILURE() << "expected a partrain::Error";
    return {};
  }

  std::string directory_;
};

TEST_F(CheckpointFiles, IntactFileReadsBack) {
  const std::string path = write(7);
  const Checkpoint checkpoint = read_checkpoint(path, {"model/big", "optim/small.bias/exp_avg"});
  EXPECT_EQ(checkpoint.info.step, 7);
  EXPECT_EQ(checkpoint.info.optimizer, "adamw");
  ASSERT_EQ(checkpoint.tensors.size(), 3u);
  const std::vector<float> big = checkpoint.tensors.at("model/big").to_float_vector();
  ASSERT_EQ(big.size(), static_cast<std::size_t>(kBigRows * kBigColumns));
  EXPECT_EQ(big[123457], static_cast<float>(123457 % 1000) * 0.5f);
  EXPECT_NO_THROW(verify_checkpoint(path));
}

TEST_F(CheckpointFiles, TruncatedFileIsNamed) {
  const std::string path = write(1);
  truncate_to_half(path);
  const std::string message = error_of([&] { read_checkpoint(path); });
  EXPECT_NE(message.find(path + ": not a readable HDF5 file (truncated or damaged)"), std::string::npos) << message;
}

TEST_F(CheckpointFiles, FlippedBitFailsTheChecksumAndNamesTheDataset) {
  const std::string path = write(1);
  flip_bit_in(path, "model/big");
  const std::string message = error_of([&] { read_checkpoint(path); });
  EXPECT_NE(message.find(path + ": dataset 'model/big' is damaged"), std::string::npos) << message;
  EXPECT_NE(message.find("Fletcher32"), std::string::npos) << message;
  // Reading only the other tensors still works.
  EXPECT_NO_THROW(read_checkpoint(path, {}, {"optim/"}));
}

TEST_F(CheckpointFiles, MissingDatasetIsNamed) {
  const std::string path = write(1);
  const std::string message = error_of([&] { read_checkpoint(path, {"model/big", "optim/big/exp_avg"}); });
  EXPECT_NE(message.find(path + ": missing dataset 'optim/big/exp_avg'"), std::string::npos) << message;
}

TEST_F(CheckpointFiles, NotACheckpointIsNamed) {
  fs::create_directories(directory_);
  const std::string path = directory_ + "/step_000001.h5";
  std::ofstream(path) << "not hdf5";
  const std::string message = error_of([&] { read_checkpoint(path); });
  EXPECT_NE(message.find(path + ": not a readable HDF5 file"), std::string::npos) << message;
  const std::string missing = error_of([&] { read_checkpoint(directory_ + "/absent.h5"); });
  EXPECT_NE(missing.find("absent.h5: no such checkpoint file"), std::string::npos) << missing;
}

TEST_F(CheckpointFiles, LatestValidSkipsDamagedNewerFiles) {
  const std::string oldest = write(10), middle = write(20), newest = write(30);
  truncate_to_half(newest);
  flip_bit_in(middle, "model/big");
  std::vector<std::string> skipped;
  EXPECT_EQ(latest_valid_checkpoint(directory_, &skipped), oldest);
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_EQ(skipped[0], newest + ": not a readable HDF5 file (truncated or damaged)");
  EXPECT_EQ(skipped[1].rfind(middle + ": dataset 'model/big' is damaged", 0), 0u) << skipped[1];

  truncate_to_half(oldest);
  skipped.clear();
  const std::string message = error_of([&] { latest_valid_checkpoint(directory_, &skipped); });
  EXPECT_NE(message.find("no valid checkpoint in '" + directory_ + "'"), std::string::npos) << message;
  EXPECT_EQ(skipped.size(), 3u);
  const std::string none = error_of([&] { latest_valid_checkpoint(directory_ + "/nothing", nullptr); });
  EXPECT_NE(none.find("no checkpoint (step_*.h5) in"), std::string::npos) << none;
}

TEST_F(CheckpointFiles, ListingIgnoresTemporariesAndSortsByStep) {
  fs::create_directories(directory_);
  for (const char* name : {"step_000002.h5", "step_999999.h5", "step_1000000.h5", "step_000003.h5.tmp",
                           "notes.txt", "step_x.h5"})
    std::ofstream(directory_ + "/" + name) << "x";
  const std::vector<std::string> listed = list_checkpoints(directory_);
  ASSERT_EQ(listed.size(), 3u);
  EXPECT_EQ(fs::path(listed[0]).filename(), "step_1000000.h5");
  EXPECT_EQ(fs::path(listed[1]).filename(), "step_999999.h5");
  EXPECT_EQ(fs::path(listed[2]).filename(), "step_000002.h5");
  EXPECT_TRUE(list_checkpoints(directory_ + "/absent").empty());
}

TEST_F(CheckpointFiles, KeepRemovesOlderFilesAndStaleTemporaries) {
  write(1);
  std::ofstream(directory_ + "/step_000002.h5.tmp") << "left by a killed job";
  write(3, 2);
  write(4, 2);
  const std::vector<std::string> listed = list_checkpoints(directory_);
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(fs::path(listed[0]).filename(), "step_000004.h5");
  EXPECT_EQ(fs::path(listed[1]).filename(), "step_000003.h5");
  EXPECT_FALSE(fs::exists(directory_ + "/step_000002.h5.tmp"));
}

TEST_F(CheckpointFiles, SummaryListsDatasetsAndShapes) {
  const std::string path = write(5);
  const CheckpointSummary summary = summarize_checkpoint(path);
  EXPECT_EQ(summary.info.step, 5);
  EXPECT_EQ(summary.info.plan_json, "{\"stages\": 1}");
  ASSERT_EQ(summary.tensors.size(), 3u);
  EXPECT_EQ(summary.tensors[0].first, "model/big");
  EXPECT_EQ(summary.tensors[0].second, (Shape{kBigRows, kBigColumns}));
  EXPECT_EQ(summary.tensors[2].first, "optim/small.bias/exp_avg");
}

TEST_F(CheckpointFiles, H5dumpListsTheDatasets) {
  if (!fs::exists("/usr/bin/h5dump")) GTEST_SKIP() << "h5dump not installed (Debian package hdf5-tools)";
  const std::string path = write(5);
  auto run = [](const std::string& command) {
    std::string output;
    FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
    if (pipe == nullptr) return std::string("popen failed");
    char buffer[4096];
    while (std::size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, n);
    if (::pclose(pipe) != 0) output += "\n(exit status not 0)";
    return output;
  };
  const std::string listing = run("/usr/bin/h5dump -n '" + path + "'");
  EXPECT_EQ(listing.find("exit status not 0"), std::string::npos) << listing;
  EXPECT_NE(listing.find("dataset    /model/big"), std::string::npos) << listing;
  EXPECT_NE(listing.find("dataset    /optim/small.bias/exp_avg"), std::string::npos) << listing;
  // Stored as chunked fp32 with Fletcher32 checksums, with the step as an attribute.
  const std::string header = run("/usr/bin/h5dump -p -H -d /model/big -a /step '" + path + "'");
  EXPECT_NE(header.find("H5T_IEEE_F32LE"), std::string::npos) << header;
  EXPECT_NE(header.find("CHUNKED"), std::string::npos) << header;
  EXPECT_NE(header.find("CHECKSUM FLETCHER32"), std::string::npos) << header;
  EXPECT_NE(header.find("ATTRIBUTE \"step\""), std::string::npos) << header;
}


// The dataset boxes of a part: a fused 3-block tensor-parallel shard, and a flat range (a ZeRO-1
// piece) across rows, listed in the part's row-major order.
TEST(CheckpointParts, BoxesOfShardsAndFlatRanges) {
  const std::vector<Box> shard = part_boxes({2, 12}, CheckpointPart{1, 2, 3, 1});
  ASSERT_EQ(shard.size(), 3u);  // columns 2-3, 6-7, 10-11 of both rows
  for (int block = 0; block < 3; ++block) {
    EXPECT_EQ(shard[block].start, (std::vector<std::int64_t>{0, 4 * block + 2}));
    EXPECT_EQ(shard[block].count, (std::vector<std::int64_t>{2, 2}));
  }
  const std::vector<Box> range = part_boxes({4, 5}, CheckpointPart{-1, 1, 1, 0, 3, 14});
  ASSERT_EQ(range.size(), 3u);  // row 0 columns 3-4, row 1, row 2 columns 0-3
  EXPECT_EQ(range[0].start, (std::vector<std::int64_t>{0, 3}));
  EXPECT_EQ(range[0].count, (std::vector<std::int64_t>{1, 2}));
  EXPECT_EQ(range[1].start, (std::vector<std::int64_t>{1, 0}));
  EXPECT_EQ(range[1].count, (std::vector<std::int64_t>{1, 5}));
  EXPECT_EQ(range[2].start, (std::vector<std::int64_t>{2, 0}));
  EXPECT_EQ(range[2].count, (std::vector<std::int64_t>{1, 4}));
  EXPECT_EQ(part_element_count({4, 5}, CheckpointPart{-1, 1, 1, 0, 3, 14}), 11);
  EXPECT_EQ(part_element_count({2, 12}, CheckpointPart{1, 2, 3, 1, 1, 5}), 4);
  // A piece of a shard crossing a block boundary is split there: elements 1..4 of part 1's row 0
  // are columns 3 (block 0) and 6, 7, 10 (blocks 1 and 2).
  const std::vector<Box> crossing = part_boxes({2, 12}, CheckpointPart{1, 2, 3, 1, 1, 5});
  std::vector<std::int64_t> columns;
  for (const Box& box : crossing)
    for (std::int64_t c = 0; c < box.count[1]; ++c) columns.push_back(box.start[1] + c);
  EXPECT_EQ(columns, (std::vector<std::int64_t>{3, 6, 7, 10}));
  EXPECT_THROW(part_boxes({2, 12}, CheckpointPart{1, 5, 1, 0}), Error);
  EXPECT_THROW(part_element_count({4, 5}, CheckpointPart{-1, 1, 1, 0, 3, 30}), Error);
}

}  // namespace
}  // namespace partrain::io
