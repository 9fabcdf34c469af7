// Model builders: exact parameter counts of the reference models (graphs only), Hugging Face /
// torchvision parameter names, initialisation rules, and a forward pass of each tiny model whose
// loss at initialisation is close to ln(vocab) / ln(classes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "graph/subgraph.h"
#include "io/config.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/model.h"
#include "graph/interpreter.h"

namespace partrain {
namespace {

ModelConfig config_file(const std::string& name, const std::vector<std::string>& overrides = {}) {
  return load_experiment(std::string(PARTRAIN_SOURCE_DIR) + "/configs/" + name, overrides).model;
}

struct ReferenceCount {
  const char* file;
  std::int64_t parameters;
  std::int64_t body_parameters;
};

class ModelParameterCount : public ::testing::TestWithParam<ReferenceCount> {};

TEST_P(ModelParameterCount, MatchesThePublishedModel) {
  const ReferenceCount& reference = GetParam();
  const Graph graph = build_model(config_file(reference.file));
  EXPECT_EQ(graph.parameter_count(), reference.parameters);
  EXPECT_EQ(body_parameter_count(graph), reference.body_parameters);
}

INSTANTIATE_TEST_SUITE_P(
    References, ModelParameterCount,
    ::testing::Values(ReferenceCount{"bert-base.toml", 110106428, 109482240},
                      ReferenceCount{"bert-large.toml", 336226108, 335141888},
                      ReferenceCount{"gpt2.toml", 124439808, 124439808},
                      ReferenceCount{"gpt2-medium.toml", 354823168, 354823168},
                      ReferenceCount{"resnet18.toml", 11689512, 11689512 - 513000},
                      ReferenceCount{"resnet50.toml", 25557032, 25557032 - 2049000},
                      ReferenceCount{"resnet101.toml", 44549160, 44549160 - 2049000},
                      ReferenceCount{"resnet152.toml", 60192808, 60192808 - 2049000}),
    [](const ::testing::TestParamInfo<ReferenceCount>& info) {
      std::string name = info.param.file;
      name = name.substr(0, name.find('.'));
      for (char& c : name)
        if (c == '-') c = '_';
      return name;
    });

TEST(Model, HuggingFaceAndTorchvisionNamesAndShapes) {
  const Graph bert = build_model(config_file("bert-base.toml"));
  EXPECT_EQ(bert.value(bert.value_id("bert.encoder.layer.3.attention.self.query.weight")).type.shape, (Shape{768, 768}));
  EXPECT_EQ(bert.value(bert.value_id("bert.encoder.layer.11.intermediate.dense.weight")).type.shape, (Shape{3072, 768}));
  for (const char* name : {"bert.embeddings.word_embeddings.weight", "bert.embeddings.position_embeddings.weight",
                           "bert.embeddings.token_type_embeddings.weight", "bert.embeddings.LayerNorm.weight",
                           "bert.encoder.layer.0.attention.output.dense.weight",
                           "bert.encoder.layer.0.attention.output.LayerNorm.weight",
                           "bert.encoder.layer.0.output.dense.weight", "bert.encoder.layer.0.output.LayerNorm.bias",
                           "bert.pooler.dense.weight", "cls.predictions.transform.dense.weight",
                           "cls.predictions.transform.LayerNorm.weight", "cls.predictions.bias",
                           "cls.seq_relationship.weight"})
    EXPECT_EQ(bert.value(bert.value_id(name)).kind, ValueKind::Param) << name;

  const Graph gpt = build_model(config_file("gpt2.toml"));
  EXPECT_EQ(gpt.value(gpt.value_id("transformer.h.3.attn.c_attn.weight")).type.shape, (Shape{768, 2304}));
  EXPECT_EQ(gpt.value(gpt.value_id("transformer.h.3.mlp.c_fc.weight")).type.shape, (Shape{768, 3072}));
  for (const char* name : {"transformer.wte.weight", "transformer.wpe.weight", "transformer.h.3.ln_1.weight",
                           "transformer.h.3.attn.c_proj.weight", "transformer.h.3.ln_2.bias",
                           "transformer.h.3.mlp.c_proj.bias", "transformer.ln_f.weight"})
    EXPECT_EQ(gpt.value(gpt.value_id(name)).kind, ValueKind::Param) << name;

  const Graph resnet = build_model(config_file("resnet50.toml"));
  for (const char* name : {"conv1.weight", "bn1.weight", "layer1.0.conv1.weight", "layer1.0.downsample.0.weight",
                           "layer1.0.downsample.1.weight", "layer4.2.bn3.bias", "fc.weight", "fc.bias"})
    EXPECT_EQ(resnet.value(resnet.value_id(name)).kind, ValueKind::Param) << name;
  EXPECT_EQ(resnet.value(resnet.value_id("bn1.running_mean")).kind, ValueKind::Buffer);
  // ResNet v1.5: the stride of the first block of layer2 sits on its 3x3 conv.
  EXPECT_EQ(resnet.task(resnet.value(resnet.value_id("layer2.0.conv2")).producer).attributes.get_ints("stride"),
            (std::vector<std::int64_t>{2, 2}));
}

TEST(Model, WidthFactorMultipliesChannels) {
  const Graph graph = build_model(config_file("resnet152x8.toml"));
  EXPECT_EQ(graph.value(graph.value_id("conv1.weight")).type.shape, (Shape{512, 3, 7, 7}));
  EXPECT_EQ(graph.value(graph.value_id("fc.weight")).type.shape, (Shape{1000, 16384}));
}

TEST(Model, TransformerLayersHaveOperatorGranularity) {
  const Graph one = build_model(config_file("bert-base.toml", {"model.layers=1"}));
  const Graph two = build_model(config_file("bert-base.toml", {"model.layers=2"}));
  const std::size_t per_layer = two.tasks().size() - one.tasks().size();
  EXPECT_GE(per_layer, 20u);
  EXPECT_LE(per_layer, 60u);
  const Graph enlarged = build_model(config_file("bert-enlarged.toml", {"model.layers=256", "model.hidden=2048",
                                                                       "model.heads=32"}));
  EXPECT_GT(enlarged.tasks().size(), 256u * per_layer);
}

TEST(Model, InitialisationFollowsTheReferenceRules) {
  const Graph graph = build_model(config_file("bert-tiny.toml"));
  const auto parameters = initialize_parameters(graph, 7);
  const auto again = initialize_parameters(graph, 7);
  const auto other_seed = initialize_parameters(graph, 8);
  const int query = graph.value_id("bert.encoder.layer.0.attention.self.query.weight");
  const std::vector<float> values = parameters.at(query).to_float_vector();
  double sum = 0, square = 0;
  for (float v : values) sum += v, square += double(v) * v;
  const double mean = sum / values.size(), std = std::sqrt(square / values.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.002);
  EXPECT_NEAR(std, 0.02, 0.001);
  EXPECT_EQ(values, again.at(query).to_float_vector());
  EXPECT_NE(values, other_seed.at(query).to_float_vector());
  for (float v : parameters.at(graph.value_id("bert.encoder.layer.0.output.LayerNorm.weight")).to_float_vector())
    ASSERT_EQ(v, 1.0f);
  for (float v : parameters.at(graph.value_id("cls.predictions.bias")).to_float_vector()) ASSERT_EQ(v, 0.0f);
  EXPECT_EQ(parameters.size(), graph.parameters().size());

  // A parameter's value depends only on (seed, name): a deeper model shares layer 0's values.
  const Graph deeper = build_model(config_file("bert-tiny.toml", {"model.layers=3"}));
  EXPECT_EQ(initialize_parameters(deeper, 7).at(deeper.value_id("bert.encoder.layer.0.attention.self.query.weight"))
                .to_float_vector(),
            values);

  const Graph resnet = build_model(config_file("resnet-tiny.toml"));
  const auto resnet_values = initialize_parameters(resnet, 1);
  for (float v : resnet_values.at(resnet.value_id("bn1.running_var")).to_float_vector()) ASSERT_EQ(v, 1.0f);
  for (float v : resnet_values.at(resnet.value_id("bn1.running_mean")).to_float_vector()) ASSERT_EQ(v, 0.0f);
}

// Forward pass of a tiny model on random inputs with initialised parameters: the loss of an
// untrained model is close to the entropy of a uniform prediction.
float tiny_loss(const Graph& graph, const ModelConfig& config, std::int64_t batch, TensorMap* computed = nullptr) {
  TensorMap values;
  for (auto& [id, tensor] : initialize_parameters(graph, 1234)) values.emplace(id, tensor);
  std::mt19937_64 generator(99);
  auto random_ids = [&](const Shape& shape, std::int64_t limit, double ignored_fraction) {
    Tensor tensor = Tensor::empty(shape, DType::I64);
    std::uniform_int_distribution<std::int64_t> ids(0, limit - 1);
    std::bernoulli_distribution ignored(ignored_fraction);
    for (std::int64_t i = 0; i < tensor.numel(); ++i)
      tensor.data<std::int64_t>()[i] = ignored(generator) ? -100 : ids(generator);
    return tensor;
  };
  for (const Value& value : graph.values()) {
    if (value.kind != ValueKind::Input && value.kind != ValueKind::Label) continue;
    const Shape shape = with_batch(value.type.shape, batch);
    if (value.name == "attention_mask") {
      Tensor mask = Tensor::zeros(shape);
      for (std::int64_t b = 0; b < batch; ++b)  // pad the last quarter of every other sample
        for (std::int64_t s = 3 * config.seq_len / 4; s < config.seq_len && b % 2 == 1; ++s)
          mask.data<float>()[b * config.seq_len + s] = -10000.0f;
      values.emplace(value.id, mask);
    } else if (value.name == "images") {
      // Groups of `classes` copies of one random image, labelled 0 .. classes-1 (below): the loss is
      // then the cross-entropy averaged over every label, free of the noise of random labels.
      Tensor images = Tensor::empty(shape);
      const std::int64_t image_size = images.numel() / batch;
      std::normal_distribution<float> normal(0.0f, 1.0f);
      for (std::int64_t b = 0; b < batch; b += config.classes)
        for (std::int64_t i = 0; i < image_size; ++i) {
          const float pixel = normal(generator);
          for (std::int64_t copy = b; copy < std::min(batch, b + config.classes); ++copy)
            images.data<float>()[copy * image_size + i] = pixel;
        }
      values.emplace(value.id, images);
    } else if (config.type == "resnet" || (config.task == "classification" && value.name == "labels")) {
      Tensor labels = Tensor::empty(shape, DType::I64);
      for (std::int64_t b = 0; b < batch; ++b) labels.data<std::int64_t>()[b] = b % config.classes;
      values.emplace(value.id, labels);
    } else if (value.name == "token_type_ids") {
      values.emplace(value.id, random_ids(shape, config.type_vocab, 0.0));
    } else if (value.name == "nsp_labels") {
      values.emplace(value.id, random_ids(shape, 2, 0.0));
    } else if (value.name == "input_ids") {
      values.emplace(value.id, random_ids(shape, config.vocab, 0.0));
    } else {
      values.emplace(value.id, random_ids(shape, config.vocab, 0.5));
    }
  }
  ExecutionOptions options;
  options.training = true;
  options.random.seed = 5;
  run_forward(graph, whole_graph(graph), values, cpu_backend(), options);
  const Tensor loss = values.at(graph.outputs().at(0));
  EXPECT_EQ(loss.numel(), 1);
  if (computed) *computed = values;
  return loss.to_float_vector().at(0);
}

TEST(Model, TinyBertLossAtInitialisationIsNearLnVocab) {
  ModelConfig config = config_file("bert-tiny.toml");
  config.nsp = false;  // the MLM loss alone is compared with ln(vocab)
  const float loss = tiny_loss(build_model(config), config, 4);
  EXPECT_NEAR(loss, std::log(static_cast<double>(config.vocab)), 0.3);
  // With NSP the loss adds about ln 2.
  const ModelConfig with_nsp = config_file("bert-tiny.toml");
  EXPECT_NEAR(tiny_loss(build_model(with_nsp), with_nsp, 4), std::log(double(with_nsp.vocab)) + std::log(2.0), 0.4);
}

TEST(Model, BertSequenceClassificationHasThePooledClassifierAndNoPretrainingHeads) {
  const ModelConfig config = config_file("bert-pos-tiny.toml");
  ASSERT_EQ(config.task, "classification");
  const Graph graph = build_model(config);
  EXPECT_EQ(graph.value(graph.value_id("classifier.weight")).type.shape, (Shape{4, 128}));
  EXPECT_EQ(graph.value(graph.value_id("classifier.bias")).type.shape, (Shape{4}));
  EXPECT_EQ(graph.value(graph.value_id("bert.pooler.dense.weight")).kind, ValueKind::Param);
  EXPECT_EQ(graph.value(graph.value_id("labels")).kind, ValueKind::Label);
  EXPECT_EQ(graph.value(graph.value_id("labels")).type.shape, (Shape{kBatch}));
  for (const Value& value : graph.values()) {
    EXPECT_FALSE(value.name.starts_with("cls.")) << value.name;
    EXPECT_NE(value.name, "mlm_labels");
    EXPECT_NE(value.name, "nsp_labels");
  }
  EXPECT_TRUE(is_head_parameter("classifier.weight"));
  // 4 balanced classes at initialisation: a loss near ln 4 (dropout on, as in training).
  EXPECT_NEAR(tiny_loss(graph, config, 8), std::log(4.0), 0.3);
}

TEST(Model, TinyGptLossAtInitialisationIsNearLnVocab) {
  const ModelConfig config = config_file("gpt-tiny.toml");
  EXPECT_NEAR(tiny_loss(build_model(config), config, 4), std::log(static_cast<double>(config.vocab)), 0.3);
  ModelConfig fused = config;
  fused.fused_attention = true;
  EXPECT_NEAR(tiny_loss(build_model(fused), fused, 2), std::log(static_cast<double>(config.vocab)), 0.3);
}

TEST(Model, TinyResnetLossAtInitialisationIsNearLnClasses) {
  const ModelConfig config = config_file("resnet-tiny.toml");
  const Graph graph = build_model(config);
  TensorMap values;
  const float loss = tiny_loss(graph, config, 4 * config.classes, &values);
  const double uniform = std::log(static_cast<double>(config.classes));
  EXPECT_NEAR(loss, uniform, 0.3);
  // torchvision's fc init (uniform +-1/sqrt(fan_in)) on O(1) post-ReLU features gives logits of
  // variance v ~ 0.5, and a label-averaged cross-entropy of about ln(classes) + v / 2.
  const std::vector<float> logits = values.at(graph.value_id("fc")).to_float_vector();
  double variance = 0;
  for (std::size_t row = 0; row < logits.size(); row += config.classes) {
    double sum = 0, square = 0;
    for (std::int64_t c = 0; c < config.classes; ++c) sum += logits[row + c], square += double(logits[row + c]) * logits[row + c];
    variance += square / config.classes - (sum / config.classes) * (sum / config.classes);
  }
  variance /= static_cast<double>(logits.size() / config.classes);
  EXPECT_NEAR(loss, uniform + variance / 2, 0.1) << "logit variance " << variance;
}

}  // namespace
}  // namespace partrain
