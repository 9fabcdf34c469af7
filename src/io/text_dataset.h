#pragma once
// Token datasets in the text.h5 layout written by data/prepare_text.py (and write_text_dataset):
//   /tokens int32 [T], /sentence_offsets int64 [S+1], /document_offsets int64 [D+1] (token offsets;
//   document boundaries are sentence boundaries), /split/train and /split/heldout int64 (document
//   indices), attributes vocab_size, pad_id, unk_id, bos_id, eos_id, cls_id, sep_id, mask_id (-1:
//   the tokenizer has no such token) and, when written by data/prepare_text.py, tokenizer,
//   tokenizer_type, tokenizer_source (which tokenizer made the ids).
// Every sample is a deterministic function of (seed, epoch, sample index): any rank can produce any
// sample without coordination. The whole split is held in memory (a few MB for WordNet glosses).
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/tokenizer.h"

namespace partrain::io {

/// A random permutation of [0, count), a Fisher–Yates shuffle driven by mt19937_64 seeded from
/// (seed, epoch). The same arguments always give the same permutation.
std::vector<std::int64_t> shuffled_order(std::int64_t count, std::uint64_t seed, std::int64_t epoch);

/// Uniform [0, 1) that depends only on its arguments (Philox4x32-10 keyed by seed).
float sample_uniform(std::uint64_t seed, std::int64_t epoch, std::int64_t sample, std::uint32_t stream,
                     std::uint64_t index);

class Hdf5File;

/// Checks that each of `datasets` of `file` exists and is a one-dimensional integer dataset; throws
/// partrain::Error naming `path` and the dataset (`what`: the kind of file expected, for the message
/// about a missing one, e.g. "a data/prepare.sh text file").
void require_integer_vectors(const Hdf5File& file, const std::string& path, std::initializer_list<const char*> datasets,
                             const char* what);

/// What a prepared file records of its tokenizer: the vocabulary size, the special ids (-1 where the
/// tokenizer has no such token; others must lie in the vocabulary, else partrain::Error naming
/// `path`) and a readable description ("wordpiece tokenizer PATH", or "tokenizer not recorded").
struct PreparedVocabulary {
  std::int32_t vocab_size = 0;
  SpecialTokens special;
  std::string tokenizer_description;
};
PreparedVocabulary read_prepared_vocabulary(const Hdf5File& file, const std::string& path);

/// Which documents a dataset reads.
enum class TextSplit { Train, HeldOut };

/// How BERT samples are cut and masked.
struct BertSampleOptions {
  std::int64_t sequence_length = 128;    ///< tokens per sample, [CLS] and [SEP]s included
  bool next_sentence_prediction = true;  ///< [CLS] A [SEP] B [SEP] with 50% random B; else [CLS] A [SEP]
  double mask_probability = 0.15;        ///< share of non-special tokens selected for MLM
};

/// A batch of BERT pre-training samples; every tensor is int64 on the host.
struct BertBatch {
  Tensor input_ids;       ///< [B, S] token ids after masking, padded with pad id
  Tensor token_type_ids;  ///< [B, S] 0 for [CLS] A [SEP] (and padding), 1 for B [SEP]
  Tensor attention_mask;  ///< [B, S] 1 for real tokens, 0 for padding
  Tensor mlm_labels;      ///< [B, S] the original id where a token was selected for MLM, -100 elsewhere
  Tensor nsp_labels;      ///< [B] 0 when B follows A, 1 when B is random; -100 without NSP
};

/// A batch of GPT samples; int64 on the host.
struct GptBatch {
  Tensor input_ids;  ///< [B, S] window tokens 0 .. S-1
  Tensor targets;    ///< [B, S] window tokens 1 .. S (the next token of each input)
};

class TextDataset {
 public:
  /// Reads `split` of a text.h5 file. Throws partrain::Error naming the file and dataset when it is
  /// missing, malformed, or the split holds no document.
  TextDataset(const std::string& path, TextSplit split);

