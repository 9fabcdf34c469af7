#include "io/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include "core/error.h"

namespace partrain::io {

Tokenizer::Tokenizer(const std::string& model_path)
    : processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()), path_(model_path) {
  const auto status = processor_->Load(model_path);
  PARTRAIN_CHECK(status.ok(), "cannot load SentencePiece model '" << model_path << "': " << status.ToString());
  special_.pad = processor_->pad_id();
  special_.unk = processor_->unk_id();
  special_.bos = processor_->bos_id();
  special_.eos = processor_->eos_id();
  const auto user_symbol = [&](const char* piece) {
    const int id = processor_->PieceToId(piece);
    return processor_->IsUnknown(id) ? -1 : id;
  };
  special_.cls = user_symbol("[CLS]");
  special_.sep = user_symbol("[SEP]");
  special_.mask = user_symbol("[MASK]");
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<std::int32_t> Tokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  const auto status = processor_->Encode(text, &ids);
  PARTRAIN_CHECK(status.ok(), "tokeniser '" << path_ << "': cannot encode: " << status.ToString());
  return std::vector<std::int32_t>(ids.begin(), ids.end());
}

std::string Tokenizer::decode(const std::vector<std::int32_t>& ids) const {
  const int size = processor_->GetPieceSize();
  for (std::int32_t id : ids) {
    PARTRAIN_CHECK(id >= 0 && id < size, "tokeniser '" << path_ << "': id " << id << " outside vocabulary of "
                                                       << size);
  }
  std::string text;
  const auto status = processor_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  PARTRAIN_CHECK(status.ok(), "tokeniser '" << path_ << "': cannot decode: " << status.ToString());
  return text;
}

std::int32_t Tokenizer::vocab_size() const { return processor_->GetPieceSize(); }

std::int32_t Tokenizer::piece_to_id(const std::string& piece) const { return processor_->PieceToId(piece); }

std::string Tokenizer::id_to_piece(std::int32_t id) const {
  PARTRAIN_CHECK(id >= 0 && id < vocab_size(), "tokeniser '" << path_ << "': id " << id << " outside vocabulary");
  return processor_->IdToPiece(id);
}

void train_tokenizer(const std::string& corpus_path, const std::string& model_prefix, int vocab_size, int threads) {
  const std::string arguments = "--input=" + corpus_path + " --model_prefix=" + model_prefix +
                                " --vocab_size=" + std::to_string(vocab_size) +
                                " --model_type=unigram --character_coverage=1.0"
                                " --pad_id=0 --unk_id=1 --bos_id=2 --eos_id=3"
                                " --user_defined_symbols=[CLS],[SEP],[MASK] --minloglevel=2"
                                " --num_threads=" + std::to_string(threads);
  const auto status = sentencepiece::SentencePieceTrainer::Train(arguments);
  PARTRAIN_CHECK(status.ok(), "SentencePiece training on '" << corpus_path << "' failed: " << status.ToString());
}

}  // namespace partrain::io
