#include "io/config.h"
#include "io/device_presets.h"

#include <toml++/toml.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "core/units.h"

namespace partrain {

struct ConfigDocument::Data {
  std::string source_name;
  toml::table table;
};

namespace {

constexpr std::string_view kOverridePrefix = "--set ";

/// "file:line" for a node of the document, or the override text for a node that came from --set.
std::string location(const ConfigDocument& document, const toml::source_region& region) {
  if (region.path && region.path->starts_with(kOverridePrefix)) return *region.path;
  if (region.begin.line == 0) return document.source_name();
  return document.source_name() + ":" + std::to_string(region.begin.line);
}

std::vector<std::string> split_dots(std::string_view text) {
  std::vector<std::string> parts;
  std::size_t begin = 0;
  while (true) {
    const std::size_t dot = text.find('.', begin);
    parts.emplace_back(text.substr(begin, dot == std::string_view::npos ? std::string_view::npos : dot - begin));
    if (dot == std::string_view::npos) break;
    begin = dot + 1;
  }
  return parts;
}

std::string trim(std::string_view text) {
  const std::size_t first = text.find_first_not_of(" \t");
  if (first == std::string_view::npos) return {};
  const std::size_t last = text.find_last_not_of(" \t");
  return std::string(text.substr(first, last - first + 1));
}

const char* node_type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    default: return "a date/time";
  }
}

}  // namespace

ConfigDocument ConfigDocument::parse(std::string_view text, const std::string& source_name,
                                     std::span<const std::string> overrides) {
  ConfigDocument document;
  document.data_ = std::make_shared<Data>();
  document.data_->source_name = source_name;
  try {
    document.data_->table = toml::parse(text, source_name);
  } catch (const toml::parse_error& error) {
    PARTRAIN_FAIL(source_name << ":" << error.source().begin.line << ":" << error.source().begin.column << ": "
                              << error.description());
  }
  for (const std::string& override_text : overrides) document.apply_override(override_text);
  return document;
}

ConfigDocument ConfigDocument::load(const std::string& path, std::span<const std::string> overrides) {
  std::ifstream file(path, std::ios::binary);
  PARTRAIN_CHECK(file, path << ": cannot read the experiment file");
  std::ostringstream text;
  text << file.rdbuf();
  return parse(text.str(), path, overrides);
}

void ConfigDocument::apply_override(const std::string& override_text) {
  const std::size_t equals = override_text.find('=');
  PARTRAIN_CHECK(equals != std::string::npos,
                 "--set " << override_text << ": expected section.key=value");
  const std::string path = trim(std::string_view(override_text).substr(0, equals));
  const std::string value_text = trim(std::string_view(override_text).substr(equals + 1));
  const std::vector<std::string> parts = split_dots(path);
  PARTRAIN_CHECK(parts.size() >= 2 && std::none_of(parts.begin(), parts.end(), [](const std::string& part) { return part.empty(); }),
                 "--set " << override_text << ": expected section.key=value");

  // Parse the value as TOML; text that is not a TOML value is a bare string.
  const std::string source = std::string(kOverridePrefix) + override_text;
  toml::table parsed;
  try {
    parsed = toml::parse("value = " + value_text, source);
  } catch (const toml::parse_error&) {
    parsed = toml::table{};
    parsed.insert("value", value_text);
  }

  toml::table* table = &data_->table;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    toml::node* child = table->get(parts[i]);
    if (!child) child = &table->insert(parts[i], toml::table{}).first->second;
    PARTRAIN_CHECK(child->is_table(), "--set " << override_text << ": '" << parts[i] << "' is "
                                                << node_type_name(*child) << ", not a section");
    table = child->as_table();
  }
  toml::node& value = *parsed.get("value");
  value.visit([&](auto&& node) { table->insert_or_assign(parts.back(), std::move(node)); });
}

const std::string& ConfigDocument::source_name() const { return data_->source_name; }

std::vector<std::string> ConfigDocument::section_names() const {
  std::vector<std::string> names;
  for (auto&& [key, node] : data_->table)
    if (node.is_table()) names.emplace_back(key.str());
  return names;
}

