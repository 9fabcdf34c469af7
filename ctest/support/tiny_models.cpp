#include "support/tiny_models.h"

#include "core/error.h"

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

}  // namespace partrain::testing
