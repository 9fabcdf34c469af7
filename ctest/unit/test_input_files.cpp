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

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/batch_file.h"
#include "io/batch_source.h"
#include "io/classification_dataset.h"
#include "io/config.h"
#include "io/hdf5_file.h"
#include "io/image_dataset.h"
#include "io/text_dataset.h"
#include "partition/tarnawski/workload.h"
#include "profile/profile_db.h"

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

// ---------------- prepared text (data/prepare.sh text.h5) ----------------

// A tiny text.h5 by hand: 2 documents of 2 sentences of 2 tokens; `float_tokens` stores /tokens as
// float32; the offsets and the held-out split as given.
std::string write_text(const std::string& name, bool float_tokens, const std::vector<std::int64_t>& sentence_offsets,
                       const std::vector<std::int64_t>& heldout, const std::vector<std::int64_t>& special = {}) {
  const std::string path = scratch_path(name);
  Hdf5File file = Hdf5File::create(path);
  const std::vector<std::int32_t> tokens = {4, 5, 6, 7, 8, 9, 10, 11};
  if (float_tokens)
    file.write("tokens", {8}, std::vector<float>(tokens.begin(), tokens.end()));
  else
    file.write("tokens", {8}, tokens);
  file.write("sentence_offsets", {static_cast<std::int64_t>(sentence_offsets.size())}, sentence_offsets);
  file.write("document_offsets", {3}, std::vector<std::int64_t>{0, 4, 8});
  file.write("split/train", {1}, std::vector<std::int64_t>{0});
  file.write("split/heldout", {static_cast<std::int64_t>(heldout.size())}, heldout);
  file.write_int_attribute("/", "vocab_size", 16);
  int id = 0;
  for (const char* special : {"pad_id", "unk_id", "bos_id", "eos_id"}) file.write_int_attribute("/", special, id++);
  for (const char* special : {"cls_id", "sep_id", "mask_id"}) file.write_int_attribute("/", special, 12 + id++ - 4);
  if (!special.empty()) {  // a published tokenizer's ids (pad, unk, bos, eos, cls, sep, mask; -1: none)
    const char* keys[] = {"pad_id", "unk_id", "bos_id", "eos_id", "cls_id", "sep_id", "mask_id"};
    for (std::size_t i = 0; i < special.size(); ++i) file.write_int_attribute("/", keys[i], special[i]);
    file.write_string_attribute("/", "tokenizer_type", "WordPiece");
    file.write_string_attribute("/", "tokenizer_source", "/models/minilm/tokenizer.json");
  }
  return path;
}

const std::vector<std::int64_t> kSentenceOffsets = {0, 2, 4, 6, 8};

TEST(TextDatasetValidation, AcceptsTheWellFormedFixture) {
  EXPECT_NO_THROW(TextDataset(write_text("good-text.h5", false, kSentenceOffsets, {1}), TextSplit::HeldOut));
}

TEST(TextDatasetValidation, FloatTokensAreRefused) {
  const std::string path = write_text("float-tokens.h5", true, kSentenceOffsets, {1});
  EXPECT_ERROR_NAMES(TextDataset(path, TextSplit::Train), path, "/tokens", "float32", "expected integers");
}

TEST(TextDatasetValidation, DecreasingOffsetsAreRefused) {
  const std::string path = write_text("decreasing.h5", false, {0, 4, 2, 6, 8}, {1});
  EXPECT_ERROR_NAMES(TextDataset(path, TextSplit::Train), path, "/sentence_offsets", "non-decreasing", "entry 2");
}

TEST(TextDatasetValidation, OffsetsPastTheTokenCountAreRefused) {
  const std::string path = write_text("past-end.h5", false, {0, 2, 4, 6, 9}, {1});
  EXPECT_ERROR_NAMES(TextDataset(path, TextSplit::Train), path, "/sentence_offsets", "token count 8");
}

TEST(TextDatasetValidation, SplitNamingAMissingDocumentIsRefused) {
  const std::string path = write_text("split-range.h5", false, kSentenceOffsets, {2});
  EXPECT_ERROR_NAMES(TextDataset(path, TextSplit::HeldOut), path, "/split/heldout", "document 2 of 2");
}