void ConfigDocument::check_sections(std::span<const std::string_view> known_sections) const {
  for (auto&& [key, node] : data_->table) {
    PARTRAIN_CHECK(node.is_table(), location(*this, node.source())
                                        << ": top-level key '" << key.str()
                                        << "' must be inside a [section]");
    PARTRAIN_CHECK(std::find(known_sections.begin(), known_sections.end(), key.str()) != known_sections.end(),
                   location(*this, node.source()) << ": section [" << key.str() << "] is unknown");
  }
}

// ---------------- SectionReader ----------------

SectionReader::SectionReader(const ConfigDocument& document, std::string section)
    : document_(document), section_(std::move(section)) {}

namespace {
const toml::table* section_table(const ConfigDocument& document, const std::string& section) {
  const toml::node* node = document.data().table.get(section);
  return node ? node->as_table() : nullptr;
}
}  // namespace

bool SectionReader::present() const { return section_table(document_, section_) != nullptr; }

bool SectionReader::has(std::string_view key) const {
  const toml::table* table = section_table(document_, section_);
  return table && table->get(key) != nullptr;
}

void SectionReader::fail(std::string_view key, const std::string& message) const {
  const toml::table* table = section_table(document_, section_);
  const toml::node* node = table ? table->get(key) : nullptr;
  const std::string where = node ? location(document_, node->source())
                                 : table ? location(document_, table->source()) : document_.source_name();
  PARTRAIN_FAIL(where << ": [" << section_ << "] key '" << key << "' " << message);
}

namespace {
const toml::node* find_key(const ConfigDocument& document, const std::string& section, std::string_view key,
                           std::vector<std::string>& read_keys) {
  read_keys.emplace_back(key);
  const toml::table* table = section_table(document, section);
  return table ? table->get(key) : nullptr;
}
}  // namespace

void SectionReader::read(std::string_view key, std::int64_t& value) {
  const toml::node* node = find_key(document_, section_, key, read_keys_);
  if (!node) return;
  if (!node->is_integer()) fail(key, std::string("must be an integer, not ") + node_type_name(*node));
  value = node->as_integer()->get();
}

void SectionReader::read(std::string_view key, double& value) {
  const toml::node* node = find_key(document_, section_, key, read_keys_);
  if (!node) return;
  if (node->is_integer()) {
    value = static_cast<double>(node->as_integer()->get());
  } else if (node->is_floating_point()) {
    value = node->as_floating_point()->get();
  } else {
    fail(key, std::string("must be a number, not ") + node_type_name(*node));
  }
}

void SectionReader::read(std::string_view key, bool& value) {
  const toml::node* node = find_key(document_, section_, key, read_keys_);
  if (!node) return;
  if (!node->is_boolean()) fail(key, std::string("must be true or false, not ") + node_type_name(*node));
  value = node->as_boolean()->get();
}

void SectionReader::read(std::string_view key, std::string& value) {
  const toml::node* node = find_key(document_, section_, key, read_keys_);
  if (!node) return;
  if (!node->is_string()) fail(key, std::string("must be a string, not ") + node_type_name(*node));
  value = node->as_string()->get();
}

void SectionReader::read_choice(std::string_view key, std::string& value,
                                std::initializer_list<std::string_view> choices) {
  std::string text = value;
  read(key, text);
  if (!has(key)) return;
  if (std::find(choices.begin(), choices.end(), text) == choices.end()) {
    std::ostringstream message;
    message << "is '" << text << "'; expected one of";
    for (std::string_view choice : choices) message << " " << choice;
    fail(key, message.str());
  }
  value = text;
}

namespace {
template <typename Element, typename Convert>
void read_array(SectionReader& reader, const toml::node* node, std::string_view key, const char* element_name,
                std::vector<Element>& value, Convert convert) {
  if (!node) return;
  const toml::array* array = node->as_array();
  if (!array) reader.fail(key, std::string("must be an array of ") + element_name + ", not " + node_type_name(*node));
  std::vector<Element> result;
  for (const toml::node& element : *array) {
    std::optional<Element> converted = convert(element);
    if (!converted) reader.fail(key, std::string("must hold only ") + element_name + ", not " + node_type_name(element));
    result.push_back(*converted);
  }
  value = std::move(result);
}
}  // namespace

