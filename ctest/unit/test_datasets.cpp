// Datasets: text.h5 and fashion_mnist.h5 readers on small fixtures written at test time in the
// production layout (write_text_dataset / write_image_dataset), so CI never runs data/prepare.sh.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <unistd.h>

#include "core/error.h"
#include "io/batch_source.h"
#include "io/config.h"
#include "io/hdf5_file.h"
#include "io/image_dataset.h"
#include "io/text_dataset.h"
#include "io/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using namespace partrain;
using namespace partrain::io;

constexpr std::int32_t kVocab = 200;
constexpr std::int64_t kDocuments = 200;

std::vector<std::int64_t> row(const Tensor& tensor, std::int64_t index) {
  const std::int64_t width = tensor.rank() == 1 ? 1 : tensor.dim(1);
  const std::int64_t* data = tensor.data<std::int64_t>() + index * width;
  return std::vector<std::int64_t>(data, data + width);
}

std::vector<std::int64_t> values(const Tensor& tensor) {
  const std::int64_t* data = tensor.data<std::int64_t>();
  return std::vector<std::int64_t>(data, data + tensor.numel());
}

std::vector<std::int64_t> range(std::int64_t count) {
  std::vector<std::int64_t> result(count);
  for (std::int64_t index = 0; index < count; ++index) result[index] = index;
  return result;
}

class DatasetTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    directory_ = fs::temp_directory_path() / ("partrain-datasets-" + std::to_string(::getpid()));
    fs::create_directories(directory_);
    // Text: 200 documents of 2..8 sentences of 3..20 ordinary tokens (ids 7..199); every 10th held out.
    std::mt19937 engine(7);
    std::vector<std::vector<std::vector<std::int32_t>>> documents(kDocuments);
    for (auto& document : documents) {
      document.resize(2 + engine() % 7);
      for (auto& sentence : document) {
        sentence.resize(3 + engine() % 18);
        for (auto& token : sentence) token = 7 + static_cast<std::int32_t>(engine() % (kVocab - 7));
      }
    }
    for (std::int64_t document = 0; document < kDocuments; document += 10) heldout_.push_back(document);
    special_ = SpecialTokens{0, 1, 2, 3, 4, 5, 6};
    write_text_dataset(text_path(), documents, heldout_, special_, kVocab);
    documents_ = documents;
    // Images: 100 train and 20 test 28x28 images with known pixels and labels.
    std::vector<std::uint8_t> train_images(100 * 784), test_images(20 * 784), train_labels(100), test_labels(20);
    for (std::size_t index = 0; index < train_images.size(); ++index) train_images[index] = (index * 7) % 256;
    for (std::size_t index = 0; index < test_images.size(); ++index) test_images[index] = (index * 3) % 256;
    for (std::size_t index = 0; index < train_labels.size(); ++index) train_labels[index] = index % 10;
    for (std::size_t index = 0; index < test_labels.size(); ++index) test_labels[index] = (index + 5) % 10;
    write_image_dataset(image_path(), 28, 28, train_images, train_labels, test_images, test_labels);
  }
  static void TearDownTestSuite() { fs::remove_all(directory_); }
  static std::string text_path() { return (directory_ / "text.h5").string(); }
  static std::string image_path() { return (directory_ / "fashion_mnist.h5").string(); }

  static fs::path directory_;
  static std::vector<std::int64_t> heldout_;
  static SpecialTokens special_;
  static std::vector<std::vector<std::vector<std::int32_t>>> documents_;
};
fs::path DatasetTest::directory_;
std::vector<std::int64_t> DatasetTest::heldout_;
SpecialTokens DatasetTest::special_;
std::vector<std::vector<std::vector<std::int32_t>>> DatasetTest::documents_;

TEST(ShuffledOrder, IsADeterministicPermutation) {
  for (std::int64_t count : {0, 1, 2, 17, 1000}) {
    const auto order = shuffled_order(count, 42, 3);
    std::vector<std::int64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(sorted, range(count));
    EXPECT_EQ(order, shuffled_order(count, 42, 3));
  }
  EXPECT_NE(shuffled_order(1000, 42, 3), shuffled_order(1000, 42, 4));
  EXPECT_NE(shuffled_order(1000, 42, 3), shuffled_order(1000, 43, 3));
  EXPECT_NE(shuffled_order(1000, 42, 3), range(1000));
}

