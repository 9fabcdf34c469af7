#include "io/batch_source.h"

#include <filesystem>
#include <cstring>
#include <map>

#include "core/error.h"
#include "core/rng.h"
#include "io/classification_dataset.h"
#include "io/config.h"
#include "io/image_dataset.h"
#include "io/text_dataset.h"

namespace partrain::io {
namespace {

// The positions of samples [first, first + count) grouped by epoch: epoch -> (positions in that
// epoch's shuffled order, offsets in the output batch).
std::map<std::int64_t, std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>>> by_epoch(
    std::int64_t first, std::int64_t count, std::int64_t per_epoch) {
  PARTRAIN_CHECK(first >= 0 && count >= 0, "samples: bad range [" << first << ", " << first + count << ")");
  std::map<std::int64_t, std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>>> groups;
  for (std::int64_t i = 0; i < count; ++i) {
    auto& group = groups[(first + i) / per_epoch];
    group.first.push_back((first + i) % per_epoch);
    group.second.push_back(i);
  }
  return groups;
}

// Copies row `from_row` of `from` into row `to_row` of `to` (same dtype and row size).
void copy_row(const Tensor& from, std::int64_t from_row, const Tensor& to, std::int64_t to_row) {
  const std::size_t row_bytes = from.nbytes() / static_cast<std::size_t>(from.dim(0));
  std::memcpy(static_cast<char*>(to.raw_data()) + to_row * row_bytes,
              static_cast<const char*>(from.raw_data()) + from_row * row_bytes, row_bytes);
}

// Assembles per-epoch batches into one tensor per name, rows in sample order.
NamedTensors assemble(std::int64_t count, const std::vector<std::pair<NamedTensors, std::vector<std::int64_t>>>& parts) {
  if (parts.size() == 1) return parts.front().first;
  NamedTensors result;
  for (const auto& [name, tensor] : parts.front().first) {
    Shape shape = tensor.shape();
    shape[0] = count;
    result[name] = Tensor::empty(shape, tensor.dtype());
  }
  for (const auto& [tensors, rows] : parts)
    for (const auto& [name, tensor] : tensors)
      for (std::size_t i = 0; i < rows.size(); ++i) copy_row(tensor, static_cast<std::int64_t>(i), result[name], rows[i]);
  return result;
}

// The data's id of a special-token key ("cls_id" -> special.cls).
std::int32_t data_special_id(const SpecialTokens& special, const std::string& key) {
  if (key == "pad_id") return special.pad;
  if (key == "unk_id") return special.unk;
  if (key == "bos_id") return special.bos;
  if (key == "eos_id") return special.eos;
  if (key == "cls_id") return special.cls;
  if (key == "sep_id") return special.sep;
  return special.mask;
}

// The model reads the data's token ids as rows of its embedding: the data's vocabulary must fit it,
// and a model that declares its tokenizer's special ids ([model] pad_id ... mask_id: a published
// model) must get data made by that tokenizer: the same ids and exactly its vocabulary.
template <typename Dataset>
void check_tokenizer(const Dataset& dataset, const std::string& path, const ExperimentConfig& config) {
  const ModelConfig& model = config.model;
  const std::string data = path + " (" + dataset.tokenizer_description() + ")";
  const std::string hint = "; prepare the data with the model's tokenizer (data/prepare.sh --tokenizer PATH)";
  PARTRAIN_CHECK(dataset.vocab_size() <= model.vocab,
                 data << ": the data's vocabulary (" << dataset.vocab_size() << ") exceeds the model's ([model] vocab = "
                      << model.vocab << " in " << config.path << ")" << hint);
  if (model.special_token_ids.empty()) return;
  PARTRAIN_CHECK(dataset.vocab_size() == model.vocab,
                 data << ": the data's vocabulary (" << dataset.vocab_size() << ") differs from the model's ([model] vocab = "
                      << model.vocab << " in " << config.path << ", a model made for another tokenizer)" << hint);
  for (const auto& [key, id] : model.special_token_ids) {
    const std::int32_t data_id = data_special_id(dataset.special_tokens(), key);
    PARTRAIN_CHECK(data_id == id, data << ": the data's " << key << " is " << data_id << ", the model's is " << id
                                       << " ([model] " << key << " in " << config.path << "; -1: no such token)" << hint);
  }
}

class BertSource : public BatchSource {
 public:
  BertSource(const std::string& path, bool heldout, const ExperimentConfig& config)
      : path_(path), dataset_(path, heldout ? TextSplit::HeldOut : TextSplit::Train), seed_(config.train.seed) {
    options_.sequence_length = config.model.seq_len;
    options_.next_sentence_prediction = config.model.nsp;
    options_.mask_probability = config.data.mask_probability;
    check_tokenizer(dataset_, path, config);
    const SpecialTokens& special = dataset_.special_tokens();
    for (const auto& [id, name] : {std::pair{special.cls, "[CLS]"}, std::pair{special.sep, "[SEP]"},
                                   std::pair{special.mask, "[MASK]"}, std::pair{special.pad, "[PAD]"}})
      PARTRAIN_CHECK(id >= 0, path << " (" << dataset_.tokenizer_description() << "): the tokenizer has no " << name
                                   << " token, which BERT samples need ([CLS] A [SEP] B [SEP], masking, padding); "
                                      "prepare the data with a BERT tokenizer");
    per_epoch_ = dataset_.bert_sample_count(options_);
    PARTRAIN_CHECK(per_epoch_ > 0, path << ": no BERT samples in this split");
  }
  NamedTensors samples(std::int64_t first, std::int64_t count) const override {
    std::vector<std::pair<NamedTensors, std::vector<std::int64_t>>> parts;
    for (const auto& [epoch, group] : by_epoch(first, count, per_epoch_)) {
      const BertBatch batch = dataset_.bert_batch(options_, seed_, epoch, group.first);
      const std::int64_t rows = static_cast<std::int64_t>(group.first.size()), length = options_.sequence_length;
      // The model adds the mask to attention scores: 0 for tokens, -10000 for padding ([B, 1, 1, S]).
      Tensor mask = Tensor::empty({rows, 1, 1, length});
      for (std::int64_t i = 0; i < rows * length; ++i)
        mask.data<float>()[i] = batch.attention_mask.data<std::int64_t>()[i] != 0 ? 0.0f : -10000.0f;
      NamedTensors tensors{{"input_ids", batch.input_ids}, {"token_type_ids", batch.token_type_ids},
                           {"attention_mask", mask}, {"mlm_labels", batch.mlm_labels}};
      if (options_.next_sentence_prediction) tensors["nsp_labels"] = batch.nsp_labels;
      parts.emplace_back(std::move(tensors), group.second);
    }
    return assemble(count, parts);
  }
  std::int64_t samples_per_epoch() const override { return per_epoch_; }
  std::int64_t tokens_per_sample() const override { return options_.sequence_length; }
  const std::string& path() const override { return path_; }