void SectionReader::read(std::string_view key, std::vector<std::int64_t>& value) {
  const toml::node* node = find_key(document_, section_, key, read_keys_);
  read_array(*this, node, key, "integers", value, [](const toml::node& element) -> std::optional<std::int64_t> {
    if (!element.is_integer()) return std::nullopt;
    return element.as_integer()->get();
  });
}

void SectionReader::read(std::string_view key, std::vector<std::string>& value) {
  const toml::node* node = find_key(document_, section_, key, read_keys_);
  read_array(*this, node, key, "strings", value, [](const toml::node& element) -> std::optional<std::string> {
    if (!element.is_string()) return std::nullopt;
    return element.as_string()->get();
  });
}

void SectionReader::read_memory_size(std::string_view key, double& bytes) {
  const toml::node* node = find_key(document_, section_, key, read_keys_);
  if (!node) return;
  if (node->is_integer()) {
    bytes = static_cast<double>(node->as_integer()->get());
  } else if (node->is_string()) {
    try {
      bytes = static_cast<double>(parse_memory_size(node->as_string()->get()));
    } catch (const Error& error) {
      fail(key, std::string("is not a memory size: ") + error.what());
    }
  } else {
    fail(key, std::string("must be a memory size such as \"16GiB\", not ") + node_type_name(*node));
  }
  if (bytes <= 0) fail(key, "must be positive");
}

void SectionReader::read_integer_or_auto(std::string_view key, std::int64_t& value, std::int64_t auto_value,
                                         std::string_view accepted) {
  const toml::node* node = find_key(document_, section_, key, read_keys_);
  if (!node) return;
  if (node->is_string()) {
    if (node->as_string()->get() != "auto") fail(key, "must be an integer or \"auto\", not \"" + node->as_string()->get() + "\"");
    value = auto_value;
    return;
  }
  if (!node->is_integer()) fail(key, std::string("must be an integer or \"auto\", not ") + node_type_name(*node));
  if (node->as_integer()->get() == auto_value)
    fail(key, "= " + std::to_string(auto_value) + " is not a value it accepts; accepted: " + std::string(accepted));
  value = node->as_integer()->get();
}

void SectionReader::read_bool_or_auto(std::string_view key, bool& value, bool& automatic) {
  const toml::node* node = find_key(document_, section_, key, read_keys_);
  if (!node) return;
  if (node->is_string()) {
    if (node->as_string()->get() != "auto") fail(key, "must be true, false or \"auto\", not \"" + node->as_string()->get() + "\"");
    automatic = true;
    return;
  }
  if (!node->is_boolean()) fail(key, std::string("must be true, false or \"auto\", not ") + node_type_name(*node));
  value = node->as_boolean()->get();
  automatic = false;
}

void SectionReader::finish() const {
  const toml::table* table = section_table(document_, section_);
  if (!table) return;
  for (auto&& [key, node] : *table) {
    if (std::find(read_keys_.begin(), read_keys_.end(), key.str()) == read_keys_.end())
      fail(key.str(), "is unknown");
  }
}

// ---------------- [model] ----------------

std::span<const std::string_view> known_config_sections() {
  static constexpr std::array<std::string_view, 7> kSections = {"model", "train", "parallel", "data",
                                                                "profile", "log", "checkpoint"};
  return kSections;
}