// ---------------- the data's tokenizer against the model's (issue 28, item 1) ----------------

// The well-formed text fixture with the special ids `special` (pad, unk, bos, eos, cls, sep, mask;
// -1: none) and a recorded tokenizer, as data/prepare_text.py --tokenizer writes it.
std::string write_tokenized_text(const std::string& name, const std::vector<std::int64_t>& special) {
  return write_text(name, false, kSentenceOffsets, {1}, special);
}

ExperimentConfig text_config(const std::string& type, const std::string& path,
                             std::vector<std::pair<std::string, std::int64_t>> declared = {}) {
  ExperimentConfig config;
  config.path = "configs/published.toml";
  config.model.type = type;
  config.model.vocab = 16;
  config.model.seq_len = 3;
  config.model.special_token_ids = std::move(declared);
  config.data.path = path;
  return config;
}

// WordPiece-like ids: [PAD] 0, [UNK] 1, no bos/eos, [CLS] 12, [SEP] 13, [MASK] 14.
const std::vector<std::int64_t> kBertIds = {0, 1, -1, -1, 12, 13, 14};
// Byte-level-BPE-like ids: only <|endoftext|> (15) as bos and eos.
const std::vector<std::int64_t> kGptIds = {-1, -1, 15, 15, -1, -1, -1};

TEST(TokenizerAgreement, TheModelsOwnTokenizersDataIsAccepted) {
  const std::string bert = write_tokenized_text("bert-ids.h5", kBertIds);
  EXPECT_NO_THROW(make_batch_source(text_config("bert", bert, {{"pad_id", 0}, {"cls_id", 12}, {"sep_id", 13},
                                                               {"mask_id", 14}, {"eos_id", -1}}), false));
  const std::string gpt = write_tokenized_text("gpt-ids.h5", kGptIds);
  EXPECT_NO_THROW(make_batch_source(text_config("gpt", gpt, {{"eos_id", 15}, {"bos_id", 15}, {"cls_id", -1}}), false));
  EXPECT_NO_THROW(make_batch_source(text_config("gpt", gpt), false));  // nothing declared: nothing checked
}

TEST(TokenizerAgreement, ADifferentSpecialIdNamesBothIdsTheKeyAndTheFiles) {
  const std::string path = write_tokenized_text("other-cls.h5", kBertIds);
  EXPECT_ERROR_NAMES(make_batch_source(text_config("bert", path, {{"cls_id", 101}}), false), path,
                     "WordPiece tokenizer /models/minilm/tokenizer.json", "the data's cls_id is 12",
                     "the model's is 101", "[model] cls_id in configs/published.toml", "data/prepare.sh --tokenizer");
  // A model without a token the data has, and the other way round.
  EXPECT_ERROR_NAMES(make_batch_source(text_config("bert", path, {{"bos_id", 2}}), false), "the data's bos_id is -1",
                     "the model's is 2");
  EXPECT_ERROR_NAMES(make_batch_source(text_config("gpt", write_tokenized_text("gpt-eos.h5", kGptIds),
                                                   {{"eos_id", -1}}), true),
                     "the data's eos_id is 15", "the model's is -1");
}

TEST(TokenizerAgreement, ADeclaredTokenizersVocabularyMustBeTheDatas) {
  const std::string path = write_tokenized_text("vocab.h5", kBertIds);
  ExperimentConfig config = text_config("bert", path, {{"cls_id", 12}});
  config.model.vocab = 30522;  // the same [CLS] id, another tokenizer (bert-base-cased has 28996)
  EXPECT_ERROR_NAMES(make_batch_source(config, false), path, "the data's vocabulary (16) differs from the model's",
                     "[model] vocab = 30522 in configs/published.toml");
  config.model.special_token_ids.clear();  // a model trained from scratch: a larger vocabulary is fine
  EXPECT_NO_THROW(make_batch_source(config, false));
  config.model.vocab = 15;
  EXPECT_ERROR_NAMES(make_batch_source(config, false), "the data's vocabulary (16) exceeds the model's",
                     "[model] vocab = 15");
}