 private:
  std::string path_;
  TextDataset dataset_;
  BertSampleOptions options_;
  std::uint64_t seed_;
  std::int64_t per_epoch_ = 0;
};

class GptSource : public BatchSource {
 public:
  GptSource(const std::string& path, bool heldout, const ExperimentConfig& config)
      : path_(path), dataset_(path, heldout ? TextSplit::HeldOut : TextSplit::Train), seed_(config.train.seed),
        length_(config.model.seq_len) {
    check_tokenizer(dataset_, path, config);
    PARTRAIN_CHECK(dataset_.special_tokens().eos >= 0,
                   path << " (" << dataset_.tokenizer_description()
                        << "): the tokenizer has no end-of-text token (eos_id), which separates GPT's documents");
    per_epoch_ = dataset_.gpt_sample_count(length_);
    PARTRAIN_CHECK(per_epoch_ > 0, path << ": no GPT windows of " << length_ << " tokens in this split");
  }
  NamedTensors samples(std::int64_t first, std::int64_t count) const override {
    std::vector<std::pair<NamedTensors, std::vector<std::int64_t>>> parts;
    for (const auto& [epoch, group] : by_epoch(first, count, per_epoch_)) {
      const GptBatch batch = dataset_.gpt_batch(length_, seed_, epoch, group.first);
      parts.emplace_back(NamedTensors{{"input_ids", batch.input_ids}, {"labels", batch.targets}}, group.second);
    }
    return assemble(count, parts);
  }
  std::int64_t samples_per_epoch() const override { return per_epoch_; }
  std::int64_t tokens_per_sample() const override { return length_; }
  const std::string& path() const override { return path_; }