ModelConfig read_model_config(const ConfigDocument& document) {
  SectionReader reader(document, "model");
  PARTRAIN_CHECK(reader.present(), document.source_name() << ": the [model] section is missing");
  ModelConfig config;
  reader.read_choice("type", config.type, {"bert", "gpt", "resnet"});
  if (config.type.empty()) reader.fail("type", "is required (bert, gpt or resnet)");
  if (config.type == "gpt") {
    config.vocab = 50257;
    config.max_position = 1024;
    config.seq_len = 1024;
  }
  reader.read("layers", config.layers);
  reader.read("hidden", config.hidden);
  reader.read("heads", config.heads);
  reader.read("intermediate", config.intermediate);
  reader.read("vocab", config.vocab);
  reader.read("vocab_divisible_by", config.vocab_divisible_by);
  reader.read("max_position", config.max_position);
  reader.read("type_vocab", config.type_vocab);
  reader.read("seq_len", config.seq_len);
  reader.read("dropout", config.dropout);
  reader.read("attention_dropout", config.attention_dropout);
  reader.read("layer_norm_eps", config.layer_norm_eps);
  reader.read("initializer_range", config.initializer_range);
  reader.read("nsp", config.nsp);
  reader.read_choice("task", config.task, {"pretraining", "classification"});
  reader.read("fused_attention", config.fused_attention);
  for (const char* key : {"pad_id", "unk_id", "bos_id", "eos_id", "cls_id", "sep_id", "mask_id"}) {
    std::int64_t id = -1;
    reader.read(key, id);
    if (!reader.has(key)) continue;
    if (id < -1) reader.fail(key, "must be a token id (or -1: the tokenizer has no such token), not " + std::to_string(id));
    config.special_token_ids.emplace_back(key, id);
  }
  reader.read("depth", config.depth);
  reader.read("width_factor", config.width_factor);
  reader.read("base_width", config.base_width);
  reader.read("classes", config.classes);
  reader.read("image_size", config.image_size);
  reader.read("channels", config.channels);
  reader.finish();

  auto require_positive = [&](std::string_view key, std::int64_t value) {
    if (value <= 0) reader.fail(key, "must be positive, not " + std::to_string(value));
  };
  auto require_probability = [&](std::string_view key, double value) {
    if (value >= 1 || (value < 0 && key == "dropout")) reader.fail(key, "must be in [0, 1)");
  };
  if (config.type == "bert" || config.type == "gpt") {
    for (auto [key, value] : {std::pair<std::string_view, std::int64_t>{"layers", config.layers},
                              {"hidden", config.hidden}, {"heads", config.heads}, {"vocab", config.vocab},
                              {"vocab_divisible_by", config.vocab_divisible_by},
                              {"max_position", config.max_position}, {"seq_len", config.seq_len}})
      require_positive(key, value);
    if (config.type == "bert") require_positive("type_vocab", config.type_vocab);
    if (config.task == "classification") {
      if (config.type != "bert") reader.fail("task", "= \"classification\" is BERT's sequence classification; a gpt has only \"pretraining\"");
      if (config.classes < 2) reader.fail("classes", "must be at least 2 for classification, not " + std::to_string(config.classes));
    }
    if (config.intermediate < 0) reader.fail("intermediate", "must be positive (or 0 for 4 * hidden)");
    if (config.hidden % config.heads != 0)
      reader.fail("heads", std::to_string(config.heads) + " does not divide hidden " + std::to_string(config.hidden));
    if (config.seq_len > config.max_position)
      reader.fail("seq_len", std::to_string(config.seq_len) + " exceeds max_position " +
                                 std::to_string(config.max_position));
    require_probability("dropout", config.dropout);
    require_probability("attention_dropout", config.attention_dropout);
    if (config.layer_norm_eps == 0) reader.fail("layer_norm_eps", "must be positive (or negative for the default)");
    for (const auto& [key, id] : config.special_token_ids)
      if (id >= config.vocab)
        reader.fail(key, std::to_string(id) + " is outside the vocabulary (vocab = " + std::to_string(config.vocab) + ")");
  } else {
    const std::array<std::int64_t, 5> depths = {18, 34, 50, 101, 152};
    if (std::find(depths.begin(), depths.end(), config.depth) == depths.end())
      reader.fail("depth", std::to_string(config.depth) + " is not one of 18, 34, 50, 101, 152");
    for (auto [key, value] : {std::pair<std::string_view, std::int64_t>{"width_factor", config.width_factor},
                              {"base_width", config.base_width}, {"classes", config.classes},
                              {"image_size", config.image_size}, {"channels", config.channels}})
      require_positive(key, value);
  }
  if (config.initializer_range <= 0) reader.fail("initializer_range", "must be positive");
  return config;
}

// ---------------- [train] ----------------

