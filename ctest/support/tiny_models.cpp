#include "support/tiny_models.h"

#include "core/error.h"
#include "models/model.h"

namespace partrain::testing {

ModelConfig tiny_model_config(const std::string& type) {
  PARTRAIN_CHECK(type == "bert" || type == "gpt" || type == "resnet", "tiny_model_config: unknown type '" << type << "'");
  ModelConfig config;
  config.type = type;
  if (type == "resnet") {
    config.depth = 18;
    config.base_width = 8;
    config.classes = 10;
    config.image_size = 28;
    config.channels = 1;
    return config;
  }
  config.layers = 2;
  config.hidden = 128;
  config.heads = 2;
  if (type == "bert") config.intermediate = 512;
  config.vocab = 8000;
  config.max_position = 64;
  config.seq_len = 64;
  return config;
}

ModelConfig small_transformer_config(const std::string& type) {
  PARTRAIN_CHECK(type == "bert" || type == "gpt", "small_transformer_config: unknown type '" << type << "'");
  ModelConfig config;
  config.type = type;
  config.layers = 2;
  config.hidden = 64;
  config.heads = 4;
  config.intermediate = 128;
  config.vocab = 512;
  config.max_position = 32;
  config.seq_len = 16;
  config.dropout = 0.1;
  return config;
}

TensorMap model_feeds(const Graph& graph, std::int64_t batch) {
  TensorMap values;
  for (const Value& value : graph.values()) {
    if (value.kind != ValueKind::Input && value.kind != ValueKind::Label) continue;
    const Shape shape = with_batch(value.type.shape, batch);
    const std::int64_t n = numel(shape);
    if (value.type.dtype == DType::I64) {
      std::vector<std::int64_t> ids(static_cast<std::size_t>(n));
      for (std::int64_t k = 0; k < n; ++k) ids[static_cast<std::size_t>(k)] = (k * 7 + 3) % 2;  // valid for every table
      values[value.id] = Tensor::from_vector<std::int64_t>(shape, ids);
    } else {
      std::vector<float> x(static_cast<std::size_t>(n));
      const bool mask = value.name.find("mask") != std::string::npos;  // additive attention mask: 0
      for (std::int64_t k = 0; k < n; ++k) x[static_cast<std::size_t>(k)] = mask ? 0.f : static_cast<float>(((k * 37) % 19) - 9) / 9.f;
      values[value.id] = Tensor::from_vector<float>(shape, x);
    }
  }
  for (auto& [id, tensor] : initialize_parameters(graph, 7)) values[id] = tensor;
  return values;
}

}  // namespace partrain::testing
