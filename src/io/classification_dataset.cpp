#include "io/classification_dataset.h"

#include <algorithm>

#include "core/error.h"
#include "io/hdf5_file.h"
#include "io/text_dataset.h"

namespace partrain::io {

ClassificationDataset::ClassificationDataset(const std::string& path, bool heldout) : path_(path) {
  Hdf5File file = Hdf5File::open_read(path);
  const char* split_name = heldout ? "split/heldout" : "split/train";
  require_integer_vectors(file, path, {"tokens", "offsets", "labels", split_name},
                          "a data/prepare.sh classification file such as pos.h5");
  tokens_ = file.read<std::int32_t>("tokens");
  offsets_ = file.read<std::int64_t>("offsets");
  labels_ = file.read<std::int64_t>("labels");
  texts_ = file.read<std::int64_t>(split_name);
  classes_ = file.read_int_attribute("/", "classes");
  PreparedVocabulary vocabulary = read_prepared_vocabulary(file, path);
  vocab_size_ = vocabulary.vocab_size;
  special_ = vocabulary.special;
  tokenizer_description_ = std::move(vocabulary.tokenizer_description);

  const std::int64_t count = static_cast<std::int64_t>(labels_.size());
  PARTRAIN_CHECK(static_cast<std::int64_t>(offsets_.size()) == count + 1 && offsets_.front() == 0 &&
                     offsets_.back() == static_cast<std::int64_t>(tokens_.size()) &&
                     std::is_sorted(offsets_.begin(), offsets_.end()),
                 "'" << path << "': /offsets must be " << count + 1 << " non-decreasing offsets from 0 to the token count "
                     << tokens_.size());
  PARTRAIN_CHECK(classes_ >= 2, "'" << path << "': attribute classes is " << classes_ << ", expected at least 2");
  for (std::int64_t i = 0; i < count; ++i)
    PARTRAIN_CHECK(labels_[i] >= 0 && labels_[i] < classes_,
                   "'" << path << "': /labels holds " << labels_[i] << " at row " << i << ", outside [0, " << classes_ << ")");
  for (std::int32_t token : tokens_)
    PARTRAIN_CHECK(token >= 0 && token < vocab_size_,
                   "'" << path << "': /tokens holds id " << token << " outside vocabulary " << vocab_size_);
  PARTRAIN_CHECK(!texts_.empty(), "'" << path << "': /" << split_name << " holds no text");
  for (std::int64_t text : texts_)
    PARTRAIN_CHECK(text >= 0 && text < count, "'" << path << "': /" << split_name << " names text " << text << " of " << count);
  for (const auto& [id, name] : {std::pair{special_.cls, "[CLS]"}, std::pair{special_.sep, "[SEP]"}, std::pair{special_.pad, "[PAD]"}})
    PARTRAIN_CHECK(id >= 0, "'" << path << "' (" << tokenizer_description_ << "): the tokenizer has no " << name
                                << " token, which classification samples need ([CLS] text [SEP], padding)");
}

ClassificationBatch ClassificationDataset::batch(std::int64_t sequence_length, std::uint64_t seed, std::int64_t epoch,
                                                 const std::vector<std::int64_t>& positions) const {
  PARTRAIN_CHECK(sequence_length >= 3, "classification sequence length " << sequence_length << " is below 3");
  const std::vector<std::int64_t> order = shuffled_order(size(), seed, epoch);
  const std::int64_t rows = static_cast<std::int64_t>(positions.size());
  ClassificationBatch result;
  result.input_ids = Tensor::empty({rows, sequence_length}, DType::I64);
  result.token_type_ids = Tensor::zeros({rows, sequence_length}, DType::I64);
  result.attention_mask = Tensor::zeros({rows, sequence_length}, DType::I64);
  result.labels = Tensor::empty({rows}, DType::I64);
  for (std::int64_t row = 0; row < rows; ++row) {
    PARTRAIN_CHECK(positions[row] >= 0 && positions[row] < size(),
                   "'" << path_ << "': sample " << positions[row] << " outside [0, " << size() << ")");
    const std::int64_t text = texts_[order[positions[row]]];
    std::int64_t* ids = result.input_ids.data<std::int64_t>() + row * sequence_length;
    std::int64_t* mask = result.attention_mask.data<std::int64_t>() + row * sequence_length;
    const std::int64_t length = std::min(offsets_[text + 1] - offsets_[text], sequence_length - 2);
    std::int64_t position = 0;
    ids[position++] = special_.cls;
    for (std::int64_t i = 0; i < length; ++i) ids[position++] = tokens_[offsets_[text] + i];
    ids[position++] = special_.sep;
    std::fill(mask, mask + position, 1);
    std::fill(ids + position, ids + sequence_length, special_.pad);
    result.labels.data<std::int64_t>()[row] = labels_[text];
  }
  return result;
}

}  // namespace partrain::io