TrainConfig read_train_config(const ConfigDocument& document) {
  SectionReader reader(document, "train");
  TrainConfig config;
  reader.read("steps", config.steps);
  reader.read("global_batch", config.global_batch);
  reader.read("microbatches", config.microbatches);
  reader.read("seed", config.seed);
  reader.read_choice("optimizer", config.optimizer, {"adamw", "sgd"});
  reader.read("lr", config.lr);
  reader.read("min_lr", config.min_lr);
  reader.read("warmup_steps", config.warmup_steps);
  reader.read_choice("lr_schedule", config.lr_schedule, {"cosine", "linear", "constant"});
  reader.read("weight_decay", config.weight_decay);
  reader.read("beta1", config.beta1);
  reader.read("beta2", config.beta2);
  reader.read("eps", config.eps);
  reader.read("momentum", config.momentum);
  reader.read("grad_clip", config.grad_clip);
  reader.read("eval_every", config.eval_every);
  reader.read("eval_batches", config.eval_batches);
  reader.read_choice("precision", config.precision, {"fp32", "bf16", "fp16"});
  reader.read_choice("device", config.device, {"auto", "cpu", "cuda"});
  reader.read("initial_loss_scale", config.initial_loss_scale);
  reader.read("loss_scale_growth_factor", config.loss_scale_growth_factor);
  reader.read("loss_scale_backoff_factor", config.loss_scale_backoff_factor);
  reader.read("loss_scale_growth_interval", config.loss_scale_growth_interval);
  reader.read("min_loss_scale", config.min_loss_scale);
  reader.finish();
  if (config.steps < 0) reader.fail("steps", "must not be negative");
  if (config.global_batch <= 0) reader.fail("global_batch", "must be positive");
  if (config.microbatches < 0) reader.fail("microbatches", "must be positive (or 0 for the plan's choice)");
  if (config.microbatches > config.global_batch)
    reader.fail("microbatches", "exceeds global_batch " + std::to_string(config.global_batch));
  if (config.lr < 0) reader.fail("lr", "must not be negative");
  if (config.min_lr < 0 || config.min_lr > config.lr) reader.fail("min_lr", "must be in [0, lr]");
  if (config.warmup_steps < 0) reader.fail("warmup_steps", "must not be negative");
  if (config.weight_decay < 0) reader.fail("weight_decay", "must not be negative");
  if (config.beta1 < 0 || config.beta1 >= 1) reader.fail("beta1", "must be in [0, 1)");
  if (config.beta2 < 0 || config.beta2 >= 1) reader.fail("beta2", "must be in [0, 1)");
  if (config.eps <= 0) reader.fail("eps", "must be positive");
  if (config.momentum < 0 || config.momentum >= 1) reader.fail("momentum", "must be in [0, 1)");
  if (config.grad_clip < 0) reader.fail("grad_clip", "must not be negative (0 turns clipping off)");
  if (config.eval_every < 0) reader.fail("eval_every", "must not be negative");
  if (config.eval_batches <= 0) reader.fail("eval_batches", "must be positive");
  if (!(config.initial_loss_scale > 0) || !std::isfinite(config.initial_loss_scale))
    reader.fail("initial_loss_scale", "must be positive and finite");
  if (!(config.loss_scale_growth_factor > 1) || !std::isfinite(config.loss_scale_growth_factor))
    reader.fail("loss_scale_growth_factor", "must be greater than 1");
  if (!(config.loss_scale_backoff_factor > 0 && config.loss_scale_backoff_factor < 1))
    reader.fail("loss_scale_backoff_factor", "must be in (0, 1)");
  if (config.loss_scale_growth_interval < 1) reader.fail("loss_scale_growth_interval", "must be at least 1");
  if (!(config.min_loss_scale >= 0 && config.min_loss_scale <= config.initial_loss_scale))
    reader.fail("min_loss_scale", "must be in [0, initial_loss_scale]");
  return config;
}

// ---------------- [parallel] ----------------

