#include "models/model.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "core/error.h"
#include "graph/layer_names.h"
#include "models/bert.h"
#include "models/gpt.h"
#include "models/resnet.h"

namespace partrain {

Graph build_model(const ModelConfig& config) {
  if (config.type == "bert") return build_bert(config);
  if (config.type == "gpt") return build_gpt(config);
  if (config.type == "resnet") return build_resnet(config);
  PARTRAIN_FAIL("unknown model type '" << config.type << "' (expected bert, gpt or resnet)");
}

namespace {

bool ends_with(const std::string& text, std::string_view suffix) { return text.ends_with(suffix); }

// The initial value of one parameter or buffer from its name and shape (see initialize_parameters).
// gpt_layers scales GPT-2's c_proj init (0 when not GPT); classifier_fan_in bounds ResNet's fc init.
Tensor initial_value(const std::string& name, const Shape& shape, std::uint64_t seed, double initializer_range,
                     std::int64_t gpt_layers, std::int64_t classifier_fan_in) {
  const std::uint64_t name_hash = fnv1a(name.data(), name.size());
  std::seed_seq sequence{static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32),
                         static_cast<std::uint32_t>(name_hash), static_cast<std::uint32_t>(name_hash >> 32)};
  std::mt19937_64 generator(sequence);
  Tensor tensor = Tensor::empty(shape);
  float* data = tensor.data<float>();
  const std::int64_t count = tensor.numel();
  auto fill_normal = [&](double std) {
    std::normal_distribution<float> distribution(0.0f, static_cast<float>(std));
    for (std::int64_t i = 0; i < count; ++i) data[i] = distribution(generator);
  };
  auto fill_uniform = [&](double bound) {
    std::uniform_real_distribution<float> distribution(static_cast<float>(-bound), static_cast<float>(bound));
    for (std::int64_t i = 0; i < count; ++i) data[i] = distribution(generator);
  };
  auto fill = [&](float value) { std::fill(data, data + count, value); };

  if (ends_with(name, ".running_mean")) {
    fill(0.0f);
  } else if (ends_with(name, ".running_var")) {
    fill(1.0f);
  } else if (name == "fc.weight" || name == "fc.bias") {
    // torchvision's classifier keeps nn.Linear's default: uniform(+-1/sqrt(fan_in)) (kaiming_uniform, a = sqrt(5)).
    fill_uniform(1.0 / std::sqrt(static_cast<double>(classifier_fan_in)));
  } else if (ends_with(name, ".bias")) {
    fill(0.0f);
  } else if (shape.size() == 1) {  // LayerNorm / BatchNorm weight
    fill(1.0f);
  } else if (shape.size() == 4) {  // convolution: kaiming_normal_(mode="fan_out", nonlinearity="relu")
    const double fan_out = static_cast<double>(shape[0] * shape[2] * shape[3]);
    fill_normal(std::sqrt(2.0 / fan_out));
  } else if (gpt_layers > 0 && ends_with(name, ".c_proj.weight")) {  // GPT-2's scaled residual projections
    fill_normal(initializer_range / std::sqrt(2.0 * static_cast<double>(gpt_layers)));
  } else {
    fill_normal(initializer_range);
  }
  return tensor;
}

}  // namespace

std::unordered_map<int, Tensor> initialize_parameters(const Graph& graph, std::uint64_t seed, double initializer_range) {
  std::int64_t gpt_layers = 0;
  std::int64_t classifier_fan_in = 0;
  for (const Value& value : graph.values()) {
    gpt_layers = std::max(gpt_layers, layer_index_after(value.name, "transformer.h.") + 1);
    if (value.name == "fc.weight") classifier_fan_in = value.type.shape.at(1);
  }
  std::unordered_map<int, Tensor> tensors;
  for (const Value& value : graph.values()) {
    if (value.kind != ValueKind::Param && value.kind != ValueKind::Buffer) continue;
    Tensor tensor =
        initial_value(value.name, value.type.shape, seed, initializer_range, gpt_layers, classifier_fan_in);
    tensors.emplace(value.id, std::move(tensor));
  }
  return tensors;
}

bool is_head_parameter(const std::string& name) {
  return name.starts_with("cls.") || name.starts_with("fc.") || name.starts_with("classifier.");
}

std::int64_t body_parameter_count(const Graph& graph) {
  std::int64_t count = 0;
  for (const int id : graph.parameters()) {
    const Value& value = graph.value(id);
    if (!is_head_parameter(value.name)) count += numel(value.type.shape);
  }
  return count;
}

}  // namespace partrain
