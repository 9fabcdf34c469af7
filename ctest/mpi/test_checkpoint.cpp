// MPI tests of io::write_checkpoint (parallel HDF5) and the serial readers (run under mpiexec with
// 2, 3 or 4 ranks). Every rank makes the same sequence of collective calls in every test.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdint>
#include <filesystem>
#include <unistd.h>
#include <string>
#include <vector>

#include "comm/mpi_communicator.h"
#include "core/error.h"
#include "core/tensor.h"
#include "io/checkpoint.h"
#include "support/mpi_test_main.h"
#include "support/errors.h"

namespace partrain::io {
namespace {
namespace fs = std::filesystem;

comm::MpiCommunicator& world() { return testing::mpi_world(); }

/// A directory shared by all ranks (rank 0 picks and clears it).
std::string shared_directory(const std::string& test) {
  std::string directory;
  if (world().rank() == 0) {
    directory = (fs::temp_directory_path() / ("partrain-ckpt-" + test + "-" + std::to_string(::getpid()))).string();
    fs::remove_all(directory);
  }
  world().broadcast_bytes(directory, 0);
  return directory;
}

void remove_shared_directory(const std::string& directory) {
  world().barrier();
  if (world().rank() == 0) fs::remove_all(directory);
}

float value_of(std::size_t tensor, std::int64_t element) {
  return static_cast<float>(tensor) * 1000.0f + static_cast<float>(element) * 0.25f - 3.0f;
}

/// Tensor i is written by rank i % size; shapes include scalar, 1-D, 3-D, one larger than a chunk,
/// and an empty one.
std::vector<CheckpointTensor> spread_tensors() {
  const std::vector<std::pair<std::string, Shape>> layout = {
      {"model/bert.embeddings.word_embeddings.weight", {37, 16}},
      {"model/bert.pooler.dense.bias", {16}},
      {"model/scale", {}},
      {"optim/bert.embeddings.word_embeddings.weight/exp_avg", {37, 16}},
      {"optim/bert.embeddings.word_embeddings.weight/exp_avg_sq", {37, 16}},
      {"model/conv.weight", {4, 3, 5, 5}},
      {"model/big", {3, 700000}},  // two chunks of 2^20 elements
      {"model/empty", {0, 8}},
  };
  std::vector<CheckpointTensor> tensors;
  for (std::size_t i = 0; i < layout.size(); ++i) {
    CheckpointTensor tensor{layout[i].first, layout[i].second, Tensor()};
    if (static_cast<int>(i) % world().size() == world().rank()) {
      std::vector<float> values(static_cast<std::size_t>(numel(tensor.shape)));
      for (std::size_t e = 0; e < values.size(); ++e) values[e] = value_of(i, static_cast<std::int64_t>(e));
      tensor.data = Tensor::from_vector(tensor.shape, values);
    }
    tensors.push_back(std::move(tensor));
  }
  return tensors;
}

CheckpointInfo sample_info(std::int64_t step) {
  CheckpointInfo info;
  info.step = step;
  info.consumed_samples = step * 32;
  info.data_cursor = step * 32 + 7;
  info.seed = 0xfedcba9876543210ull;  // above INT64_MAX: must round-trip as uint64
  info.lr_step = step + 1;
  info.config_toml = "[model]\nname = \"bert-tiny\"\n";
  info.plan_json = std::string(100000, 'p');  // larger than HDF5's 64 KiB compact attribute limit
  info.optimizer = "adamw";
  return info;
}

using testing::expect_error;

TEST(Checkpoint, SpreadTensorsRoundTripOnEveryRank) {
  const std::string directory = shared_directory("roundtrip");
  const std::vector<CheckpointTensor> tensors = spread_tensors();
  const CheckpointInfo info = sample_info(42);
  std::string path;
  ASSERT_NO_THROW(path = write_checkpoint(world(), directory, info, tensors, 3));
  EXPECT_EQ(path, (fs::path(directory) / "step_000042.h5").string());
  EXPECT_TRUE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  Checkpoint read;
  ASSERT_NO_THROW(read = read_checkpoint(path));
  EXPECT_EQ(read.path, path);
  EXPECT_EQ(read.info.format_version, kCheckpointFormatVersion);
  EXPECT_EQ(read.info.step, info.step);
  EXPECT_EQ(read.info.consumed_samples, info.consumed_samples);
  EXPECT_EQ(read.info.data_cursor, info.data_cursor);
  EXPECT_EQ(read.info.seed, info.seed);
  EXPECT_EQ(read.info.lr_step, info.lr_step);
  EXPECT_EQ(read.info.config_toml, info.config_toml);
  EXPECT_EQ(read.info.plan_json, info.plan_json);
  EXPECT_EQ(read.info.optimizer, info.optimizer);
  ASSERT_EQ(read.tensors.size(), tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto found = read.tensors.find(tensors[i].name);
    ASSERT_NE(found, read.tensors.end()) << tensors[i].name;
    EXPECT_EQ(found->second.shape(), tensors[i].shape) << tensors[i].name;
    const std::vector<float> values = found->second.to_float_vector();
    std::size_t mismatches = 0;
    for (std::size_t e = 0; e < values.size(); ++e)
      if (values[e] != value_of(i, static_cast<std::int64_t>(e))) ++mismatches;
    EXPECT_EQ(mismatches, 0u) << tensors[i].name;
  }

  // Prefix filter and summary.
  const Checkpoint optim_only = read_checkpoint(path, {"model/scale"}, {"optim/"});
  EXPECT_EQ(optim_only.tensors.size(), 3u);
  EXPECT_TRUE(optim_only.tensors.count("model/scale"));
  EXPECT_TRUE(optim_only.tensors.count("optim/bert.embeddings.word_embeddings.weight/exp_avg_sq"));
  const CheckpointSummary summary = summarize_checkpoint(path);
  EXPECT_EQ(summary.info.step, 42);
  ASSERT_EQ(summary.tensors.size(), tensors.size());
  bool found_conv = false;
  for (const auto& [name, shape] : summary.tensors)
    if (name == "model/conv.weight") found_conv = shape == Shape{4, 3, 5, 5};
  EXPECT_TRUE(found_conv);
  remove_shared_directory(directory);
}

TEST(Checkpoint, KeepDeletesOlderFilesAndLeavesNoTemporaries) {
  const std::string directory = shared_directory("keep");
  const std::vector<CheckpointTensor> tensors = spread_tensors();
  for (std::int64_t step : {5, 10, 15, 20}) write_checkpoint(world(), directory, sample_info(step), tensors, 2);
  const std::vector<std::string> listed = list_checkpoints(directory);
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(fs::path(listed[0]).filename(), "step_000020.h5");
  EXPECT_EQ(fs::path(listed[1]).filename(), "step_000015.h5");
  int temporaries = 0;
  for (const auto& entry : fs::directory_iterator(directory))
    if (entry.path().extension() == ".tmp") ++temporaries;
  EXPECT_EQ(temporaries, 0);
  std::vector<std::string> skipped;
  EXPECT_EQ(latest_valid_checkpoint(directory, &skipped), listed[0]);
  EXPECT_TRUE(skipped.empty());
  remove_shared_directory(directory);
}

// Tensor-parallel shards (a fused 3-block split along columns, as GPT-2's c_attn) and ZeRO-1 pieces
// (flat element ranges of a shard) written by different ranks land in their places of the whole
// datasets; parts that do not add up to the tensor are an error on every rank.
TEST(Checkpoint, PartsFromSeveralRanksMakeWholeTensors) {
  const std::string directory = shared_directory("parts");
  const int ranks = world().size(), rank = world().rank();
  auto whole = [](const Shape& shape) {
    std::vector<float> values(static_cast<std::size_t>(numel(shape)));
    for (std::size_t e = 0; e < values.size(); ++e) values[e] = 0.5f * static_cast<float>(e) + 1.f;
    return Tensor::from_vector(shape, values);
  };
  // "model/fused": [3, 12] in 2 tensor-parallel parts of 3 blocks (ranks 0, 1); "optim/fused/exp_avg":
  // part 0 in ZeRO pieces over all ranks, part 1 whole on rank 1.
  const Shape shape{3, 12};
  const Tensor reference = whole(shape);
  auto part_of = [&](int index, std::int64_t begin, std::int64_t end) {
    // The part's elements in its row-major order: part [3, 6] = columns {2i, 2i+1, 4+2i, ...}.
    std::vector<float> values;
    for (std::int64_t row = 0; row < 3; ++row)
      for (int block = 0; block < 3; ++block)
        for (int column = 0; column < 2; ++column)
          values.push_back(reference.data<float>()[row * 12 + block * 4 + index * 2 + column]);
    return Tensor::from_vector<float>({end - begin}, std::vector<float>(values.begin() + begin, values.begin() + end));
  };
  // model/fused: 2 tensor-parallel parts of 3 blocks (ranks 0, 1). optim/fused/exp_avg: ZeRO pieces
  // of the whole tensor over all ranks. optim/fused/exp_avg_sq: part (rank mod 2), in ZeRO pieces
  // over the ranks of that parity.
  auto split = [](std::int64_t elements, int members, int member) {
    const std::int64_t piece = (elements + members - 1) / members;
    const std::int64_t begin = std::min(elements, piece * member);
    return std::pair<std::int64_t, std::int64_t>{begin, std::min(elements, begin + piece)};
  };
  std::vector<CheckpointTensor> tensors(4);
  tensors[0] = {"model/fused", shape, Tensor(), CheckpointPart{1, 2, 3, rank % 2}};
  if (rank < 2) tensors[0].data = part_of(rank, 0, 18).reshape({3, 6});
  const auto [flat_begin, flat_end] = split(36, ranks, rank);
  tensors[1] = {"optim/fused/exp_avg", shape, Tensor(), CheckpointPart{-1, 1, 1, 0, flat_begin, flat_end}};
  if (flat_begin < flat_end)
    tensors[1].data = Tensor::from_vector<float>(
        {flat_end - flat_begin}, std::vector<float>(reference.data<float>() + flat_begin, reference.data<float>() + flat_end));
  const int parity_members = (ranks - rank % 2 + 1) / 2;
  const auto [part_begin, part_end] = split(18, parity_members, rank / 2);
  tensors[2] = {"optim/fused/exp_avg_sq", shape, Tensor(), CheckpointPart{1, 2, 3, rank % 2, part_begin, part_end}};
  if (part_begin < part_end) tensors[2].data = part_of(rank % 2, part_begin, part_end);
  tensors[3] = {"optim/fused/step", {1}, rank == 0 ? Tensor::full({1}, 4.0) : Tensor()};
  std::string path;
  ASSERT_NO_THROW(path = write_checkpoint(world(), directory, sample_info(2), tensors, 2));
  const Checkpoint checkpoint = read_checkpoint(path);
  for (const char* name : {"model/fused", "optim/fused/exp_avg", "optim/fused/exp_avg_sq"})
    EXPECT_EQ(checkpoint.tensors.at(name).to_float_vector(), reference.to_float_vector()) << name;
  remove_shared_directory(directory);

  // Parts that miss elements: an error on every rank before anything is written.
  const std::string second = shared_directory("parts-missing");
  std::vector<CheckpointTensor> missing(1);
  missing[0] = {"model/fused", shape, Tensor(), CheckpointPart{1, 2, 3, 0}};
  if (rank == 0) missing[0].data = part_of(0, 0, 18).reshape({3, 6});  // part 1 has no writer
  expect_error([&] { write_checkpoint(world(), second, sample_info(1), missing, 2); }, "whose parts hold 18 of its 36");
  EXPECT_TRUE(list_checkpoints(second).empty());
  remove_shared_directory(second);
}

TEST(Checkpoint, TwoWritersIsAnErrorOnEveryRank) {
  const std::string directory = shared_directory("two-writers");
  std::vector<CheckpointTensor> tensors = spread_tensors();
  tensors[1].data = Tensor::full(tensors[1].shape, 1.0);  // every rank now holds tensor 1
  expect_error([&] { write_checkpoint(world(), directory, sample_info(1), tensors, 2); },
               "tensor 'model/bert.pooler.dense.bias' has data on ranks");
  EXPECT_TRUE(list_checkpoints(directory).empty());
  remove_shared_directory(directory);
}

TEST(Checkpoint, NoWriterIsAnErrorOnEveryRank) {
  const std::string directory = shared_directory("no-writer");
  std::vector<CheckpointTensor> tensors = spread_tensors();
  tensors[2].data = Tensor();
  expect_error([&] { write_checkpoint(world(), directory, sample_info(1), tensors, 2); },
               "no rank holds the data of tensor 'model/scale'");
  EXPECT_TRUE(list_checkpoints(directory).empty());
  remove_shared_directory(directory);
}

TEST(Checkpoint, DifferentTensorListsAreAnErrorOnEveryRank) {
  const std::string directory = shared_directory("lists");
  std::vector<CheckpointTensor> tensors = spread_tensors();
  if (world().rank() == world().size() - 1) tensors[0].shape = {36, 16};
  if (tensors[0].data.defined()) tensors[0].data = Tensor::zeros(tensors[0].shape);
  expect_error([&] { write_checkpoint(world(), directory, sample_info(1), tensors, 2); },
               "passed a different list of tensor names and shapes than rank 0");
  remove_shared_directory(directory);
}

TEST(Checkpoint, WrongDataShapeIsAnErrorOnEveryRank) {
  const std::string directory = shared_directory("shape");
  std::vector<CheckpointTensor> tensors = spread_tensors();
  if (tensors[3].data.defined()) tensors[3].data = Tensor::zeros({16, 37});
  expect_error([&] { write_checkpoint(world(), directory, sample_info(1), tensors, 2); },
               "has data of shape [16, 37], declared [37, 16]");
  remove_shared_directory(directory);
}

}  // namespace
}  // namespace partrain::io