namespace {
// [parallel] device_model: the preset's figures become the defaults of the device keys, which the
// file may still set one by one.
void read_device_model(SectionReader& reader, ParallelConfig& config) {
  if (!reader.has("device_model")) return;
  reader.read("device_model", config.device_model);
  if (config.device_model.empty()) return;  // "": no preset (the FLOP-only model)
  const DevicePreset* preset = find_device_preset(config.device_model);
  if (!preset) {
    std::string names;
    for (const DevicePreset& known : device_presets()) names += (names.empty() ? "\"" : ", \"") + known.name + "\"";
    reader.fail("device_model", "must be one of " + names + ", not \"" + config.device_model + "\"");
  }
  config.device_memory_bytes = preset->memory_bytes;
  config.devices_per_node = preset->devices_per_node;
  config.device_flops = preset->peak_bf16_flops;
  config.device_efficiency = preset->gemm_efficiency;
  config.link_latency = preset->link_latency;
  config.link_bandwidth = preset->link_bandwidth;
  config.network_bandwidth = preset->network_bandwidth;
}
}  // namespace

ParallelConfig read_parallel_config(const ConfigDocument& document) {
  SectionReader reader(document, "parallel");
  ParallelConfig config;
  read_device_model(reader, config);
  reader.read_choice("planner", config.planner, {"rannc", "ideals", "dpl", "ip", "capslog", "merak", "uniform", "manual"});
  reader.read("world_size", config.world_size);
  reader.read_memory_size("device_memory", config.device_memory_bytes);
  reader.read("memory_margin", config.memory_margin);
  reader.read("devices_per_node", config.devices_per_node);
  reader.read_choice("schedule", config.schedule, {"gpipe", "1f1b", "scp", "interleaved", "zb_h1", "zb_v", "auto"});
  reader.read_integer_or_auto("virtual_stages", config.virtual_stages, 0, "an integer >= 1 or \"auto\"");
  reader.read_choice("recompute", config.recompute, {"auto", "none", "boundaries", "stage_aware", "layers", "selective"});
  reader.read("recompute_layers", config.recompute_layers);
  config.blocks_given = reader.has("blocks");
  reader.read("blocks", config.blocks);
  reader.read("max_microbatches", config.max_microbatches);
  reader.read("max_ideals", config.max_ideals);
  reader.read("ip_time_limit", config.ip_time_limit);
  reader.read("ip_gap", config.ip_gap);
  reader.read("ip_contiguous", config.ip_contiguous);
  reader.read("stages", config.stages);
  config.tensor_parallel_given = reader.has("tensor_parallel");
  config.device_memory_given = reader.has("device_memory") || !config.device_model.empty();
  config.zero_given = reader.has("zero");
  reader.read_integer_or_auto("tensor_parallel", config.tensor_parallel, 0, "1..devices_per_node or \"auto\"");
  reader.read_integer_or_auto("zero", config.zero, -1, "0, 1 or \"auto\"");
  reader.read("sub_pipelined_tmp", config.sub_pipelined_tmp);
  reader.read_bool_or_auto("sequence_parallel", config.sequence_parallel, config.choose_sequence_parallel);
  reader.read("bucket_mb", config.bucket_mb);
  reader.read("replicas", config.replicas);
  reader.read("boundaries", config.boundaries);
  reader.read("device_flops", config.device_flops);
  reader.read("device_efficiency", config.device_efficiency);
  reader.read("link_latency", config.link_latency);
  reader.read("link_bandwidth", config.link_bandwidth);
  reader.read("network_bandwidth", config.network_bandwidth);
  reader.finish();
  if (config.world_size < 0) reader.fail("world_size", "must not be negative (0: the MPI world size)");
  if (config.memory_margin < 0 || config.memory_margin >= 1) reader.fail("memory_margin", "must be in [0, 1)");
  if (config.devices_per_node <= 0) reader.fail("devices_per_node", "must be positive");
  if (config.blocks <= 0) reader.fail("blocks", "must be positive");
  if (config.recompute_layers <= 0)
    reader.fail("recompute_layers", "must be at least 1 (transformer layers per checkpointed block)");
  if (config.max_microbatches <= 0) reader.fail("max_microbatches", "must be positive");
  if (config.max_ideals <= 0) reader.fail("max_ideals", "must be positive");
  if (config.ip_time_limit <= 0) reader.fail("ip_time_limit", "must be positive (seconds)");
  if (config.ip_gap < 0) reader.fail("ip_gap", "must not be negative");
  if (config.stages < 0) reader.fail("stages", "must not be negative (0: the planner's choice)");
  if (!(config.bucket_mb > 0))
    reader.fail("bucket_mb", "must be positive (MiB of gradients per all-reduce bucket; e.g. 25 as PyTorch DDP)");
  if (config.zero < -1 || config.zero > 1)
    reader.fail("zero", "must be 0 or 1 (ZeRO stage 1: sharded optimizer state), or \"auto\" (the planner chooses)");
  if (config.tensor_parallel < 0 || config.tensor_parallel > config.devices_per_node)
    reader.fail("tensor_parallel", "must be between 1 and devices_per_node (" + std::to_string(config.devices_per_node) +
                                       "): a tensor-parallel group all-reduces in every layer and stays inside a node; "
                                       "or \"auto\" (the planner chooses)");
  for (std::int64_t replicas : config.replicas)
    if (replicas <= 0) reader.fail("replicas", "must hold positive counts");
  if (!config.replicas.empty() && config.stages != 0 && static_cast<std::int64_t>(config.replicas.size()) != config.stages)
    reader.fail("replicas", "has " + std::to_string(config.replicas.size()) + " entries but stages = " +
                                std::to_string(config.stages));
  if (config.sequence_parallel && config.tensor_parallel == 1)
    reader.fail("sequence_parallel", "= true needs tensor_parallel > 1 (or \"auto\"): it splits the sequence over the "
                                     "tensor-parallel group");
  if (config.virtual_stages < 0)
    reader.fail("virtual_stages", "must be at least 1 (model chunks per pipeline rank; 1: plain 1f1b), or \"auto\"");
  if (config.virtual_stages == 0 && config.schedule != "interleaved")
    reader.fail("virtual_stages", "= \"auto\" needs schedule = \"interleaved\", not \"" + config.schedule + "\"");
  // zb_v always runs two model chunks per rank (a V); the default virtual_stages = 1 means that.
  if (config.schedule == "zb_v" && config.virtual_stages == 1) config.virtual_stages = 2;
  if (config.schedule == "zb_v" && config.virtual_stages != 2)
    reader.fail("virtual_stages", "= " + std::to_string(config.virtual_stages) +
                                      ": schedule = \"zb_v\" runs exactly 2 model chunks per pipeline rank");
  if (config.virtual_stages > 1 && config.schedule != "interleaved" && config.schedule != "zb_v")
    reader.fail("virtual_stages", "= " + std::to_string(config.virtual_stages) +
                                      " needs schedule = \"interleaved\" (Megatron's interleaved 1F1B), not \"" +
                                      config.schedule + "\"");
  if (config.virtual_stages > 1 && config.stages == 1 && config.schedule == "interleaved")
    reader.fail("virtual_stages", "needs at least 2 pipeline stages (stages = 1: a rank would send to itself)");
  if (!config.boundaries.empty() && config.stages != 0 &&
      static_cast<std::int64_t>(config.boundaries.size()) + 1 != config.stages * config.virtual_stages)
    reader.fail("boundaries", config.virtual_stages > 1
                                  ? "needs stages x virtual_stages - 1 = " +
                                        std::to_string(config.stages * config.virtual_stages - 1) +
                                        " entries (the first layers of model chunks 2..S·v), not " +
                                        std::to_string(config.boundaries.size())
                                  : "needs stages - 1 = " + std::to_string(config.stages - 1) + " entries, not " +
                                        std::to_string(config.boundaries.size()));
  if (config.device_flops <= 0) reader.fail("device_flops", "must be positive");
  if (config.device_efficiency <= 0 || config.device_efficiency > 1) reader.fail("device_efficiency", "must be in (0, 1]");
  if (config.link_latency < 0) reader.fail("link_latency", "must not be negative (seconds)");
  if (config.link_bandwidth <= 0) reader.fail("link_bandwidth", "must be positive");
  if (config.network_bandwidth <= 0) reader.fail("network_bandwidth", "must be positive");
  return config;
}