TEST_F(DatasetTest, TextAttributesAndSplit) {
  const TextDataset train(text_path(), TextSplit::Train);
  const TextDataset heldout(text_path(), TextSplit::HeldOut);
  EXPECT_EQ(train.vocab_size(), kVocab);
  EXPECT_EQ(train.special_tokens().mask, 6);
  EXPECT_EQ(train.special_tokens().cls, 4);
  EXPECT_EQ(heldout.document_indices(), heldout_);
  std::set<std::int64_t> all(train.document_indices().begin(), train.document_indices().end());
  for (std::int64_t document : heldout.document_indices()) EXPECT_EQ(all.count(document), 0u) << document;
  all.insert(heldout.document_indices().begin(), heldout.document_indices().end());
  EXPECT_EQ(static_cast<std::int64_t>(all.size()), kDocuments);
  std::int64_t heldout_tokens = 0;
  for (std::int64_t document : heldout_)
    for (const auto& sentence : documents_[document]) heldout_tokens += sentence.size();
  EXPECT_EQ(heldout.token_count(), heldout_tokens);
  std::vector<std::int32_t> expected;
  for (const auto& sentence : documents_[3]) expected.insert(expected.end(), sentence.begin(), sentence.end());
  EXPECT_EQ(train.document_tokens(3), expected);
}

TEST_F(DatasetTest, HeldOutSamplesComeFromHeldOutDocuments) {
  const TextDataset heldout(text_path(), TextSplit::HeldOut);
  std::set<std::int32_t> heldout_tokens;  // GPT windows of the held-out split only hold its tokens
  for (std::int64_t document : heldout_)
    for (const auto& sentence : documents_[document]) heldout_tokens.insert(sentence.begin(), sentence.end());
  heldout_tokens.insert(special_.eos);
  const auto batch = heldout.gpt_samples(16, range(heldout.gpt_sample_count(16)));
  for (std::int64_t id : values(batch.input_ids)) EXPECT_EQ(heldout_tokens.count(static_cast<std::int32_t>(id)), 1u);
}

TEST_F(DatasetTest, BertShapesAndLayout) {
  const TextDataset dataset(text_path(), TextSplit::Train);
  const BertSampleOptions options{64, true, 0.15};
  const std::int64_t count = dataset.bert_sample_count(options);
  ASSERT_GT(count, 100);
  const BertBatch batch = dataset.bert_batch(options, 1, 0, range(8));
  for (const Tensor* tensor : {&batch.input_ids, &batch.token_type_ids, &batch.attention_mask, &batch.mlm_labels}) {
    EXPECT_EQ(tensor->dtype(), DType::I64);
    EXPECT_EQ(tensor->shape(), (Shape{8, 64}));
  }
  EXPECT_EQ(batch.nsp_labels.shape(), (Shape{8}));
  EXPECT_EQ(batch.nsp_labels.dtype(), DType::I64);
  for (std::int64_t sample = 0; sample < 8; ++sample) {
    const auto ids = row(batch.input_ids, sample), types = row(batch.token_type_ids, sample),
               mask = row(batch.attention_mask, sample), labels = row(batch.mlm_labels, sample);
    EXPECT_EQ(ids[0], special_.cls);
    std::vector<std::int64_t> separators;
    std::int64_t real = 0;
    for (std::int64_t index = 0; index < 64; ++index) {
      if (ids[index] == special_.sep && labels[index] == -100) separators.push_back(index);
      real += mask[index];
      if (mask[index] == 0) {
        EXPECT_EQ(ids[index], special_.pad);
        EXPECT_EQ(labels[index], -100);
      }
    }
    ASSERT_EQ(separators.size(), 2u);
    EXPECT_EQ(separators[1], real - 1);
    for (std::int64_t index = 0; index < real; ++index) EXPECT_EQ(types[index], index > separators[0] ? 1 : 0);
    const std::int64_t nsp = row(batch.nsp_labels, sample)[0];
    EXPECT_TRUE(nsp == 0 || nsp == 1);
  }
}

TEST_F(DatasetTest, BertWithoutNextSentencePrediction) {
  const TextDataset dataset(text_path(), TextSplit::Train);
  const BertSampleOptions options{32, false, 0.15};
  EXPECT_GT(dataset.bert_sample_count(options), dataset.bert_sample_count({32, true, 0.15}));
  const BertBatch batch = dataset.bert_batch(options, 1, 0, range(16));
  for (std::int64_t label : values(batch.nsp_labels)) EXPECT_EQ(label, -100);
  for (std::int64_t type : values(batch.token_type_ids)) EXPECT_EQ(type, 0);
  for (std::int64_t sample = 0; sample < 16; ++sample) EXPECT_EQ(row(batch.input_ids, sample)[0], special_.cls);
}