TEST(TokenizerAgreement, BertRefusesDataWithoutItsSpecialTokensAndGptWithoutEos) {
  const std::string gpt = write_tokenized_text("bpe-for-bert.h5", kGptIds);
  EXPECT_ERROR_NAMES(make_batch_source(text_config("bert", gpt), false), gpt, "has no [CLS] token",
                     "prepare the data with a BERT tokenizer");
  const std::string bert = write_tokenized_text("wordpiece-for-gpt.h5", kBertIds);
  EXPECT_ERROR_NAMES(make_batch_source(text_config("gpt", bert), false), bert, "no end-of-text token (eos_id)");
}

TEST(TokenizerAgreement, SpecialIdOutsideTheVocabularyIsRefused) {
  const std::string path = write_tokenized_text("special-range.h5", {0, 1, -1, -1, 12, 13, 16});
  EXPECT_ERROR_NAMES(TextDataset(path, TextSplit::Train), path, "special token id (16)", "[0, 16)");
}

// ---------------- labelled texts (data/prepare_pos.py pos.h5; issue 28, item 3) ----------------

// Three texts (ids 5 6 7 | 8 | 9 10 11 12 13) labelled 0, 1, 3 of 4 classes; texts 0 and 2 train,
// 1 held out; [PAD] 0, [CLS] 14, [SEP] 15 (no [MASK]: classification needs none).
std::string write_labelled_texts(const std::string& name, std::int64_t last_label = 3, std::int64_t cls = 14) {
  const std::string path = scratch_path(name);
  Hdf5File file = Hdf5File::create(path);
  file.write("tokens", {9}, std::vector<std::int32_t>{5, 6, 7, 8, 9, 10, 11, 12, 13});
  file.write("offsets", {4}, std::vector<std::int64_t>{0, 3, 4, 9});
  file.write("labels", {3}, std::vector<std::int64_t>{0, 1, last_label});
  file.write("split/train", {2}, std::vector<std::int64_t>{0, 2});
  file.write("split/heldout", {1}, std::vector<std::int64_t>{1});
  file.write_int_attribute("/", "classes", 4);
  file.write_int_attribute("/", "vocab_size", 16);
  const std::vector<std::int64_t> ids = {0, 1, -1, -1, cls, 15, -1};
  const char* keys[] = {"pad_id", "unk_id", "bos_id", "eos_id", "cls_id", "sep_id", "mask_id"};
  for (int i = 0; i < 7; ++i) file.write_int_attribute("/", keys[i], ids[i]);
  return path;
}

TEST(ClassificationDataset, SamplesAreClsTextSepPaddedWithTheirLabels) {
  const ClassificationDataset train(write_labelled_texts("pos.h5"), false);
  ASSERT_EQ(train.size(), 2);
  const ClassificationBatch batch = train.batch(5, 7, 0, {0, 1});
  std::vector<std::vector<std::int64_t>> rows;
  for (int row = 0; row < 2; ++row) {
    const std::int64_t* ids = batch.input_ids.data<std::int64_t>() + row * 5;
    rows.emplace_back(ids, ids + 5);
    const std::int64_t label = batch.labels.data<std::int64_t>()[row];
    // Text 0 fits; text 2 is cut to 3 tokens so that [CLS] and [SEP] fit; no padding needed in either.
    const std::vector<std::int64_t> expected = label == 0 ? std::vector<std::int64_t>{14, 5, 6, 7, 15}
                                                          : std::vector<std::int64_t>{14, 9, 10, 11, 15};
    EXPECT_EQ(rows.back(), expected);
    for (int i = 0; i < 5; ++i) EXPECT_EQ(batch.attention_mask.data<std::int64_t>()[row * 5 + i], 1);
  }
  EXPECT_NE(rows[0], rows[1]);  // the epoch's order is a permutation of the split
  const ClassificationDataset heldout(write_labelled_texts("pos.h5"), true);
  const ClassificationBatch padded = heldout.batch(5, 7, 0, {0});
  EXPECT_EQ(std::vector<std::int64_t>(padded.input_ids.data<std::int64_t>(), padded.input_ids.data<std::int64_t>() + 5),
            (std::vector<std::int64_t>{14, 8, 15, 0, 0}));
  EXPECT_EQ(std::vector<std::int64_t>(padded.attention_mask.data<std::int64_t>(), padded.attention_mask.data<std::int64_t>() + 5),
            (std::vector<std::int64_t>{1, 1, 1, 0, 0}));
  EXPECT_EQ(padded.labels.data<std::int64_t>()[0], 1);
}