// ---------------- [data] ----------------

DataConfig read_data_config(const ConfigDocument& document) {
  SectionReader reader(document, "data");
  DataConfig config;
  reader.read("path", config.path);
  reader.read("mask_probability", config.mask_probability);
  reader.read("synthetic", config.synthetic);
  reader.finish();
  if (config.mask_probability <= 0 || config.mask_probability >= 1) reader.fail("mask_probability", "must be in (0, 1)");
  return config;
}

// ---------------- [log] ----------------

LogConfig read_log_config(const ConfigDocument& document) {
  SectionReader reader(document, "log");
  LogConfig config;
  reader.read("dir", config.dir);
  reader.read("every", config.every);
  reader.read("trace", config.trace);
  reader.read("save_parameters", config.save_parameters);
  reader.read("save_initial", config.save_initial);
  reader.read("save_gradients", config.save_gradients);
  reader.read("op_profile", config.op_profile);
  reader.finish();
  if (config.every <= 0) reader.fail("every", "must be positive");
  if (config.trace.find('/') != std::string::npos) reader.fail("trace", "must be a file name inside [log] dir");
  return config;
}

// ---------------- [profile] ----------------

ProfileConfig read_profile_config(const ConfigDocument& document) {
  SectionReader reader(document, "profile");
  ProfileConfig config;
  reader.read("enabled", config.enabled);
  reader.read("cache_dir", config.cache_dir);
  reader.read("warmup", config.warmup);
  reader.read("repeats", config.repeats);
  reader.read("flush_caches", config.flush_caches);
  reader.read("refresh", config.refresh);
  reader.read("replan_threshold", config.replan_threshold);
  reader.read("replan_window", config.replan_window);
  reader.finish();
  if (config.warmup < 0) reader.fail("warmup", "must not be negative");
  if (config.repeats <= 0) reader.fail("repeats", "must be positive");
  if (!(config.replan_threshold >= 0)) reader.fail("replan_threshold", "must not be negative (0 turns re-planning off)");
  if (config.replan_window <= 0) reader.fail("replan_window", "must be positive");
  return config;
}