TEST_F(DatasetTest, BertIsDeterministic) {
  const TextDataset dataset(text_path(), TextSplit::Train);
  const TextDataset other(text_path(), TextSplit::Train);  // another "rank"
  const BertSampleOptions options{48, true, 0.15};
  const std::vector<std::int64_t> positions = {0, 5, 17, 99, 3};
  const BertBatch first = dataset.bert_batch(options, 9, 2, positions);
  const BertBatch again = other.bert_batch(options, 9, 2, positions);
  EXPECT_EQ(values(first.input_ids), values(again.input_ids));
  EXPECT_EQ(values(first.mlm_labels), values(again.mlm_labels));
  EXPECT_EQ(values(first.nsp_labels), values(again.nsp_labels));
  EXPECT_EQ(values(first.token_type_ids), values(again.token_type_ids));
  // One sample at a time gives the same rows as the batch.
  const BertBatch single = other.bert_batch(options, 9, 2, {17});
  EXPECT_EQ(row(single.input_ids, 0), row(first.input_ids, 2));
  // Another epoch: another order (and other masks).
  const BertBatch next_epoch = dataset.bert_batch(options, 9, 3, positions);
  EXPECT_NE(values(first.input_ids), values(next_epoch.input_ids));
  const BertBatch next_seed = dataset.bert_batch(options, 10, 2, positions);
  EXPECT_NE(values(first.input_ids), values(next_seed.input_ids));
}

TEST_F(DatasetTest, MaskingAndNextSentenceStatistics) {
  const TextDataset dataset(text_path(), TextSplit::Train);
  const BertSampleOptions options{64, true, 0.15};
  const std::int64_t count = dataset.bert_sample_count(options);
  std::int64_t candidates = 0, selected = 0, masked = 0, random = 0, unchanged = 0, random_next = 0, samples = 0;
  for (std::int64_t epoch = 0; epoch < 6; ++epoch) {
    const BertBatch batch = dataset.bert_batch(options, 5, epoch, range(count));
    const std::int64_t* ids = batch.input_ids.data<std::int64_t>();
    const std::int64_t* labels = batch.mlm_labels.data<std::int64_t>();
    const std::int64_t* attention = batch.attention_mask.data<std::int64_t>();
    for (std::int64_t index = 0; index < batch.input_ids.numel(); ++index) {
      if (labels[index] != -100) {
        ++candidates;
        ++selected;
        EXPECT_FALSE(special_.is_special(static_cast<std::int32_t>(labels[index])));
        if (ids[index] == special_.mask) {
          ++masked;
        } else if (ids[index] == labels[index]) {
          ++unchanged;
        } else {
          ++random;
          EXPECT_FALSE(special_.is_special(static_cast<std::int32_t>(ids[index])));
          EXPECT_LT(ids[index], kVocab);
        }
      } else if (attention[index] == 1 && !special_.is_special(static_cast<std::int32_t>(ids[index]))) {
        ++candidates;
      }
    }
    for (std::int64_t label : values(batch.nsp_labels)) random_next += label;
    samples += count;
  }
  ASSERT_GT(candidates, 100000);
  const double selected_share = double(selected) / candidates;
  EXPECT_NEAR(selected_share, 0.15, 0.015);
  EXPECT_NEAR(double(masked) / selected, 0.8, 0.03);
  EXPECT_NEAR(double(random) / selected, 0.1, 0.03);
  EXPECT_NEAR(double(unchanged) / selected, 0.1, 0.03);
  EXPECT_NEAR(double(random_next) / samples, 0.5, 0.05);
}

TEST_F(DatasetTest, NextSentenceFollowsInItsDocument) {
  // With masking off, a B marked "next" continues A inside one document.
  const TextDataset dataset(text_path(), TextSplit::Train);
  const BertSampleOptions options{128, true, 0.0};
  const BertBatch batch = dataset.bert_batch(options, 3, 0, range(64));
  std::vector<std::vector<std::int32_t>> texts;
  for (const auto& document : documents_) {
    std::vector<std::int32_t> text;
    for (const auto& sentence : document) text.insert(text.end(), sentence.begin(), sentence.end());
    texts.push_back(text);
  }
  int checked = 0;
  for (std::int64_t sample = 0; sample < 64; ++sample) {
    if (row(batch.nsp_labels, sample)[0] != 0) continue;
    const auto ids = row(batch.input_ids, sample);
    std::vector<std::int32_t> pair;  // A then B without the special tokens
    for (std::int64_t id : ids)
      if (!special_.is_special(static_cast<std::int32_t>(id))) pair.push_back(static_cast<std::int32_t>(id));
    bool found = false;
    for (const auto& text : texts) found = found || std::search(text.begin(), text.end(), pair.begin(), pair.end()) != text.end();
    EXPECT_TRUE(found) << "sample " << sample;
    ++checked;
  }
  EXPECT_GT(checked, 10);
}

