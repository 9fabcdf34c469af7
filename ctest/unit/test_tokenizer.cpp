// Tokeniser: a tiny SentencePiece model trained in-process (the same flags as data/prepare_text.py),
// round-trips English sentences and exposes the special ids data/ relies on.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "core/error.h"
#include "io/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using partrain::io::Tokenizer;

/// A small English corpus: every subject with every verb phrase, plus a few glosses.
std::vector<std::string> corpus_sentences() {
  const std::vector<std::string> subjects = {"The cat", "A small dog", "My neighbour", "The old teacher",
                                             "Every student", "The quick brown fox", "A tired traveller",
                                             "The river"};
  const std::vector<std::string> phrases = {"sleeps on the warm floor.", "reads a long book in the evening.",
                                            "jumps over the lazy dog.", "walks to the market every morning.",
                                            "writes letters to distant friends.", "flows quietly under the bridge.",
                                            "likes fresh bread and cheese.", "watches the stars at night."};
  std::vector<std::string> sentences;
  for (const auto& subject : subjects)
    for (const auto& phrase : phrases) sentences.push_back(subject + " " + phrase);
  sentences.push_back("A domestic animal that is kept as a pet.");
  sentences.push_back("Having or showing a kind and gentle nature.");
  sentences.push_back("Move fast by using one's feet, with one foot off the ground at any given time.");
  return sentences;
}

class TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    directory_ = fs::temp_directory_path() / ("partrain-tokenizer-" + std::to_string(::getpid()));
    fs::create_directories(directory_);
    const fs::path corpus = directory_ / "corpus.txt";
    std::ofstream stream(corpus);
    for (const auto& sentence : corpus_sentences()) stream << sentence << "\n";
    stream.close();
    partrain::io::train_tokenizer(corpus.string(), (directory_ / "tiny").string(), 120);
  }
  static void TearDownTestSuite() { fs::remove_all(directory_); }
  static std::string model_path() { return (directory_ / "tiny.model").string(); }
  static fs::path directory_;
};
fs::path TokenizerTest::directory_;

TEST_F(TokenizerTest, RoundTripsSentences) {
  const Tokenizer tokenizer(model_path());
  std::vector<std::string> sentences = corpus_sentences();
  sentences.push_back("The dog reads the stars.");          // unseen combination of known words
  sentences.push_back("The quick students walk to the river.");
  for (const auto& sentence : sentences) {
    const std::vector<std::int32_t> ids = tokenizer.encode(sentence);
    ASSERT_FALSE(ids.empty()) << sentence;
    for (std::int32_t id : ids) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, tokenizer.vocab_size());
    }
    EXPECT_EQ(tokenizer.decode(ids), sentence);
  }
}

TEST_F(TokenizerTest, SpecialTokenIds) {
  const Tokenizer tokenizer(model_path());
  EXPECT_EQ(tokenizer.vocab_size(), 120);
  const auto& special = tokenizer.special_tokens();
  EXPECT_EQ(special.pad, 0);
  EXPECT_EQ(special.unk, 1);
  EXPECT_EQ(special.bos, 2);
  EXPECT_EQ(special.eos, 3);
  EXPECT_EQ(special.cls, 4);
  EXPECT_EQ(special.sep, 5);
  EXPECT_EQ(special.mask, 6);
  EXPECT_EQ(tokenizer.piece_to_id("[MASK]"), 6);
  EXPECT_EQ(tokenizer.id_to_piece(5), "[SEP]");
  // User-defined symbols are never split (a leading word-boundary piece may precede [CLS]).
  const std::vector<std::int32_t> ids = tokenizer.encode("[CLS] the cat [SEP]");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 4), 1);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 5), 1);
  EXPECT_EQ(ids.back(), 5);
  EXPECT_TRUE(special.is_special(special.mask));
  EXPECT_FALSE(special.is_special(special.unk));
  EXPECT_FALSE(special.is_special(tokenizer.encode("cat").back()));
}

TEST_F(TokenizerTest, ErrorsNameTheFile) {
  try {
    Tokenizer tokenizer("/nonexistent/missing.model");
    FAIL() << "expected partrain::Error";
  } catch (const partrain::Error& error) {
    EXPECT_NE(std::string(error.what()).find("/nonexistent/missing.model"), std::string::npos) << error.what();
  }
  const Tokenizer tokenizer(model_path());
  EXPECT_THROW(tokenizer.decode({tokenizer.vocab_size()}), partrain::Error);
  EXPECT_THROW(tokenizer.decode({-1}), partrain::Error);
}

}  // namespace
