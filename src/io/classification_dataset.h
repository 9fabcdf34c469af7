#pragma once
// Labelled texts in the layout data/prepare_pos.py writes (pos.h5: WordNet glosses labelled with
// their synset's part of speech), for BERT's sequence classification:
//   /tokens int32 [T], /offsets int64 [N+1] (text n = tokens[offsets[n]:offsets[n+1]], no special
//   tokens), /labels int64 [N] in [0, classes), /split/train and /split/heldout int64 (text indices),
//   attributes classes, class_names and the tokenizer's (vocab_size, pad_id ... mask_id, tokenizer_*:
//   the same as text.h5's, io/text_dataset.h).
// Sample i of epoch e is text order(e)[i] laid out as [CLS] tokens [SEP] padded (truncated to fit).
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/tokenizer.h"

namespace partrain::io {

/// A batch of sequence-classification samples; int64 on the host.
struct ClassificationBatch {
  Tensor input_ids;       ///< [B, S] [CLS] text [SEP], padded with the pad id
  Tensor token_type_ids;  ///< [B, S] zeros (one segment)
  Tensor attention_mask;  ///< [B, S] 1 for real tokens, 0 for padding
  Tensor labels;          ///< [B] the text's class
};

class ClassificationDataset {
 public:
  /// Reads `heldout` ? /split/heldout : /split/train of a pos.h5-layout file. Throws partrain::Error
  /// naming the file and dataset when one is missing or malformed, a label is outside [0, classes),
  /// the tokenizer has no [CLS], [SEP] or [PAD], or the split is empty.
  ClassificationDataset(const std::string& path, bool heldout);

  std::int32_t vocab_size() const { return vocab_size_; }
  const SpecialTokens& special_tokens() const { return special_; }
  const std::string& tokenizer_description() const { return tokenizer_description_; }
  std::int64_t classes() const { return classes_; }
  /// Texts in this split.
  std::int64_t size() const { return static_cast<std::int64_t>(texts_.size()); }
  /// Samples at `positions` of epoch `epoch`'s shuffled order (Fisher–Yates seeded by seed, epoch).
  ClassificationBatch batch(std::int64_t sequence_length, std::uint64_t seed, std::int64_t epoch,
                            const std::vector<std::int64_t>& positions) const;

 private:
  std::string path_;
  std::int32_t vocab_size_ = 0;
  SpecialTokens special_;
  std::string tokenizer_description_;
  std::int64_t classes_ = 0;
  std::vector<std::int32_t> tokens_;
  std::vector<std::int64_t> offsets_;
  std::vector<std::int64_t> labels_;
  std::vector<std::int64_t> texts_;  // this split's text indices
};

}  // namespace partrain::io