TEST_F(DatasetTest, GptTargetsAreInputsShiftedByOne) {
  const TextDataset dataset(text_path(), TextSplit::Train);
  const std::int64_t length = 32;
  const std::int64_t count = dataset.gpt_sample_count(length);
  EXPECT_EQ(count, (dataset.token_count() + static_cast<std::int64_t>(dataset.document_indices().size()) - 1) / length);
  const GptBatch windows = dataset.gpt_samples(length, {0, 1, 2});
  EXPECT_EQ(windows.input_ids.shape(), (Shape{3, length}));
  EXPECT_EQ(windows.targets.shape(), (Shape{3, length}));
  EXPECT_EQ(windows.targets.dtype(), DType::I64);
  for (std::int64_t sample = 0; sample < 3; ++sample) {
    const auto inputs = row(windows.input_ids, sample), targets = row(windows.targets, sample);
    for (std::int64_t index = 0; index + 1 < length; ++index) EXPECT_EQ(targets[index], inputs[index + 1]);
    if (sample + 1 < 3) {
      EXPECT_EQ(targets[length - 1], row(windows.input_ids, sample + 1)[0]);
    }
  }
  // The stream starts with the first training document followed by eos.
  const auto first = dataset.document_tokens(dataset.document_indices()[0]);
  const auto inputs = row(windows.input_ids, 0);
  for (std::size_t index = 0; index < std::min<std::size_t>(first.size(), length); ++index)
    EXPECT_EQ(inputs[index], first[index]);
  // Shuffled batches: deterministic, a permutation of the windows, epoch-dependent.
  const GptBatch epoch0 = dataset.gpt_batch(length, 4, 0, range(count));
  EXPECT_EQ(values(epoch0.input_ids), values(dataset.gpt_batch(length, 4, 0, range(count)).input_ids));
  EXPECT_NE(values(epoch0.input_ids), values(dataset.gpt_batch(length, 4, 1, range(count)).input_ids));
  const auto order = shuffled_order(count, 4, 0);
  EXPECT_EQ(row(epoch0.input_ids, 5), row(dataset.gpt_samples(length, {order[5]}).input_ids, 0));
  EXPECT_THROW(dataset.gpt_samples(length, {count}), Error);
}

TEST_F(DatasetTest, ImageShapesAndNormalisation) {
  const ImageDataset train(image_path(), ImageSplit::Train);
  const ImageDataset test(image_path(), ImageSplit::Test);
  EXPECT_EQ(train.size(), 100);
  EXPECT_EQ(test.size(), 20);
  const ImageBatch batch = train.samples({0, 3});
  EXPECT_EQ(batch.images.dtype(), DType::F32);
  EXPECT_EQ(batch.images.shape(), (Shape{2, 1, 28, 28}));
  EXPECT_EQ(batch.labels.dtype(), DType::I64);
  EXPECT_EQ(batch.labels.shape(), (Shape{2}));
  EXPECT_EQ(values(batch.labels), (std::vector<std::int64_t>{0, 3}));
  const float* images = batch.images.data<float>();
  const std::size_t pixel = 784 + 10;  // image 3, pixel 10
  const float raw = float((3 * 784 + 10) * 7 % 256);
  EXPECT_NEAR(images[pixel], (raw / 255.0f - 0.2860f) / 0.3530f, 1e-5f);
  EXPECT_NEAR(images[0], (0.0f - 0.2860f) / 0.3530f, 1e-5f);
  EXPECT_EQ(test.label(0), 5);
}