 private:
  std::string path_;
  TextDataset dataset_;
  std::uint64_t seed_;
  std::int64_t length_;
  std::int64_t per_epoch_ = 0;
};

// BERT's sequence classification ([model] task = "classification") on a pos.h5-layout file.
class ClassificationSource : public BatchSource {
 public:
  ClassificationSource(const std::string& path, bool heldout, const ExperimentConfig& config)
      : path_(path), dataset_(path, heldout), seed_(config.train.seed), length_(config.model.seq_len) {
    check_tokenizer(dataset_, path, config);
    PARTRAIN_CHECK(dataset_.classes() <= config.model.classes,
                   path << ": " << dataset_.classes() << " classes, but [model] classes = " << config.model.classes
                        << " in " << config.path);
  }
  NamedTensors samples(std::int64_t first, std::int64_t count) const override {
    std::vector<std::pair<NamedTensors, std::vector<std::int64_t>>> parts;
    for (const auto& [epoch, group] : by_epoch(first, count, dataset_.size())) {
      const ClassificationBatch batch = dataset_.batch(length_, seed_, epoch, group.first);
      const std::int64_t rows = static_cast<std::int64_t>(group.first.size());
      Tensor mask = Tensor::empty({rows, 1, 1, length_});  // additive, as BertSource's
      for (std::int64_t i = 0; i < rows * length_; ++i)
        mask.data<float>()[i] = batch.attention_mask.data<std::int64_t>()[i] != 0 ? 0.0f : -10000.0f;
      parts.emplace_back(NamedTensors{{"input_ids", batch.input_ids}, {"token_type_ids", batch.token_type_ids},
                                      {"attention_mask", mask}, {"labels", batch.labels}},
                         group.second);
    }
    return assemble(count, parts);
  }
  std::int64_t samples_per_epoch() const override { return dataset_.size(); }
  std::int64_t tokens_per_sample() const override { return length_; }
  const std::string& path() const override { return path_; }

 private:
  std::string path_;
  ClassificationDataset dataset_;
  std::uint64_t seed_;
  std::int64_t length_;
};

class ImageSource : public BatchSource {
 public:
  ImageSource(const std::string& path, bool heldout, const ExperimentConfig& config)
      : path_(path), dataset_(path, heldout ? ImageSplit::Test : ImageSplit::Train), seed_(config.train.seed) {
    PARTRAIN_CHECK(config.model.channels == 1 && dataset_.height() == config.model.image_size &&
                       dataset_.width() == config.model.image_size,
                   path << ": images are 1 x " << dataset_.height() << " x " << dataset_.width()
                        << ", but [model] expects " << config.model.channels << " x " << config.model.image_size
                        << " x " << config.model.image_size);
    PARTRAIN_CHECK(config.model.classes >= 10, path << ": 10 classes, but [model] classes = " << config.model.classes);
    PARTRAIN_CHECK(dataset_.max_label() < config.model.classes,
                   path << ": dataset " << dataset_.labels_dataset() << " holds label " << dataset_.max_label()
                        << ", outside [0, " << config.model.classes << ") ([model] classes in " << config.path << ")");
  }
  NamedTensors samples(std::int64_t first, std::int64_t count) const override {
    std::vector<std::pair<NamedTensors, std::vector<std::int64_t>>> parts;
    for (const auto& [epoch, group] : by_epoch(first, count, dataset_.size())) {
      const ImageBatch batch = dataset_.batch(seed_, epoch, group.first);
      parts.emplace_back(NamedTensors{{"images", batch.images}, {"labels", batch.labels}}, group.second);
    }
    return assemble(count, parts);
  }
  std::int64_t samples_per_epoch() const override { return dataset_.size(); }
  std::int64_t tokens_per_sample() const override { return 0; }
  const std::string& path() const override { return path_; }

