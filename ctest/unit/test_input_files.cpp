// Input files validated before use (issue 30, item 1): every reader answers a bad file with one
// partrain::Error naming the file and the dataset or key, never a crash or silent truncation. Each
// test builds one bad file (HDF5 through Hdf5File, JSON as text) and checks the message.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <unistd.h>

#include "core/error.h"
#include "io/batch_file.h"
#include "io/hdf5_file.h"

namespace {

namespace fs = std::filesystem;
using namespace partrain;
using namespace partrain::io;

std::string scratch_path(const std::string& name) {
  const fs::path directory = fs::temp_directory_path() / ("partrain-input-files-" + std::to_string(::getpid()));
  fs::create_directories(directory);
  return (directory / name).string();
}

// The message of the partrain::Error `action` throws ("" when it throws none).
template <typename Action>
std::string error_of(Action action) {
  try {
    action();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

#define EXPECT_ERROR_NAMES(action, ...)                                                  \
  do {                                                                                   \
    const std::string message_ = error_of([&] { action; });                              \
    ASSERT_FALSE(message_.empty()) << "no partrain::Error from " #action;                \
    for (const std::string& part_ : std::vector<std::string>{__VA_ARGS__})               \
      EXPECT_NE(message_.find(part_), std::string::npos) << "'" << part_ << "' not in: " << message_; \
  } while (0)

// ---------------- batch files (partrain eval --data) ----------------

// A field without bounds.
BatchField plain_field(const std::string& name, const Shape& sample_shape, DType dtype) {
  BatchField field;
  field.name = name;
  field.sample_shape = sample_shape;
  field.dtype = dtype;
  return field;
}

// GPT's fields with the bounds eval_command sets: token ids below the vocabulary, labels below it or -100.
std::vector<BatchField> gpt_fields(std::int64_t vocab) {
  BatchField input_ids = plain_field("input_ids", {4}, DType::I64), labels = plain_field("labels", {4}, DType::I64);
  input_ids.upper_bound = labels.upper_bound = vocab;
  input_ids.bound_source = "[model] vocab = " + std::to_string(vocab);
  labels.ignore_value = -100;
  labels.bound_source = "the classes of lm_loss";
  return {input_ids, labels};
}

// A batch file of 3 rows of 4 tokens; `ids` and `labels` as given.
std::string write_gpt_batch(const std::string& name, const std::vector<std::int64_t>& ids,
                            const std::vector<std::int64_t>& labels) {
  const std::string path = scratch_path(name);
  Hdf5File file = Hdf5File::create(path);
  file.write("batch/input_ids", {3, 4}, ids);
  file.write("batch/labels", {3, 4}, labels);
  return path;
}

const std::vector<std::int64_t> kIds = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
const std::vector<std::int64_t> kLabels = {2, 3, 4, -100, 6, 7, 8, -100, 10, 11, 12, -100};

TEST(BatchFileValidation, AcceptsInRangeValuesAndTheIgnoredLabel) {
  const std::string path = write_gpt_batch("good.h5", kIds, kLabels);
  const BatchFile file(path, gpt_fields(13));
  EXPECT_EQ(file.samples_per_epoch(), 3);
  EXPECT_EQ(file.samples(2, 1).at("labels").data<std::int64_t>()[3], -100);
}

TEST(BatchFileValidation, FloatTokenIdsAreRefusedNotTruncated) {
  const std::string path = scratch_path("float-ids.h5");
  {
    Hdf5File file = Hdf5File::create(path);
    std::vector<float> ids(kIds.begin(), kIds.end());
    ids[5] = 5.7f;
    file.write("batch/input_ids", {3, 4}, ids);
    file.write("batch/labels", {3, 4}, kLabels);
  }
  EXPECT_ERROR_NAMES(BatchFile(path, gpt_fields(13)), path, "/batch/input_ids", "float32", "integers");
}

TEST(BatchFileValidation, IntegerMaskIsRefusedForAFloatField) {
  const std::string path = scratch_path("int-mask.h5");
  {
    Hdf5File file = Hdf5File::create(path);
    file.write("batch/attention_mask", {3, 1, 1, 4}, std::vector<std::int32_t>(12, 0));
  }
  EXPECT_ERROR_NAMES(BatchFile(path, {plain_field("attention_mask", {1, 1, 4}, DType::F32)}), path, "/batch/attention_mask",
                     "int32", "floats");
}

TEST(BatchFileValidation, NonFiniteFloatIsRefused) {
  const std::string path = scratch_path("nan-mask.h5");
  {
    Hdf5File file = Hdf5File::create(path);
    std::vector<float> mask(12, 0.0f);
    mask[9] = std::numeric_limits<float>::quiet_NaN();
    file.write("batch/attention_mask", {3, 1, 1, 4}, mask);
  }
  EXPECT_ERROR_NAMES(BatchFile(path, {plain_field("attention_mask", {1, 1, 4}, DType::F32)}), path, "/batch/attention_mask",
                     "row 2", "not a finite number");
}

TEST(BatchFileValidation, TokenIdOutsideTheVocabularyNamesRowAndValue) {
  std::vector<std::int64_t> ids = kIds;
  ids[6] = 13;
  const std::string path = write_gpt_batch("big-id.h5", ids, kLabels);
  EXPECT_ERROR_NAMES(BatchFile(path, gpt_fields(13)), path, "/batch/input_ids", "row 1", "holds 13", "[0, 13)",
                     "[model] vocab = 13");
  ids[6] = -1;
  const std::string negative = write_gpt_batch("negative-id.h5", ids, kLabels);
  EXPECT_ERROR_NAMES(BatchFile(negative, gpt_fields(13)), negative, "/batch/input_ids", "holds -1");
}

TEST(BatchFileValidation, LabelOutsideTheClassesIsRefused) {
  std::vector<std::int64_t> labels = kLabels;
  labels[0] = -1;  // not the ignore index
  const std::string path = write_gpt_batch("bad-label.h5", kIds, labels);
  EXPECT_ERROR_NAMES(BatchFile(path, gpt_fields(13)), path, "/batch/labels", "row 0", "holds -1",
                     "not the ignored label -100");
}

TEST(BatchFileValidation, UnboundedFieldsAreNotRangeChecked) {
  std::vector<std::int64_t> ids = kIds;
  ids[0] = 1000;
  const std::string path = write_gpt_batch("unbounded.h5", ids, kLabels);
  EXPECT_NO_THROW(BatchFile(path, {plain_field("input_ids", {4}, DType::I64), plain_field("labels", {4}, DType::I64)}));
}

}  // namespace
