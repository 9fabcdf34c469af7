// Checkpoints end to end (issue 6) with the real program: resume is bitwise (10 steps straight vs the
// same run resumed from its step-5 checkpoint), a checkpoint resumes under another plan and world size
// (4 ranks 2 stages x 2 replicas -> 3 ranks 3 stages -> 1 rank -> tensor parallel 2 x 2 stages ->
// interleaved 2 x 2 with 2 model chunks per rank, an interleaved checkpoint -> 1 rank, and
// a tensor-parallel checkpoint -> 1 rank) with the same losses (GPT's loss is a mean over
// equal-length samples, so it does not depend on the plan), a bf16 ZeRO-1 run (its f32 masters
// sharded) writes the checkpoint of the unsharded run, damaged files are detected and
// `--resume latest` falls back to the newest valid one, and h5dump reads the files. Built into
// test_checkpoint_resume (labels validation;mpi).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "support/partrain_runs.h"

namespace partrain {
namespace {

const std::string kRoot = PARTRAIN_RUN_DIR;

// gpt-tiny, 10 steps, checkpoints every 5 steps, under the given settings.
testing::PartrainRun train(int ranks, const std::string& directory, const std::vector<std::string>& settings) {
  std::string arguments = std::string("train ") + PARTRAIN_SOURCE_DIR + "/configs/gpt-tiny.toml" +
                          " --set train.steps=10 --set train.global_batch=8 --set model.seq_len=32" +
                          " --set checkpoint.every=5 --set log.dir=" + directory +
                          " --set data.path=" + PARTRAIN_DATA_DIR + "/text.h5";
  for (const std::string& setting : settings) arguments += " --set '" + setting + "'";
  return testing::run_partrain(ranks, arguments, directory + ".log");
}

std::vector<std::string> two_by_two() {
  return {"parallel.planner=manual", "parallel.stages=2", "parallel.replicas=[2,2]", "parallel.boundaries=[\"h.1\"]",
          "train.microbatches=2"};
}

// Megatron's interleaved schedule: 2 stages x 2 replicas, each rank holding v = 2 model chunks.
std::vector<std::string> interleaved_two_by_two() {
  return {"parallel.planner=manual", "parallel.stages=2", "parallel.replicas=[2,2]", "parallel.schedule=interleaved",
          "parallel.virtual_stages=2", "parallel.boundaries=[\"h.0\",\"h.1\",\"ln_f\"]", "train.microbatches=2"};
}

// Tensor parallelism t = 2 inside each of 2 stages (4 ranks).
std::vector<std::string> tensor_parallel_two_stages() {
  return {"parallel.planner=manual", "parallel.stages=2", "parallel.replicas=[1,1]", "parallel.boundaries=[\"h.1\"]",
          "parallel.tensor_parallel=2", "train.microbatches=2"};
}

// The straight 4-rank run every test compares with (made once per ctest run).
std::string straight_run() {
  const std::string directory = kRoot + "/straight";
  if (std::filesystem::exists(directory + "/checkpoints/step_000010.h5")) return directory;
  const testing::PartrainRun run = train(4, directory, two_by_two());
  EXPECT_EQ(run.status, 0) << run.command << "\n" << run.log;
  return directory;
}

// Resumes the step-5 checkpoint of the run in `written` on `ranks` ranks (into `directory`) under
// `settings` and returns the losses of steps 6-10 (none when the run failed).
std::vector<double> resumed_losses(int ranks, const std::string& written, const std::string& directory,
                                   const std::vector<std::string>& settings) {
  std::string arguments = std::string("train ") + PARTRAIN_SOURCE_DIR + "/configs/gpt-tiny.toml --resume " + written +
                          "/checkpoints/step_000005.h5 --set train.steps=10 --set train.global_batch=8" +
                          " --set model.seq_len=32 --set log.dir=" + directory + " --set data.path=" + PARTRAIN_DATA_DIR +
                          "/text.h5";
  for (const std::string& setting : settings) arguments += " --set '" + setting + "'";
  const testing::PartrainRun resumed = testing::run_partrain(ranks, arguments, directory + ".log");
  EXPECT_EQ(resumed.status, 0) << resumed.log;
  if (resumed.status != 0) return {};
  return testing::metric_values(directory, "loss");
}

// Resumes the step-5 checkpoint of the 4-rank run in `written` on 1 rank (into `directory`) and
// expects steps 6-10 to have the straight run's losses (`expected`, 1e-5 relative).
void expect_resumes_on_one_rank(const std::string& written, const std::string& directory,
                                const std::vector<double>& expected, const std::string& name) {
  const std::vector<double> actual =
      resumed_losses(1, written, directory, {"parallel.planner=dpl", "train.microbatches=1"});
  ASSERT_EQ(actual.size(), 5u);
  for (std::size_t i = 0; i < actual.size(); ++i)
    EXPECT_NEAR(actual[i], expected[5 + i], 1e-5 * std::abs(expected[5 + i])) << name << " step " << 6 + i;
}

// The step-5 checkpoint of the run in `written` holds the embedding table (tied with the LM head)
// and its AdamW state at the real vocabulary size, 8,000 x 128, and with the values of `reference`'s
// (within float rounding of the different layouts: 1e-4 relative L2).
void expect_same_vocabulary_rows(const std::string& written, const std::string& reference, const std::string& name) {
  const std::vector<std::string> names = {"model/transformer.wte.weight", "optim/transformer.wte.weight/exp_avg",
                                          "optim/transformer.wte.weight/exp_avg_sq"};
  const io::Checkpoint split = io::read_checkpoint(written + "/checkpoints/step_000005.h5", names, names);
  const io::Checkpoint whole = io::read_checkpoint(reference + "/checkpoints/step_000005.h5", names, names);
  for (const std::string& tensor : names) {
    const Tensor& actual = split.tensors.at(tensor);
    ASSERT_EQ(actual.shape(), (Shape{8000, 128})) << name << " " << tensor;
    const std::vector<float> a = actual.to_float_vector(), e = whole.tensors.at(tensor).to_float_vector();
    ASSERT_EQ(a.size(), e.size());
    double difference = 0, norm = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      difference += (double(a[i]) - e[i]) * (double(a[i]) - e[i]);
      norm += double(e[i]) * e[i];
    }
    EXPECT_LE(std::sqrt(difference), 1e-4 * std::sqrt(norm)) << name << " " << tensor;
  }
}

TEST(CheckpointResume, ResumedRunContinuesBitwise) {
  const std::string straight = straight_run();
  const std::string checkpoint = straight + "/checkpoints/step_000005.h5";
  ASSERT_TRUE(std::filesystem::exists(checkpoint));
  const std::string resumed = kRoot + "/resumed";
  const testing::PartrainRun run = testing::run_partrain(
      4,
      std::string("train ") + PARTRAIN_SOURCE_DIR + "/configs/gpt-tiny.toml --resume " + checkpoint +
          " --set train.steps=10 --set train.global_batch=8 --set model.seq_len=32 --set log.dir=" + resumed +
          " --set data.path=" + PARTRAIN_DATA_DIR + "/text.h5 --set parallel.planner=manual --set parallel.stages=2" +
          " --set 'parallel.replicas=[2,2]' --set 'parallel.boundaries=[\"h.1\"]' --set train.microbatches=2",
      resumed + ".log");
  ASSERT_EQ(run.status, 0) << run.log;
  EXPECT_NE(run.log.find("resume: " + checkpoint + " (step 5)"), std::string::npos) << run.log;
  const std::vector<double> expected = testing::metric_values(straight, "loss");
  const std::vector<double> actual = testing::metric_values(resumed, "loss");
  ASSERT_EQ(expected.size(), 10u);
  ASSERT_EQ(actual.size(), 5u);
  for (std::size_t i = 0; i < actual.size(); ++i) EXPECT_EQ(actual[i], expected[5 + i]) << "step " << 6 + i;
}

TEST(CheckpointResume, ReshardsToOtherPlansAndWorldSizes) {
  const std::string straight = straight_run();
  const std::vector<double> expected = testing::metric_values(straight, "loss");
  ASSERT_EQ(expected.size(), 10u);
  struct Target {
    std::string name;
    int ranks;
    std::vector<std::string> settings;
  };
  const std::vector<Target> targets = {
      {"three-stages", 3, {"parallel.planner=manual", "parallel.stages=3", "parallel.replicas=[1,1,1]",
                           "parallel.boundaries=[\"h.0\",\"h.1\"]", "train.microbatches=2"}},
      {"one-rank", 1, {"parallel.planner=dpl", "train.microbatches=1"}},
      {"tensor-parallel", 4, tensor_parallel_two_stages()},
      {"interleaved", 4, interleaved_two_by_two()},
      {"zero-bubble", 2, {"parallel.planner=manual", "parallel.stages=2", "parallel.replicas=[1,1]",
                          "parallel.boundaries=[\"h.1\"]", "parallel.schedule=zb_h1", "train.microbatches=4"}},
      {"zero1", 4, {"parallel.planner=manual", "parallel.stages=2", "parallel.replicas=[2,2]",
                    "parallel.boundaries=[\"h.1\"]", "parallel.zero=1", "train.microbatches=2"}},
  };
  for (const Target& target : targets) {
    const std::vector<double> actual = resumed_losses(target.ranks, straight, kRoot + "/reshard-" + target.name, target.settings);
    ASSERT_EQ(actual.size(), 5u) << target.name;
    for (std::size_t i = 0; i < actual.size(); ++i)
      EXPECT_NEAR(actual[i], expected[5 + i], 1e-5 * std::abs(expected[5 + i])) << target.name << " step " << 6 + i;
  }
}

// A run under the interleaved schedule (each rank writes the parameters of both its model chunks)
// has the straight run's losses, and its step-5 checkpoint resumes on one rank with them too.
TEST(CheckpointResume, InterleavedCheckpointsResumeOnOneRank) {
  const std::vector<double> expected = testing::metric_values(straight_run(), "loss");
  ASSERT_EQ(expected.size(), 10u);
  const std::string interleaved = kRoot + "/interleaved";
  const testing::PartrainRun run = train(4, interleaved, interleaved_two_by_two());
  ASSERT_EQ(run.status, 0) << run.command << "\n" << run.log;
  const std::vector<double> own = testing::metric_values(interleaved, "loss");
  ASSERT_EQ(own.size(), 10u);
  for (std::size_t i = 0; i < own.size(); ++i) EXPECT_NEAR(own[i], expected[i], 1e-5 * std::abs(expected[i])) << "step " << i + 1;
  expect_resumes_on_one_rank(interleaved, kRoot + "/interleaved-one-rank", expected, "interleaved");
}

// Checkpoints written under tensor parallelism (each rank writes its part of every split parameter
// and of its optimizer state as a hyperslab of the whole dataset), with and without ZeRO-1 (the
// optimizer state parts gathered over each data-parallel group), resume on one rank with the losses
// of the straight run; the runs themselves match it too. gpt-tiny's vocabulary of 8,000 is padded
// to 8,192 at t = 2 (Megatron-LM's vocab_divisible_by 128 × t): the files hold the 8,000 real rows
// only, of the parameter and of every optimizer state, with the straight (unpadded, t = 1) run's
// values.
TEST(CheckpointResume, TensorParallelAndZeroCheckpointsResumeOnOneRank) {
  const std::string straight = straight_run();
  const std::vector<double> expected = testing::metric_values(straight, "loss");
  ASSERT_EQ(expected.size(), 10u);
  const std::vector<std::pair<std::string, std::vector<std::string>>> layouts = {
      {"tp2-2stages", tensor_parallel_two_stages()},
      {"tp2-2replicas-zero1", {"parallel.planner=manual", "parallel.stages=1", "parallel.replicas=[2]",
                               "parallel.tensor_parallel=2", "parallel.zero=1", "train.microbatches=2"}}};
  for (const auto& [name, settings] : layouts) {
    const std::string written = kRoot + "/" + name;
    const testing::PartrainRun run = train(4, written, settings);
    ASSERT_EQ(run.status, 0) << run.command << "\n" << run.log;
    const std::vector<double> split = testing::metric_values(written, "loss");
    ASSERT_EQ(split.size(), 10u);
    for (std::size_t i = 0; i < split.size(); ++i)
      EXPECT_NEAR(split[i], expected[i], 1e-5 * std::abs(expected[i])) << name << " step " << i + 1;
    expect_same_vocabulary_rows(written, straight, name);

    expect_resumes_on_one_rank(written, written + "-to-one-rank", expected, name);
  }
}

// ZeRO-1 in mixed precision shards the f32 master weights with the optimizer state (ZeRO §5.1,
// Megatron-LM's distributed optimizer): each data-parallel rank keeps and writes only its shard of a
// master, as a range of the whole dataset. A bf16 run on 2 stages x 2 replicas with ZeRO-1 has the
// losses and, dataset for dataset, the checkpoint of the same run without ZeRO-1 bitwise (a sum of
// two replicas' gradients does not depend on the order; AdamW is element-wise), resumes its own
// step-5 checkpoint bitwise, and that checkpoint resumes on one rank with its losses (1e-4: bf16 on
// one rank rounds its microbatches' sums differently).
TEST(CheckpointResume, Bf16ZeroShardsTheMastersAndWritesThemWhole) {
  std::vector<std::string> plain = two_by_two();
  plain.push_back("train.precision=bf16");
  std::vector<std::string> zero = plain;
  zero.push_back("parallel.zero=1");
  const std::string unsharded = kRoot + "/bf16-2x2", sharded = kRoot + "/bf16-2x2-zero1";
  for (const auto& [directory, settings] : {std::pair{unsharded, plain}, std::pair{sharded, zero}}) {
    const testing::PartrainRun run = train(4, directory, settings);
    ASSERT_EQ(run.status, 0) << run.command << "\n" << run.log;
  }
  const std::vector<double> expected = testing::metric_values(unsharded, "loss");
  const std::vector<double> own = testing::metric_values(sharded, "loss");
  ASSERT_EQ(expected.size(), 10u);
  ASSERT_EQ(own.size(), 10u);
  for (std::size_t i = 0; i < own.size(); ++i) EXPECT_EQ(own[i], expected[i]) << "step " << i + 1;

  const io::Checkpoint written = io::read_checkpoint(sharded + "/checkpoints/step_000010.h5");
  const io::Checkpoint reference = io::read_checkpoint(unsharded + "/checkpoints/step_000010.h5");
  ASSERT_EQ(written.tensors.size(), reference.tensors.size());
  std::size_t masters = 0;
  for (const auto& [name, tensor] : reference.tensors) {
    ASSERT_TRUE(written.tensors.count(name)) << name;
    EXPECT_EQ(written.tensors.at(name).to_float_vector(), tensor.to_float_vector()) << name;
    masters += name.rfind("model/", 0) == 0;
  }
  EXPECT_GT(masters, 10u);

  std::vector<std::string> resume = zero;
  resume.push_back("checkpoint.every=0");
  const std::vector<double> continued = resumed_losses(4, sharded, kRoot + "/bf16-2x2-zero1-resumed", resume);
  ASSERT_EQ(continued.size(), 5u);
  for (std::size_t i = 0; i < continued.size(); ++i) EXPECT_EQ(continued[i], own[5 + i]) << "resumed, step " << 6 + i;

  const std::vector<double> alone =
      resumed_losses(1, sharded, kRoot + "/bf16-2x2-zero1-to-one-rank",
                     {"parallel.planner=dpl", "train.microbatches=1", "train.precision=bf16"});
  ASSERT_EQ(alone.size(), 5u);
  for (std::size_t i = 0; i < alone.size(); ++i)
    EXPECT_NEAR(alone[i], own[5 + i], 1e-4 * std::abs(own[5 + i])) << "one rank, step " << 6 + i;
}

TEST(CheckpointResume, DamagedNewestCheckpointIsSkipped) {
  const std::string straight = straight_run();
  for (const std::string damage : {"truncated", "bit-flipped"}) {
    // A copy of the checkpoints with the newest one damaged.
    const std::string directory = kRoot + "/damaged-" + damage;
    std::filesystem::remove_all(directory);
    std::filesystem::create_directories(directory + "/checkpoints");
    for (const char* name : {"step_000005.h5", "step_000010.h5"})
      std::filesystem::copy_file(straight + "/checkpoints/" + name, directory + "/checkpoints/" + name);
    const std::string newest = directory + "/checkpoints/step_000010.h5";
    const auto size = std::filesystem::file_size(newest);
    if (damage == "truncated") {
      std::filesystem::resize_file(newest, size / 2);
    } else {  // flip bits in the middle of the file, inside the tensor data
      std::fstream file(newest, std::ios::in | std::ios::out | std::ios::binary);
      for (std::uintmax_t offset = size / 2; offset < size / 2 + 64; ++offset) {
        file.seekg(static_cast<std::streamoff>(offset));
        char byte = 0;
        file.read(&byte, 1);
        file.seekp(static_cast<std::streamoff>(offset));
        byte = static_cast<char>(byte ^ 0x10);
        file.write(&byte, 1);
      }
    }
    const testing::PartrainRun run = testing::run_partrain(
        2,
        std::string("train ") + PARTRAIN_SOURCE_DIR + "/configs/gpt-tiny.toml --resume latest" +
            " --set train.steps=10 --set train.global_batch=8 --set model.seq_len=32 --set log.dir=" + directory +
            " --set data.path=" + PARTRAIN_DATA_DIR + "/text.h5 --set parallel.planner=dpl",
        directory + ".log");
    ASSERT_EQ(run.status, 0) << damage << "\n" << run.log;
    EXPECT_NE(run.log.find("resume: skipping " + newest), std::string::npos) << damage << "\n" << run.log;
    EXPECT_NE(run.log.find("resume: " + directory + "/checkpoints/step_000005.h5 (step 5)"), std::string::npos)
        << damage << "\n" << run.log;
  }
}

TEST(CheckpointResume, H5dumpListsTheTensors) {
  const std::string straight = straight_run();
  if (!std::filesystem::exists("/usr/bin/h5dump")) GTEST_SKIP() << "h5dump (Debian hdf5-tools) is not installed";
  const std::string listing = kRoot + "/h5dump.txt";
  ASSERT_EQ(std::system(("/usr/bin/h5dump -n " + straight + "/checkpoints/step_000010.h5 > " + listing).c_str()), 0);
  std::ifstream file(listing);
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("/model/transformer.wte.weight"), std::string::npos) << text.substr(0, 2000);
  EXPECT_NE(text.find("/optim/transformer.wte.weight/exp_avg_sq"), std::string::npos);
}

}  // namespace
}  // namespace partrain