 private:
  std::string path_;
  ImageDataset dataset_;
  std::uint64_t seed_;
};

class SyntheticImageSource : public BatchSource {
 public:
  SyntheticImageSource(const ExperimentConfig& config, std::uint64_t stream)
      : seed_(config.train.seed), stream_(stream), channels_(config.model.channels), size_(config.model.image_size),
        classes_(config.model.classes) {}
  NamedTensors samples(std::int64_t first, std::int64_t count) const override {
    PARTRAIN_CHECK(first >= 0 && count >= 0, "samples: bad range [" << first << ", " << first + count << ")");
    const std::int64_t per_sample = channels_ * size_ * size_;
    Tensor images = Tensor::empty({count, channels_, size_, size_}, DType::F32);
    Tensor labels = Tensor::empty({count}, DType::I64);
    float* pixels = images.data<float>();
    std::int64_t* label = labels.data<std::int64_t>();
    // Counter (sample, element / 4, stream), key the seed: four words per call.
    const PhiloxKey key = {std::uint32_t(seed_), std::uint32_t(seed_ >> 32)};
    // Every group of four pixels is a function of its own counter: the threads split them without
    // changing a bit (a 128 x 3 x 224 x 224 batch took 39 ms on one core, inside the timed step).
    const std::int64_t groups_per_sample = (per_sample + 3) / 4;
#pragma omp parallel for schedule(static)
    for (std::int64_t group = 0; group < count * groups_per_sample; ++group) {
      const std::int64_t i = group / groups_per_sample, e = 4 * (group % groups_per_sample);
      const std::uint64_t sample = static_cast<std::uint64_t>(first + i);
      const PhiloxCounter words = philox4x32(
          {std::uint32_t(sample), std::uint32_t(sample >> 32), std::uint32_t(e >> 2), std::uint32_t(stream_)}, key);
      for (std::int64_t k = 0; k < 4 && e + k < per_sample; ++k)
        pixels[i * per_sample + e + k] = 2.0f * uniform_from_word(words[static_cast<std::size_t>(k)]) - 1.0f;
    }
    for (std::int64_t i = 0; i < count; ++i) {
      const std::uint64_t sample = static_cast<std::uint64_t>(first + i);
      const PhiloxCounter words = philox4x32(
          {std::uint32_t(sample), std::uint32_t(sample >> 32), 0xFFFFFFFFu, std::uint32_t(stream_)}, key);
      label[i] = static_cast<std::int64_t>(words[0] % static_cast<std::uint32_t>(classes_));
    }
    return {{"images", images}, {"labels", labels}};
  }
  std::int64_t samples_per_epoch() const override { return 1281167; }
  std::int64_t tokens_per_sample() const override { return 0; }
  const std::string& path() const override { return path_; }

 private:
  std::uint64_t seed_, stream_;
  std::int64_t channels_, size_, classes_;
  std::string path_ = "synthetic";
};

}  // namespace

std::unique_ptr<BatchSource> make_batch_source(const ExperimentConfig& config, bool heldout,
                                               const std::string& default_directory) {
  if (config.data.synthetic) {
    PARTRAIN_CHECK(config.model.type == "resnet", config.path << ": [data] synthetic makes images, for resnet only");
    return std::make_unique<SyntheticImageSource>(config, heldout ? 1 : 0);  // held out: other samples
  }
  const bool images = config.model.type == "resnet";
  const bool classification = config.model.type == "bert" && config.model.task == "classification";
  const std::string path = !config.data.path.empty() ? config.data.path
                           : default_directory + (images ? "/fashion_mnist.h5" : classification ? "/pos.h5" : "/text.h5");
  PARTRAIN_CHECK(std::filesystem::exists(path),
                 path << ": the training data is missing; run data/prepare.sh to create it (or set [data] path)");
  if (classification) return std::make_unique<ClassificationSource>(path, heldout, config);
  if (config.model.type == "bert") return std::make_unique<BertSource>(path, heldout, config);
  if (config.model.type == "gpt") return std::make_unique<GptSource>(path, heldout, config);
  return std::make_unique<ImageSource>(path, heldout, config);
}

}  // namespace partrain::io