TEST_F(DatasetTest, ImageShufflingIsDeterministic) {
  const ImageDataset train(image_path(), ImageSplit::Train);
  const ImageDataset other(image_path(), ImageSplit::Train);
  const ImageBatch first = train.batch(11, 0, range(100));
  EXPECT_EQ(values(first.labels), values(other.batch(11, 0, range(100)).labels));
  const auto order = shuffled_order(100, 11, 0);
  for (std::int64_t position = 0; position < 100; ++position)
    EXPECT_EQ(row(first.labels, position)[0], order[position] % 10);
  const ImageBatch second_epoch = train.batch(11, 1, range(100));
  EXPECT_NE(values(first.labels), values(second_epoch.labels));
  auto sorted = values(second_epoch.labels), expected = values(first.labels);
  std::sort(sorted.begin(), sorted.end());
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(sorted, expected);
  EXPECT_THROW(train.batch(11, 0, {100}), Error);
}

TEST_F(DatasetTest, ErrorsNameFileAndDataset) {
  try {
    TextDataset dataset((directory_ / "missing.h5").string(), TextSplit::Train);
    FAIL() << "expected partrain::Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("missing.h5"), std::string::npos) << error.what();
  }
  try {
    TextDataset dataset(image_path(), TextSplit::Train);  // an images file has no /tokens
    FAIL() << "expected partrain::Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("tokens"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("fashion_mnist.h5"), std::string::npos) << error.what();
  }
  const Hdf5File file = Hdf5File::open_read(text_path());
  EXPECT_THROW(file.read_int_attribute("/", "no_such_attribute"), Error);
  EXPECT_FALSE(file.has_dataset("no/such/dataset"));
  EXPECT_EQ(file.read_string_attribute("/", "format"), "partrain-text-1");
}

TEST_F(DatasetTest, DamagedCompressedChunkIsNamed) {
  // A copy of text.h5 with bytes in the middle of the first gzip chunk of /tokens inverted.
  const std::string damaged = (directory_ / "damaged.h5").string();
  fs::copy_file(text_path(), damaged, fs::copy_options::overwrite_existing);
  haddr_t address = 0;
  hsize_t size = 0;
  {
    const Hdf5Handle file(H5Fopen(damaged.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT));
    const Hdf5Handle dataset(H5Dopen2(file.get(), "tokens", H5P_DEFAULT));
    hsize_t offset[1] = {0};
    unsigned filters = 0;
    ASSERT_GE(H5Dget_chunk_info_by_coord(dataset.get(), offset, &filters, &address, &size), 0);
    ASSERT_GT(size, 64u) << "the fixture's /tokens should be chunked and compressed";
  }
  {
    std::fstream file(damaged, std::ios::in | std::ios::out | std::ios::binary);
    for (hsize_t position = address + size / 4; position < address + size / 2; ++position) {
      file.seekg(static_cast<std::streamoff>(position));
      char byte = 0;
      file.read(&byte, 1);
      file.seekp(static_cast<std::streamoff>(position));
      byte = static_cast<char>(~byte);
      file.write(&byte, 1);
    }
  }
  try {
    TextDataset dataset(damaged, TextSplit::Train);
    FAIL() << "expected partrain::Error";
  } catch (const Error& error) {
    EXPECT_NE(error.message().find("compressed data in dataset 'tokens' of " + damaged + " is damaged"),
              std::string::npos)
        << error.message();
    EXPECT_EQ(error.message().find("type not convertible"), std::string::npos) << error.message();
  }
}

}  // namespace

