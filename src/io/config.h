#pragma once
// Experiment files (TOML, read with toml++). A file is loaded into a ConfigDocument, `--set
// section.key=value` overrides are applied on top, and each section is then read into a typed
// struct through a SectionReader, which rejects unknown keys and wrong types with a partrain::Error
// naming the file, line and key ("configs/x.toml:7: [model] key 'hiden' is unknown").
//
// Adding a section (e.g. [train]): declare a struct with its defaults, write a read_train_config()
// that calls SectionReader::read() for each key and then finish(), and add the struct to
// ExperimentConfig (load_experiment reads it). Sections listed in known_config_sections() but not
// read yet are accepted and ignored.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace partrain {

/// An experiment file parsed into memory with its `--set` overrides applied. Copies share the data.
class ConfigDocument {
 public:
  /// Reads and parses a TOML file, then applies the overrides in order. Throws partrain::Error on
  /// an unreadable file ("path: cannot read"), a TOML syntax error ("path:line:column: ...") or a
  /// malformed override.
  static ConfigDocument load(const std::string& path, std::span<const std::string> overrides = {});
  /// Parses TOML text; `source_name` stands for the file name in error messages.
  static ConfigDocument parse(std::string_view text, const std::string& source_name,
                              std::span<const std::string> overrides = {});

  /// Applies one override "section.key=value" (further dots name nested tables). The value is
  /// parsed as a TOML value (number, bool, quoted string, array, ...); text that is not valid TOML
  /// is taken as a bare string (`--set model.type=gpt`). Throws partrain::Error when the text has
  /// no '=' or no section, or when a path component is not a table.
  void apply_override(const std::string& override_text);

  /// The file name given to load()/parse().
  const std::string& source_name() const;
  /// Top-level section names present in the document, in file order.
  std::vector<std::string> section_names() const;
  /// Throws partrain::Error naming the file and line of the first top-level entry that is not a
  /// table or whose name is not in `known_sections`.
  void check_sections(std::span<const std::string_view> known_sections) const;

  struct Data;  // the toml++ table (kept out of this header to keep compile times low)
  const Data& data() const { return *data_; }

 private:
  std::shared_ptr<Data> data_;
};

/// Reads the typed keys of one [section]. Each read() leaves the value untouched when the key is
/// absent (so the caller's default stays), and throws partrain::Error naming file, line, section
/// and key when the value has the wrong type. finish() rejects keys that no read() asked for.
class SectionReader {
 public:
  SectionReader(const ConfigDocument& document, std::string section);

  /// True when the section exists in the document.
  bool present() const;
  /// True when the key exists in the section.
  bool has(std::string_view key) const;
  void read(std::string_view key, std::int64_t& value);
  /// Accepts an integer or a floating-point TOML value.
  void read(std::string_view key, double& value);
  void read(std::string_view key, bool& value);
  void read(std::string_view key, std::string& value);
  /// Reads a string that must be one of `choices`.
  void read_choice(std::string_view key, std::string& value, std::initializer_list<std::string_view> choices);
  /// Throws partrain::Error "file:line: [section] key 'key' <message>" (the section's line when
  /// the key is absent).
  [[noreturn]] void fail(std::string_view key, const std::string& message) const;
  /// Throws partrain::Error for the first key of the section that no read() asked for.
  void finish() const;

 private:
  const ConfigDocument& document_;
  std::string section_;
  std::vector<std::string> read_keys_;
};

/// The [model] section: what to build (models/model.h). Keys that do not apply to `type` keep
/// their defaults and are ignored by the builder.
struct ModelConfig {
  std::string type;                 // "bert", "gpt" or "resnet" (required)
  // ---- transformers (bert, gpt) ----
  std::int64_t layers = 12;         // encoder layers / decoder blocks
  std::int64_t hidden = 768;        // hidden size
  std::int64_t heads = 12;          // attention heads (divides hidden)
  std::int64_t intermediate = 0;    // MLP inner size; 0: 4 * hidden
  std::int64_t vocab = 30522;       // vocabulary size (bert default; gpt: 50257)
  std::int64_t max_position = 512;  // rows of the position embedding (gpt default: 1024)
  std::int64_t type_vocab = 2;      // bert token-type (segment) vocabulary
  std::int64_t seq_len = 128;       // sequence length of a sample (<= max_position; gpt default: 1024)
  double dropout = 0.1;             // hidden/embedding dropout probability
  double attention_dropout = -1;    // attention-probability dropout; < 0: same as dropout
  double layer_norm_eps = -1;       // < 0: 1e-12 for bert, 1e-5 for gpt
  double initializer_range = 0.02;  // std of the normal init of linear and embedding weights
  bool nsp = true;                  // bert: pooler + next-sentence-prediction head and loss
  bool fused_attention = false;     // one Attention task instead of MatMul/Scale/Softmax/Dropout/MatMul
                                    // (the fused op has no attention dropout)
  // ---- resnet ----
  std::int64_t depth = 50;          // 18, 34 (basic blocks), 50, 101, 152 (bottleneck blocks)
  std::int64_t width_factor = 1;    // BiT-style multiplier of every channel width (RaNNC's ResNet152x8: 8)
  std::int64_t base_width = 64;     // channels of the stem and of layer1 before the width factor
  std::int64_t classes = 1000;      // classifier outputs
  std::int64_t image_size = 224;    // input height = width
  std::int64_t channels = 3;        // input channels

  /// The MLP inner size (intermediate, or 4 * hidden when 0).
  std::int64_t intermediate_size() const { return intermediate > 0 ? intermediate : 4 * hidden; }
  /// The attention dropout probability (attention_dropout, or dropout when negative).
  double attention_dropout_probability() const { return attention_dropout >= 0 ? attention_dropout : dropout; }
  /// The LayerNorm epsilon (layer_norm_eps, or the type's default when negative).
  double layer_norm_epsilon() const { return layer_norm_eps >= 0 ? layer_norm_eps : (type == "gpt" ? 1e-5 : 1e-12); }
};

/// Reads and validates [model] (type defaults first, then the keys). Throws partrain::Error naming
/// file, line and key for a missing section or type, unknown keys, wrong types and invalid values
/// (heads not dividing hidden, seq_len > max_position, unsupported depth, probabilities outside [0, 1)).
ModelConfig read_model_config(const ConfigDocument& document);

/// Names of the top-level sections an experiment file may hold: model, train, parallel, data,
/// profile, log, checkpoint.
std::span<const std::string_view> known_config_sections();

/// Everything read from an experiment file. Sections that are not read yet are only checked to be
/// known section names.
struct ExperimentConfig {
  std::string path;
  ModelConfig model;
};

/// Loads an experiment file with overrides and reads every section. Throws partrain::Error.
ExperimentConfig load_experiment(const std::string& path, std::span<const std::string> overrides = {});

}  // namespace partrain
