#include "io/text_dataset.h"

#include <algorithm>
#include <random>

#include "core/error.h"
#include "core/rng.h"
#include "io/hdf5_file.h"

namespace partrain::io {
namespace {

constexpr std::int64_t kIgnoreLabel = -100;
// Philox streams of one sample's random draws.
constexpr std::uint32_t kStreamNextSentence = 1, kStreamRandomDocument = 2, kStreamRandomSentence = 3,
                        kStreamMaskSelect = 4, kStreamMaskKind = 5, kStreamRandomToken = 6;

std::uint32_t sample_word(std::uint64_t seed, std::int64_t epoch, std::int64_t sample, std::uint32_t stream,
                          std::uint64_t index) {
  const PhiloxKey key = {std::uint32_t(seed), std::uint32_t(seed >> 32)};
  const PhiloxCounter words = philox4x32(
      {std::uint32_t(epoch), std::uint32_t(sample), (std::uint32_t(std::uint64_t(sample) >> 32) << 8) ^ stream,
       std::uint32_t(index >> 2)},
      key);
  return words[index & 3];
}

/// Uniform integer in [0, bound) from two random words (bias below 2^-32 for any int64 bound).
std::int64_t sample_integer(std::uint64_t seed, std::int64_t epoch, std::int64_t sample, std::uint32_t stream,
                            std::uint64_t index, std::int64_t bound) {
  const std::uint64_t word = (std::uint64_t(sample_word(seed, epoch, sample, stream, 2 * index)) << 32) |
                             sample_word(seed, epoch, sample, stream, 2 * index + 1);
  return static_cast<std::int64_t>(word % std::uint64_t(bound));
}

}  // namespace

std::vector<std::int64_t> shuffled_order(std::int64_t count, std::uint64_t seed, std::int64_t epoch) {
  PARTRAIN_CHECK(count >= 0, "shuffled_order: negative count " << count);
  std::vector<std::int64_t> order(static_cast<std::size_t>(count));
  for (std::int64_t index = 0; index < count; ++index) order[index] = index;
  std::seed_seq sequence{std::uint32_t(seed), std::uint32_t(seed >> 32), std::uint32_t(epoch),
                         std::uint32_t(std::uint64_t(epoch) >> 32), 0x70617274u};
  std::mt19937_64 engine(sequence);
  for (std::int64_t index = count - 1; index > 0; --index) {
    const std::uint64_t other = engine() % std::uint64_t(index + 1);
    std::swap(order[index], order[other]);
  }
  return order;
}

float sample_uniform(std::uint64_t seed, std::int64_t epoch, std::int64_t sample, std::uint32_t stream,
                     std::uint64_t index) {
  return uniform_from_word(sample_word(seed, epoch, sample, stream, index));
}

void require_integer_vectors(const Hdf5File& file, const std::string& path, std::initializer_list<const char*> datasets,
                             const char* what) {
  for (const char* dataset : datasets) {
    PARTRAIN_CHECK(file.has_dataset(dataset), "'" << path << "': no dataset /" << dataset << " (not " << what << "?)");
    PARTRAIN_CHECK(file.dataset_is_integer(dataset), "'" << path << "': dataset /" << dataset << " stores "
                                                         << file.dataset_type_name(dataset) << ", expected integers");
    PARTRAIN_CHECK(file.dataset_shape(dataset).size() == 1,
                   "'" << path << "': dataset /" << dataset << " has rank " << file.dataset_shape(dataset).size()
                       << ", expected 1");
  }
}

PreparedVocabulary read_prepared_vocabulary(const Hdf5File& file, const std::string& path) {
  PreparedVocabulary vocabulary;
  vocabulary.vocab_size = static_cast<std::int32_t>(file.read_int_attribute("/", "vocab_size"));
  SpecialTokens& special = vocabulary.special;
  std::int32_t* ids[] = {&special.pad, &special.unk, &special.bos, &special.eos, &special.cls, &special.sep, &special.mask};
  const char* keys[] = {"pad_id", "unk_id", "bos_id", "eos_id", "cls_id", "sep_id", "mask_id"};
  for (int i = 0; i < 7; ++i) {
    *ids[i] = static_cast<std::int32_t>(file.read_int_attribute("/", keys[i]));
    // -1: the tokenizer has no such token (the samplers refuse data without the tokens they need).
    PARTRAIN_CHECK(*ids[i] >= -1 && *ids[i] < vocabulary.vocab_size,
                   "'" << path << "': " << keys[i] << ": a special token id (" << *ids[i]
                       << ") is outside the vocabulary [0, " << vocabulary.vocab_size << ")");
  }
  const auto text_attribute = [&](const char* name) {
    return file.has_attribute("/", name) ? file.read_string_attribute("/", name) : std::string();
  };
  vocabulary.tokenizer_description = text_attribute("tokenizer_type").empty() && text_attribute("tokenizer_source").empty()
                                         ? "tokenizer not recorded"
                                         : text_attribute("tokenizer_type") + " tokenizer " + text_attribute("tokenizer_source");
  return vocabulary;
}

TextDataset::TextDataset(const std::string& path, TextSplit split) : path_(path) {
  const Hdf5File file = Hdf5File::open_read(path);
  const char* split_name = split == TextSplit::Train ? "split/train" : "split/heldout";
  // Integer one-dimensional datasets only: HDF5 would truncate floats to integers silently.
  require_integer_vectors(file, path, {"tokens", "sentence_offsets", "document_offsets", split_name},
                          "a data/prepare.sh text file");
  tokens_ = file.read<std::int32_t>("tokens");
  sentence_offsets_ = file.read<std::int64_t>("sentence_offsets");
  document_offsets_ = file.read<std::int64_t>("document_offsets");
  documents_ = file.read<std::int64_t>(split_name);
  PreparedVocabulary vocabulary = read_prepared_vocabulary(file, path);
  vocab_size_ = vocabulary.vocab_size;
  special_ = vocabulary.special;
  tokenizer_description_ = std::move(vocabulary.tokenizer_description);

  const std::int64_t token_total = static_cast<std::int64_t>(tokens_.size());
  PARTRAIN_CHECK(sentence_offsets_.size() >= 2 && sentence_offsets_.front() == 0 &&
                     sentence_offsets_.back() == token_total,
                 "'" << path << "': /sentence_offsets must run from 0 to the token count " << token_total);
  PARTRAIN_CHECK(document_offsets_.size() >= 2 && document_offsets_.front() == 0 &&
                     document_offsets_.back() == token_total,
                 "'" << path << "': /document_offsets must run from 0 to the token count " << token_total);
  for (const auto& [name, offsets] : {std::pair{"sentence_offsets", &sentence_offsets_}, std::pair{"document_offsets", &document_offsets_}}) {
    const auto descent = std::is_sorted_until(offsets->begin(), offsets->end());
    PARTRAIN_CHECK(descent == offsets->end(), "'" << path << "': dataset /" << name << " must be non-decreasing, but entry "
                                                  << descent - offsets->begin() << " (" << *descent << ") is below the one before");
  }
  PARTRAIN_CHECK(!documents_.empty(), "'" << path << "': /" << split_name << " holds no document");
  for (std::int32_t token : tokens_) {
    PARTRAIN_CHECK(token >= 0 && token < vocab_size_,
                   "'" << path << "': /tokens holds id " << token << " outside vocabulary " << vocab_size_);
  }


  const std::int64_t document_count = static_cast<std::int64_t>(document_offsets_.size()) - 1;
  const std::int64_t sentence_count = static_cast<std::int64_t>(sentence_offsets_.size()) - 1;
  document_first_sentence_.resize(document_count + 1);
  for (std::int64_t document = 0; document <= document_count; ++document) {
    const auto found = std::lower_bound(sentence_offsets_.begin(), sentence_offsets_.end(),
                                        document_offsets_[document]);
    PARTRAIN_CHECK(found != sentence_offsets_.end() && *found == document_offsets_[document],
                   "'" << path << "': document " << document << " does not start at a sentence boundary");
    // (With empty sentences at a boundary this may pick an empty one of the previous document: harmless.)
    document_first_sentence_[document] = found - sentence_offsets_.begin();
  }
  document_first_sentence_[document_count] = sentence_count;
  sentence_document_.assign(sentence_count, 0);
  for (std::int64_t document = 0; document < document_count; ++document) {
    for (std::int64_t sentence = document_first_sentence_[document];
         sentence < document_first_sentence_[document + 1]; ++sentence) {
      sentence_document_[sentence] = document;
    }
  }
  for (std::int64_t document : documents_) {
    PARTRAIN_CHECK(document >= 0 && document < document_count,
                   "'" << path << "': /" << split_name << " names document " << document << " of "
                       << document_count);
    const std::int64_t first = document_first_sentence_[document], last = document_first_sentence_[document + 1];
    for (std::int64_t sentence = first; sentence < last; ++sentence) {
      if (sentence_offsets_[sentence + 1] == sentence_offsets_[sentence]) continue;  // empty sentence
      anchors_all_.push_back(sentence);
      if (sentence + 1 < last) anchors_with_next_.push_back(sentence);
    }
    stream_.insert(stream_.end(), tokens_.begin() + document_offsets_[document],
                   tokens_.begin() + document_offsets_[document + 1]);
    stream_.push_back(special_.eos);
  }
}

std::int64_t TextDataset::token_count() const { return static_cast<std::int64_t>(stream_.size() - documents_.size()); }

std::vector<std::int32_t> TextDataset::document_tokens(std::int64_t document) const {
  PARTRAIN_CHECK(document >= 0 && document + 1 < static_cast<std::int64_t>(document_offsets_.size()),
                 "'" << path_ << "': no document " << document);
  return std::vector<std::int32_t>(tokens_.begin() + document_offsets_[document],
                                   tokens_.begin() + document_offsets_[document + 1]);
}

const std::vector<std::int64_t>& TextDataset::anchors(bool next_sentence_prediction) const {
  return next_sentence_prediction ? anchors_with_next_ : anchors_all_;
}

std::int64_t TextDataset::bert_sample_count(const BertSampleOptions& options) const {
  return static_cast<std::int64_t>(anchors(options.next_sentence_prediction).size());
}

const std::vector<std::int64_t>& TextDataset::cached_order(std::int64_t count, std::uint64_t seed,
                                                           std::int64_t epoch) const {
  if (count != order_count_ || seed != order_seed_ || epoch != order_epoch_) {
    order_ = shuffled_order(count, seed, epoch);
    order_count_ = count;
    order_seed_ = seed;
    order_epoch_ = epoch;
  }
  return order_;
}

void TextDataset::bert_sample(const BertSampleOptions& options, std::uint64_t seed, std::int64_t epoch,
                              std::int64_t sample, std::int64_t* input_ids, std::int64_t* token_type_ids,
                              std::int64_t* attention_mask, std::int64_t* mlm_labels, std::int64_t* nsp_label) const {
  const std::int64_t length = options.sequence_length;
  const std::vector<std::int64_t>& anchor_list = anchors(options.next_sentence_prediction);
  PARTRAIN_CHECK(sample >= 0 && sample < static_cast<std::int64_t>(anchor_list.size()),
                 "'" << path_ << "': BERT sample " << sample << " outside [0, " << anchor_list.size() << ")");
  const std::int64_t anchor = anchor_list[sample];
  const std::int64_t document = sentence_document_[anchor];
  const std::int64_t document_end = document_offsets_[document + 1];
  std::vector<std::int32_t> first, second;
  std::int64_t segment_label = kIgnoreLabel;

  if (!options.next_sentence_prediction) {
    PARTRAIN_CHECK(length >= 3, "BERT sequence length " << length << " is below 3");
    const std::int64_t begin = sentence_offsets_[anchor];
    const std::int64_t end = std::min(document_end, begin + length - 2);
    first.assign(tokens_.begin() + begin, tokens_.begin() + end);
  } else {
    PARTRAIN_CHECK(length >= 5, "BERT sequence length " << length << " is below 5 with NSP");
    const std::int64_t budget = length - 3;
    const std::int64_t last_sentence = document_first_sentence_[document + 1];  // exclusive
    // A: the anchor sentence, extended by following sentences up to half the budget while at least
    // one sentence of the document remains for B.
    std::int64_t a_end = anchor + 1;
    while (a_end + 1 < last_sentence &&
           sentence_offsets_[a_end + 1] - sentence_offsets_[anchor] <= budget / 2) {
      ++a_end;
    }
    first.assign(tokens_.begin() + sentence_offsets_[anchor], tokens_.begin() + sentence_offsets_[a_end]);
    const bool is_next = sample_uniform(seed, epoch, sample, kStreamNextSentence, 0) < 0.5f;
    std::int64_t b_sentence, b_last;
    if (is_next) {
      b_sentence = a_end;
      b_last = last_sentence;
      segment_label = 0;
    } else {
      const std::int64_t split_documents = static_cast<std::int64_t>(documents_.size());
      std::int64_t pick = sample_integer(seed, epoch, sample, kStreamRandomDocument, 0, split_documents);
      if (documents_[pick] == document && split_documents > 1) pick = (pick + 1) % split_documents;
      const std::int64_t other = documents_[pick];
      const std::int64_t other_first = document_first_sentence_[other];
      b_last = document_first_sentence_[other + 1];
      b_sentence = other_first + sample_integer(seed, epoch, sample, kStreamRandomSentence, 0,
                                                std::max<std::int64_t>(1, b_last - other_first));
      segment_label = 1;
    }
    const std::int64_t b_begin = sentence_offsets_[b_sentence];
    std::int64_t b_end = sentence_offsets_[std::min(b_sentence + 1, b_last)];
    // Extend B by whole sentences while the pair fits.
    for (std::int64_t next = b_sentence + 1; next < b_last; ++next) {
      if (static_cast<std::int64_t>(first.size()) + sentence_offsets_[next + 1] - b_begin > budget) break;
      b_end = sentence_offsets_[next + 1];
    }
    second.assign(tokens_.begin() + b_begin, tokens_.begin() + b_end);
    // Longest-first truncation from the end until the pair fits.
    while (static_cast<std::int64_t>(first.size() + second.size()) > budget) {
      if (first.size() > second.size()) {
        first.pop_back();
      } else {
        second.pop_back();
      }
    }
  }

  // Lay out [CLS] A [SEP] (B [SEP]) and padding.
  std::int64_t position = 0;
  const auto put = [&](std::int64_t id, std::int64_t type) {
    input_ids[position] = id;
    token_type_ids[position] = type;
    attention_mask[position] = 1;
    ++position;
  };
  put(special_.cls, 0);
  for (std::int32_t id : first) put(id, 0);
  put(special_.sep, 0);
  if (options.next_sentence_prediction) {
    for (std::int32_t id : second) put(id, 1);
    put(special_.sep, 1);
  }
  for (; position < length; ++position) {
    input_ids[position] = special_.pad;
    token_type_ids[position] = 0;
    attention_mask[position] = 0;
  }
  *nsp_label = segment_label;

  // MLM: select mask_probability of the non-special tokens; 80% [MASK], 10% random, 10% unchanged.
  for (std::int64_t index = 0; index < length; ++index) {
    mlm_labels[index] = kIgnoreLabel;
    const std::int64_t original = input_ids[index];
    if (attention_mask[index] == 0 || special_.is_special(static_cast<std::int32_t>(original))) continue;
    if (sample_uniform(seed, epoch, sample, kStreamMaskSelect, index) >= options.mask_probability) continue;
    mlm_labels[index] = original;
    const float kind = sample_uniform(seed, epoch, sample, kStreamMaskKind, index);
    if (kind < 0.8f) {
      input_ids[index] = special_.mask;
    } else if (kind < 0.9f) {
      std::int64_t replacement = special_.mask;
      for (std::uint64_t attempt = 0; special_.is_special(static_cast<std::int32_t>(replacement)); ++attempt) {
        replacement = sample_integer(seed, epoch, sample, kStreamRandomToken, index * 64 + attempt, vocab_size_);
      }
      input_ids[index] = replacement;
    }
  }
}

BertBatch TextDataset::bert_samples(const BertSampleOptions& options, std::uint64_t seed, std::int64_t epoch,
                                    const std::vector<std::int64_t>& sample_indices) const {
  const std::int64_t batch = static_cast<std::int64_t>(sample_indices.size());
  const std::int64_t length = options.sequence_length;
  BertBatch result;
  result.input_ids = Tensor::empty({batch, length}, DType::I64);
  result.token_type_ids = Tensor::empty({batch, length}, DType::I64);
  result.attention_mask = Tensor::empty({batch, length}, DType::I64);
  result.mlm_labels = Tensor::empty({batch, length}, DType::I64);
  result.nsp_labels = Tensor::empty({batch}, DType::I64);
  for (std::int64_t row = 0; row < batch; ++row) {
    const std::int64_t offset = row * length;
    bert_sample(options, seed, epoch, sample_indices[row], result.input_ids.data<std::int64_t>() + offset,
                result.token_type_ids.data<std::int64_t>() + offset,
                result.attention_mask.data<std::int64_t>() + offset, result.mlm_labels.data<std::int64_t>() + offset,
                result.nsp_labels.data<std::int64_t>() + row);
  }
  return result;
}

BertBatch TextDataset::bert_batch(const BertSampleOptions& options, std::uint64_t seed, std::int64_t epoch,
                                  const std::vector<std::int64_t>& positions) const {
  const std::int64_t count = bert_sample_count(options);
  const std::vector<std::int64_t>& order = cached_order(count, seed, epoch);
  std::vector<std::int64_t> samples;
  samples.reserve(positions.size());
  for (std::int64_t position : positions) {
    PARTRAIN_CHECK(position >= 0 && position < count,
                   "'" << path_ << "': BERT position " << position << " outside the epoch of " << count);
    samples.push_back(order[position]);
  }
  return bert_samples(options, seed, epoch, samples);
}

std::int64_t TextDataset::gpt_sample_count(std::int64_t sequence_length) const {
  PARTRAIN_CHECK(sequence_length >= 1, "GPT sequence length " << sequence_length << " is below 1");
  PARTRAIN_CHECK(special_.eos >= 0, "'" << path_ << "': no eos_id (" << tokenizer_description_
                                        << "), which GPT samples put between documents");
  return (static_cast<std::int64_t>(stream_.size()) - 1) / sequence_length;
}

GptBatch TextDataset::gpt_samples(std::int64_t sequence_length,
                                  const std::vector<std::int64_t>& sample_indices) const {
  const std::int64_t count = gpt_sample_count(sequence_length);
  const std::int64_t batch = static_cast<std::int64_t>(sample_indices.size());
  GptBatch result;
  result.input_ids = Tensor::empty({batch, sequence_length}, DType::I64);
  result.targets = Tensor::empty({batch, sequence_length}, DType::I64);
  std::int64_t* inputs = result.input_ids.data<std::int64_t>();
  std::int64_t* targets = result.targets.data<std::int64_t>();
  for (std::int64_t row = 0; row < batch; ++row) {
    const std::int64_t sample = sample_indices[row];
    PARTRAIN_CHECK(sample >= 0 && sample < count,
                   "'" << path_ << "': GPT sample " << sample << " outside [0, " << count << ")");
    const std::int64_t begin = sample * sequence_length;
    for (std::int64_t index = 0; index < sequence_length; ++index) {
      inputs[row * sequence_length + index] = stream_[begin + index];
      targets[row * sequence_length + index] = stream_[begin + index + 1];
    }
  }
  return result;
}

GptBatch TextDataset::gpt_batch(std::int64_t sequence_length, std::uint64_t seed, std::int64_t epoch,
                                const std::vector<std::int64_t>& positions) const {
  const std::int64_t count = gpt_sample_count(sequence_length);
  const std::vector<std::int64_t>& order = cached_order(count, seed, epoch);
  std::vector<std::int64_t> samples;
  samples.reserve(positions.size());
  for (std::int64_t position : positions) {
    PARTRAIN_CHECK(position >= 0 && position < count,
                   "'" << path_ << "': GPT position " << position << " outside the epoch of " << count);
    samples.push_back(order[position]);
  }
  return gpt_samples(sequence_length, samples);
}

void write_text_dataset(const std::string& path, const std::vector<std::vector<std::vector<std::int32_t>>>& documents,
                        const std::vector<std::int64_t>& heldout, const SpecialTokens& special,
                        std::int32_t vocab_size) {
  std::vector<std::int32_t> tokens;
  std::vector<std::int64_t> sentence_offsets{0}, document_offsets{0};
  for (const auto& document : documents) {
    for (const auto& sentence : document) {
      tokens.insert(tokens.end(), sentence.begin(), sentence.end());
      sentence_offsets.push_back(static_cast<std::int64_t>(tokens.size()));
    }
    document_offsets.push_back(static_cast<std::int64_t>(tokens.size()));
  }
  std::vector<std::int64_t> heldout_sorted = heldout, train;
  std::sort(heldout_sorted.begin(), heldout_sorted.end());
  for (std::int64_t document = 0; document < static_cast<std::int64_t>(documents.size()); ++document) {
    if (!std::binary_search(heldout_sorted.begin(), heldout_sorted.end(), document)) train.push_back(document);
  }
  Hdf5File file = Hdf5File::create(path);
  file.write<std::int32_t>("tokens", {static_cast<std::int64_t>(tokens.size())}, tokens);
  file.write<std::int64_t>("sentence_offsets", {static_cast<std::int64_t>(sentence_offsets.size())}, sentence_offsets);
  file.write<std::int64_t>("document_offsets", {static_cast<std::int64_t>(document_offsets.size())}, document_offsets);
  file.write<std::int64_t>("split/train", {static_cast<std::int64_t>(train.size())}, train);
  file.write<std::int64_t>("split/heldout", {static_cast<std::int64_t>(heldout_sorted.size())}, heldout_sorted);
  file.write_string_attribute("/", "format", "partrain-text-1");
  file.write_int_attribute("/", "vocab_size", vocab_size);
  file.write_int_attribute("/", "pad_id", special.pad);
  file.write_int_attribute("/", "unk_id", special.unk);
  file.write_int_attribute("/", "bos_id", special.bos);
  file.write_int_attribute("/", "eos_id", special.eos);
  file.write_int_attribute("/", "cls_id", special.cls);
  file.write_int_attribute("/", "sep_id", special.sep);
  file.write_int_attribute("/", "mask_id", special.mask);
}

}  // namespace partrain::io