  std::int32_t vocab_size() const { return vocab_size_; }
  /// The special token ids; -1 where the tokenizer has none (GPT-2's byte-level BPE: no [CLS]).
  const SpecialTokens& special_tokens() const { return special_; }
  /// The tokenizer that made the ids, for messages ("WordPiece tokenizer /m/tokenizer.json"; files
  /// without the attributes: "tokenizer not recorded").
  const std::string& tokenizer_description() const { return tokenizer_description_; }
  /// Global indices (into /document_offsets) of this split's documents, ascending.
  const std::vector<std::int64_t>& document_indices() const { return documents_; }
  /// Token count of this split's documents.
  std::int64_t token_count() const;
  /// Token ids of global document `document` (any split).
  std::vector<std::int32_t> document_tokens(std::int64_t document) const;

  /// Number of BERT samples per epoch: with NSP the sentences that have a next sentence in their
  /// document, else every sentence of the split (each sample starts at one such sentence).
  std::int64_t bert_sample_count(const BertSampleOptions& options) const;
  /// BERT samples at `positions` (in [0, bert_sample_count)) of epoch `epoch`'s shuffled order.
  BertBatch bert_batch(const BertSampleOptions& options, std::uint64_t seed, std::int64_t epoch,
                       const std::vector<std::int64_t>& positions) const;
  /// BERT samples by sample index, without shuffling (randomness still keyed by seed and epoch).
  BertBatch bert_samples(const BertSampleOptions& options, std::uint64_t seed, std::int64_t epoch,
                         const std::vector<std::int64_t>& sample_indices) const;

  /// Number of GPT windows of `sequence_length` + 1 tokens (adjacent windows share one token) in the
  /// split's documents concatenated, each followed by eos.
  std::int64_t gpt_sample_count(std::int64_t sequence_length) const;
  /// GPT samples at `positions` of epoch `epoch`'s shuffled order.
  GptBatch gpt_batch(std::int64_t sequence_length, std::uint64_t seed, std::int64_t epoch,
                     const std::vector<std::int64_t>& positions) const;
  /// GPT samples by window index, without shuffling.
  GptBatch gpt_samples(std::int64_t sequence_length, const std::vector<std::int64_t>& sample_indices) const;

 private:
  void bert_sample(const BertSampleOptions& options, std::uint64_t seed, std::int64_t epoch, std::int64_t sample,
                   std::int64_t* input_ids, std::int64_t* token_type_ids, std::int64_t* attention_mask,
                   std::int64_t* mlm_labels, std::int64_t* nsp_label) const;
  const std::vector<std::int64_t>& anchors(bool next_sentence_prediction) const;
  const std::vector<std::int64_t>& cached_order(std::int64_t count, std::uint64_t seed, std::int64_t epoch) const;

  std::string path_;
  std::int32_t vocab_size_ = 0;
  SpecialTokens special_;
  std::string tokenizer_description_;
  std::vector<std::int32_t> tokens_;
  std::vector<std::int64_t> sentence_offsets_;
  std::vector<std::int64_t> document_offsets_;
  std::vector<std::int64_t> documents_;              // this split's global document indices
  std::vector<std::int64_t> sentence_document_;      // global sentence -> global document
  std::vector<std::int64_t> document_first_sentence_;  // global document -> first global sentence (D+1)
  std::vector<std::int64_t> anchors_with_next_;      // split sentences that have a next one
  std::vector<std::int64_t> anchors_all_;            // every split sentence
  std::vector<std::int32_t> stream_;                 // split documents + eos, for GPT
  // Cache of the last shuffled order (not thread-safe: use one dataset per thread).
  mutable std::vector<std::int64_t> order_;
  mutable std::int64_t order_count_ = -1;
  mutable std::uint64_t order_seed_ = 0;
  mutable std::int64_t order_epoch_ = -1;
};

/// Writes a text.h5 (the layout above) from documents given as lists of sentences of token ids;
/// `heldout` lists the held-out document indices, every other document is in /split/train. Used by
/// tests to build fixtures; data/prepare_text.py is the production writer.
void write_text_dataset(const std::string& path, const std::vector<std::vector<std::vector<std::int32_t>>>& documents,
                        const std::vector<std::int64_t>& heldout, const SpecialTokens& special,
                        std::int32_t vocab_size);

}  // namespace partrain::io