// Files written by data/prepare.sh: run by the slow CTest data_prepare (data/check_prepare.sh), which
// sets PARTRAIN_PREPARED_DATA; skipped otherwise.
namespace {

std::string prepared_directory() {
  const char* directory = std::getenv("PARTRAIN_PREPARED_DATA");
  return directory ? directory : "";
}

TEST(PreparedData, TextAndTokenizer) {
  const std::string directory = prepared_directory();
  if (directory.empty()) GTEST_SKIP() << "PARTRAIN_PREPARED_DATA not set (run data/prepare.sh)";
  const partrain::io::TextDataset train(directory + "/text.h5", partrain::io::TextSplit::Train);
  const partrain::io::TextDataset heldout(directory + "/text.h5", partrain::io::TextSplit::HeldOut);
  const partrain::io::Tokenizer tokenizer(directory + "/text.model");
  EXPECT_EQ(train.vocab_size(), tokenizer.vocab_size());
  EXPECT_EQ(train.special_tokens().mask, tokenizer.special_tokens().mask);
  EXPECT_EQ(train.special_tokens().cls, tokenizer.special_tokens().cls);
  EXPECT_GT(train.token_count(), 1000000);
  EXPECT_GT(heldout.token_count(), 10000);
  const auto batch = train.bert_batch({128, true, 0.15}, 0, 0, {0, 1, 2, 3});
  EXPECT_EQ(batch.input_ids.shape(), (partrain::Shape{4, 128}));
  const auto gpt = train.gpt_batch(128, 0, 0, {0, 1});
  EXPECT_EQ(gpt.targets.shape(), (partrain::Shape{2, 128}));
  const std::string text = tokenizer.decode(train.document_tokens(train.document_indices()[0]));
  EXPECT_GT(text.size(), 20u) << text;
}

TEST(PreparedData, FashionMnist) {
  const std::string directory = prepared_directory();
  if (directory.empty()) GTEST_SKIP() << "PARTRAIN_PREPARED_DATA not set (run data/prepare.sh)";
  const partrain::io::ImageDataset train(directory + "/fashion_mnist.h5", partrain::io::ImageSplit::Train);
  const partrain::io::ImageDataset test(directory + "/fashion_mnist.h5", partrain::io::ImageSplit::Test);
  EXPECT_EQ(train.size(), 60000);
  EXPECT_EQ(test.size(), 10000);
  const auto batch = train.batch(0, 0, {0, 1, 2, 3, 4, 5, 6, 7});
  EXPECT_EQ(batch.images.shape(), (partrain::Shape{8, 1, 28, 28}));
  // Normalised with the dataset's statistics: the training set's mean is ~0.
  double sum = 0;
  const auto all = train.samples([] {
    std::vector<std::int64_t> indices(60000);
    for (std::int64_t index = 0; index < 60000; ++index) indices[index] = index;
    return indices;
  }());
  const float* pixels = all.images.data<float>();
  for (std::int64_t index = 0; index < all.images.numel(); ++index) sum += pixels[index];
  EXPECT_NEAR(sum / all.images.numel(), 0.0, 0.01);
  for (std::int64_t label : std::vector<std::int64_t>(all.labels.data<std::int64_t>(), all.labels.data<std::int64_t>() + 60000)) {
    EXPECT_GE(label, 0);
    EXPECT_LT(label, 10);
  }
}

}  // namespace

// [data] synthetic: ResNet images and labels as functions of (seed, sample index) alone, so any
// range of samples is the same wherever and however often it is drawn; held-out samples differ.
TEST(SyntheticImages, SamplesAreFunctionsOfTheSeedAndTheirIndex) {
  ExperimentConfig config;
  config.model.type = "resnet";
  config.model.channels = 3;
  config.model.image_size = 8;
  config.model.classes = 7;
  config.data.synthetic = true;
  const std::unique_ptr<BatchSource> source = make_batch_source(config, false);
  EXPECT_EQ(source->path(), "synthetic");
  const NamedTensors batch = source->samples(5, 3);
  ASSERT_EQ(batch.at("images").shape(), (Shape{3, 3, 8, 8}));
  ASSERT_EQ(batch.at("labels").shape(), (Shape{3}));
  const std::vector<float> pixels = batch.at("images").to_float_vector();
  const NamedTensors one = source->samples(6, 1);  // sample 6 again, alone
  const std::vector<float> sample6 = one.at("images").to_float_vector();
  EXPECT_TRUE(std::equal(sample6.begin(), sample6.end(), pixels.begin() + 192));
  EXPECT_EQ(one.at("labels").data<std::int64_t>()[0], batch.at("labels").data<std::int64_t>()[1]);
  double sum = 0;
  for (float pixel : pixels) {
    EXPECT_GE(pixel, -1.0f);
    EXPECT_LT(pixel, 1.0f);
    sum += pixel;
  }
  EXPECT_LT(std::abs(sum / static_cast<double>(pixels.size())), 0.1);  // uniform on [-1, 1): mean 0
  const NamedTensors many = source->samples(0, 200);
  std::set<std::int64_t> labels;
  for (std::int64_t i = 0; i < 200; ++i) {
    const std::int64_t label = many.at("labels").data<std::int64_t>()[i];
    EXPECT_GE(label, 0);
    EXPECT_LT(label, 7);
    labels.insert(label);
  }
  EXPECT_EQ(labels.size(), 7u);
  const std::vector<float> heldout = make_batch_source(config, true)->samples(5, 3).at("images").to_float_vector();
  EXPECT_NE(heldout, pixels);
  config.train.seed += 1;
  EXPECT_NE(make_batch_source(config, false)->samples(5, 3).at("images").to_float_vector(), pixels);
}