// ---------------- [checkpoint] ----------------

CheckpointConfig read_checkpoint_config(const ConfigDocument& document) {
  SectionReader reader(document, "checkpoint");
  CheckpointConfig config;
  reader.read("dir", config.dir);
  reader.read("every", config.every);
  reader.read("keep", config.keep);
  reader.read("resume", config.resume);
  reader.read_choice("on_error", config.on_error, {"stop", "continue"});
  reader.read("write_timeout", config.write_timeout);
  reader.finish();
  if (config.every < 0) reader.fail("every", "must not be negative (0: never)");
  if (config.keep <= 0) reader.fail("keep", "must be positive");
  if (!(config.write_timeout > 0)) reader.fail("write_timeout", "must be a positive number of seconds");
  return config;
}

ExperimentConfig load_experiment(const std::string& path, std::span<const std::string> overrides) {
  const ConfigDocument document = ConfigDocument::load(path, overrides);
  document.check_sections(known_config_sections());
  ExperimentConfig config;
  config.path = path;
  std::ostringstream text;
  text << document.data().table;
  config.text = text.str();
  config.model = read_model_config(document);
  config.train = read_train_config(document);
  config.parallel = read_parallel_config(document);
  if (config.parallel.sequence_parallel && config.model.type == "resnet")
    SectionReader(document, "parallel")
        .fail("sequence_parallel", "= true, but a resnet has no tensor-parallel layers (only BERT and GPT); use false");
  // Megatron-LM's interleaved schedule runs the microbatches in groups of the pipeline depth.
  if (config.parallel.virtual_stages > 1 && config.parallel.stages > 0 && config.train.microbatches > 0 &&
      config.train.microbatches % config.parallel.stages != 0)
    SectionReader(document, "train")
        .fail("microbatches", "= " + std::to_string(config.train.microbatches) +
                                  " must be a multiple of [parallel] stages = " + std::to_string(config.parallel.stages) +
                                  " for the interleaved schedule (virtual_stages = " +
                                  std::to_string(config.parallel.virtual_stages) + ")");
  config.data = read_data_config(document);
  if (config.data.synthetic && config.model.type != "resnet")
    SectionReader(document, "data")
        .fail("synthetic", "= true, but synthetic data is made for resnet only (images); a " + config.model.type +
                               " reads the text file data/prepare.sh makes ([data] path)");
  config.log = read_log_config(document);
  config.profile = read_profile_config(document);
  config.checkpoint = read_checkpoint_config(document);
  return config;
}

}  // namespace partrain
