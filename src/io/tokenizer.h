#pragma once
// SentencePiece tokeniser wrapper: loads a .model (written by data/prepare.sh or train_tokenizer),
// encodes text to int32 ids and decodes ids to text, and exposes the special token ids.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace partrain::io {

/// Ids of the special tokens. The data pipeline's models use pad 0, unk 1, bos 2, eos 3,
/// [CLS] 4, [SEP] 5, [MASK] 6; -1 means the model does not define the token.
struct SpecialTokens {
  std::int32_t pad = -1, unk = -1, bos = -1, eos = -1, cls = -1, sep = -1, mask = -1;
  /// True for every id above except unk (unk is ordinary text that MLM may mask).
  bool is_special(std::int32_t id) const {
    return id == pad || id == bos || id == eos || id == cls || id == sep || id == mask;
  }
};

class Tokenizer {
 public:
  /// Loads a SentencePiece model file; throws partrain::Error naming the file if it cannot be read.
  explicit Tokenizer(const std::string& model_path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  /// Token ids of `text` (no bos/eos added).
  std::vector<std::int32_t> encode(const std::string& text) const;
  /// Text of `ids`; special tokens (pad, bos, eos) are dropped. Throws on ids outside the vocabulary.
  std::string decode(const std::vector<std::int32_t>& ids) const;
  /// Number of pieces (ids are 0 .. vocab_size()-1).
  std::int32_t vocab_size() const;
  /// Id of a piece ("[MASK]"), or unk if it is not in the vocabulary.
  std::int32_t piece_to_id(const std::string& piece) const;
  std::string id_to_piece(std::int32_t id) const;
  const SpecialTokens& special_tokens() const { return special_; }

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
  std::string path_;
  SpecialTokens special_;
};

/// Trains a unigram SentencePiece model on `corpus_path` (one sentence per line) and writes
/// `model_prefix`.model and .vocab, with the same flags data/prepare_text.py passes to spm_train
/// (pad 0, unk 1, bos 2, eos 3, user symbols [CLS] [SEP] [MASK]). Throws partrain::Error on failure.
void train_tokenizer(const std::string& corpus_path, const std::string& model_prefix, int vocab_size,
                     int threads = 1);

}  // namespace partrain::io