TEST(ClassificationDataset, BatchSourceGivesTheClassifiersInputsAndChecksClasses) {
  ExperimentConfig config = text_config("bert", write_labelled_texts("pos-source.h5"));
  config.model.task = "classification";
  config.model.classes = 4;
  const auto source = make_batch_source(config, false);
  const NamedTensors samples = source->samples(0, 3);  // 3 samples of a 2-text epoch: into epoch 1
  EXPECT_EQ(samples.at("labels").shape(), (Shape{3}));
  EXPECT_EQ(samples.at("attention_mask").shape(), (Shape{3, 1, 1, 3}));
  EXPECT_EQ(samples.count("mlm_labels"), 0u);
  config.model.classes = 3;
  EXPECT_ERROR_NAMES(make_batch_source(config, false), "4 classes, but [model] classes = 3");
}

TEST(ClassificationDataset, BadLabelsAndMissingSpecialTokensAreNamed) {
  const std::string label = write_labelled_texts("pos-label.h5", 4);
  EXPECT_ERROR_NAMES(ClassificationDataset(label, false), label, "/labels holds 4 at row 2", "[0, 4)");
  const std::string cls = write_labelled_texts("pos-cls.h5", 3, -1);
  EXPECT_ERROR_NAMES(ClassificationDataset(cls, false), cls, "has no [CLS] token");
}

// ---------------- prepared images (data/prepare.sh fashion_mnist.h5) ----------------

std::string write_images(const std::string& name, bool float_pixels, std::uint8_t last_label) {
  const std::string path = scratch_path(name);
  Hdf5File file = Hdf5File::create(path);
  for (const char* split : {"train", "test"}) {
    if (float_pixels)
      file.write(std::string(split) + "/images", {2, 2, 2}, std::vector<float>(8, 0.5f));
    else
      file.write(std::string(split) + "/images", {2, 2, 2}, std::vector<std::uint8_t>(8, 128));
    file.write(std::string(split) + "/labels", {2}, std::vector<std::uint8_t>{3, last_label});
  }
  return path;
}

ExperimentConfig image_config(const std::string& path) {
  ExperimentConfig config;
  config.path = "configs/images.toml";
  config.model.type = "resnet";
  config.model.channels = 1;
  config.model.image_size = 2;
  config.model.classes = 10;
  config.data.path = path;
  return config;
}

TEST(ImageDatasetValidation, FloatPixelsAreRefused) {
  const std::string path = write_images("float-images.h5", true, 4);
  EXPECT_ERROR_NAMES(ImageDataset(path, ImageSplit::Train), path, "/train/images", "float32", "expected integers");
}

TEST(ImageDatasetValidation, LabelOutsideTheClassesIsRefusedBeforeTraining) {
  EXPECT_NO_THROW(make_batch_source(image_config(write_images("good-images.h5", false, 9)), false));
  const std::string path = write_images("big-label.h5", false, 10);
  EXPECT_ERROR_NAMES(make_batch_source(image_config(path), true), path, "/test/labels", "holds label 10",
                     "[0, 10)", "[model] classes in configs/images.toml");
}

// ---------------- ProfileDB (profile cache files) ----------------

nlohmann::json profile_document() {
  return {{"format", "partrain-profile-db"},
          {"version", 7},
          {"graph_hash", "ab12"},
          {"backend", "cpu"},
          {"dtype", "f32"},
          {"measurements",
           {{{"tasks", "0-3"}, {"batch", 2}, {"forward_seconds", 0.5}, {"backward_seconds", 1.0},
             {"parameter_bytes", 64}, {"activation_bytes", 32}, {"boundary_input_bytes", 8},
             {"boundary_output_bytes", 8}, {"peak_bytes", 128}}}}};
}

TEST(ProfileDbValidation, AcceptsAWellFormedDocument) {
  const profile::ProfileDB db = profile::ProfileDB::from_json(profile_document(), "cache/profile.json");
  EXPECT_NE(db.find(std::vector<int>{0, 1, 2, 3}, 2), nullptr);
}

TEST(ProfileDbValidation, NegativeTimeIsRefused) {
  nlohmann::json document = profile_document();
  document["measurements"][0]["backward_seconds"] = -1.0;
  EXPECT_ERROR_NAMES(profile::ProfileDB::from_json(document, "cache/profile.json"), "cache/profile.json",
                     "measurements[0].backward_seconds = -1.0", "non-negative");
}

TEST(ProfileDbValidation, NonPositiveBatchIsRefused) {
  nlohmann::json document = profile_document();
  document["measurements"][0]["batch"] = 0;
  EXPECT_ERROR_NAMES(profile::ProfileDB::from_json(document, "cache/profile.json"), "cache/profile.json",
                     "measurements[0].batch = 0", "positive integer");
}

TEST(ProfileDbValidation, MissingKeyIsNamed) {
  nlohmann::json document = profile_document();
  document["measurements"][0].erase("peak_bytes");
  EXPECT_ERROR_NAMES(profile::ProfileDB::from_json(document, "cache/profile.json"), "cache/profile.json",
                     "measurements[0] has no key 'peak_bytes'");
  document = profile_document();
  document["optimizer_seconds_per_byte"] = {{"adamw", -2.0}};
  EXPECT_ERROR_NAMES(profile::ProfileDB::from_json(document, "cache/profile.json"), "cache/profile.json",
                     "optimizer_seconds_per_byte[\"adamw\"]", "non-negative");
}

// ---------------- workload JSON (plan --workload) ----------------

nlohmann::json workload_document() {
  return nlohmann::json::parse(R"({"maxSizePerFPGA": 100, "maxFPGAs": 2, "maxCPUs": 1,
    "nodes": [{"id": 1, "cpuLatency": 1, "fpgaLatency": 0.5, "size": 10, "supportedOnFpga": 1, "isBackwardNode": 0},
              {"id": 2, "cpuLatency": 2, "fpgaLatency": 1, "size": 10, "supportedOnFpga": true, "isBackwardNode": 0}],
    "edges": [{"sourceId": 1, "destId": 2, "cost": 0.1}]})");
}

TEST(WorkloadValidation, AcceptsAWellFormedDocument) {
  EXPECT_EQ(partition::parse_workload(workload_document(), "w.json").nodes.size(), 2u);
}

TEST(WorkloadValidation, HugeOrFractionalIntegersAreRefused) {
  nlohmann::json document = workload_document();
  document["nodes"][1]["id"] = 1e300;  // casting it to long would be undefined behaviour
  EXPECT_ERROR_NAMES(partition::parse_workload(document, "w.json"), "w.json", "node #1", "'id'", "2^53");
  document = workload_document();
  document["maxFPGAs"] = 1e12;
  EXPECT_ERROR_NAMES(partition::parse_workload(document, "w.json"), "w.json", "'maxFPGAs'", "too large");
  document = workload_document();
  document["maxSizePerFPGA"] = -5;
  EXPECT_ERROR_NAMES(partition::parse_workload(document, "w.json"), "w.json", "'maxSizePerFPGA'", "non-negative");
  document = workload_document();
  document["edges"][0]["destId"] = 7;
  EXPECT_ERROR_NAMES(partition::parse_workload(document, "w.json"), "w.json", "edge #0", "unknown destination node 7");
}

}  // namespace
