#include "models/bert.h"

#include "models/layers.h"

namespace partrain {

namespace {

// One post-LN encoder layer (Hugging Face BertLayer): self-attention, output dense + dropout +
// residual + LayerNorm, intermediate dense + GELU, output dense + dropout + residual + LayerNorm.
int encoder_layer(Graph& graph, const ModelConfig& config, int layer, int x, int mask) {
  const std::string prefix = "bert.encoder.layer." + std::to_string(layer);
  const std::int64_t hidden = config.hidden, inner = config.intermediate_size();
  const double eps = config.layer_norm_epsilon();
  const std::string self = prefix + ".attention.self";
  const int q = layers::linear(graph, self + ".query", x, hidden, hidden, false, layers::column_parallel());
  const int k = layers::linear(graph, self + ".key", x, hidden, hidden, false, layers::column_parallel());
  const int v = layers::linear(graph, self + ".value", x, hidden, hidden, false, layers::column_parallel());
  const int context = layers::attention(graph, self, q, k, v, hidden, config.heads, mask, /*causal=*/false,
                                        config.attention_dropout_probability(), config.fused_attention);
  const std::string attention_output = prefix + ".attention.output";
  int y = layers::linear(graph, attention_output + ".dense", context, hidden, hidden, false, layers::row_parallel());
  y = layers::dropout(graph, attention_output + ".dropout", y, config.dropout);
  y = graph.add(OpType::Add, attention_output + ".residual", {y, x});
  const int attended = layers::layer_norm(graph, attention_output + ".LayerNorm", y, hidden, eps);

  int z = layers::linear(graph, prefix + ".intermediate.dense", attended, hidden, inner, false, layers::column_parallel());
  z = graph.add(OpType::Gelu, prefix + ".intermediate.gelu", {z});
  z = layers::linear(graph, prefix + ".output.dense", z, inner, hidden, false, layers::row_parallel());
  z = layers::dropout(graph, prefix + ".output.dropout", z, config.dropout);
  z = graph.add(OpType::Add, prefix + ".output.residual", {z, attended});
  return layers::layer_norm(graph, prefix + ".output.LayerNorm", z, hidden, eps);
}

// BertPooler: dense + tanh on the first token ([CLS]) of x [B, S, H] -> [B, H].
int pooler(Graph& graph, int x, std::int64_t hidden) {
  int first = graph.add(OpType::Slice, "bert.pooler.first_token", {x},
                        {{"axis", std::int64_t{1}}, {"start", std::int64_t{0}}, {"end", std::int64_t{1}}});
  first = graph.add(OpType::Reshape, "bert.pooler.first_token_flat", {first},
                    {{"shape", std::vector<std::int64_t>{0, -1}}});
  const int pooled = layers::linear(graph, "bert.pooler.dense", first, hidden, hidden);
  return graph.add(OpType::Tanh, "bert.pooler.activation", {pooled});
}

}  // namespace

Graph build_bert(const ModelConfig& config) {
  Graph graph;
  const std::int64_t seq = config.seq_len, hidden = config.hidden;
  const double eps = config.layer_norm_epsilon();
  const int input_ids = graph.add_input("input_ids", {kBatch, seq}, DType::I64);
  const int token_type_ids = graph.add_input("token_type_ids", {kBatch, seq}, DType::I64);
  const int attention_mask = graph.add_input("attention_mask", {kBatch, 1, 1, seq}, DType::F32);
  const bool classification = config.task == "classification";
  const int mlm_labels = classification ? -1 : graph.add_label("mlm_labels", {kBatch, seq}, DType::I64);
  const int nsp_labels = config.nsp && !classification ? graph.add_label("nsp_labels", {kBatch}, DType::I64) : -1;
  const int labels = classification ? graph.add_label("labels", {kBatch}, DType::I64) : -1;

  // Embeddings: word + position + token type, LayerNorm, dropout.
  const std::string embeddings = "bert.embeddings";
  const int word_weight = graph.add_parameter(embeddings + ".word_embeddings.weight", {config.vocab, hidden});
  const int position_weight = graph.add_parameter(embeddings + ".position_embeddings.weight", {config.max_position, hidden});
  const int token_type_weight = graph.add_parameter(embeddings + ".token_type_embeddings.weight", {config.type_vocab, hidden});
  const int positions = layers::position_ids(graph, embeddings + ".position_ids", seq);
  const int words = graph.add(OpType::Gather, embeddings + ".word_embeddings", {word_weight, input_ids});
  graph.hint_tensor_parallel(words, layers::vocabulary_parallel(config.vocab_divisible_by));
  const int position_vectors = graph.add(OpType::Gather, embeddings + ".position_embeddings", {position_weight, positions});
  const int token_types = graph.add(OpType::Gather, embeddings + ".token_type_embeddings", {token_type_weight, token_type_ids});
  int x = graph.add(OpType::Add, embeddings + ".sum_token_types", {words, token_types});
  x = graph.add(OpType::Add, embeddings + ".sum_positions", {x, position_vectors});
  x = layers::layer_norm(graph, embeddings + ".LayerNorm", x, hidden, eps);
  x = layers::dropout(graph, embeddings + ".dropout", x, config.dropout);

  for (int layer = 0; layer < config.layers; ++layer) x = encoder_layer(graph, config, layer, x, attention_mask);

  if (classification) {
    // BertForSequenceClassification: pooled [CLS] -> dropout -> linear to the classes, cross-entropy.
    int pooled = layers::dropout(graph, "dropout", pooler(graph, x, hidden), config.dropout);
    const int logits = layers::linear(graph, "classifier", pooled, hidden, config.classes);
    graph.mark_output(layers::cross_entropy(graph, "loss", logits, labels));
    return graph;
  }

  // MLM head: transform (dense, GELU, LayerNorm), decoder tied to the word embeddings, own bias.
  const std::string transform = "cls.predictions.transform";
  int t = layers::linear(graph, transform + ".dense", x, hidden, hidden);
  t = graph.add(OpType::Gelu, transform + ".gelu", {t});
  t = layers::layer_norm(graph, transform + ".LayerNorm", t, hidden, eps);
  const int decoder_bias = graph.add_parameter("cls.predictions.bias", {config.vocab});
  int logits = graph.add(OpType::MatMul, "cls.predictions.decoder", {t, word_weight}, {{"trans_b", std::int64_t{1}}});
  graph.hint_tensor_parallel(logits, layers::vocabulary_parallel(config.vocab_divisible_by));
  logits = graph.add(OpType::Add, "cls.predictions.logits", {logits, decoder_bias});
  int loss = layers::cross_entropy(graph, kBertMaskedLanguageModelLoss, logits, mlm_labels);

  if (config.nsp) {
    // Pooler; NSP head: a 2-way linear classifier.
    const int pooled = pooler(graph, x, hidden);
    const int nsp_logits = layers::linear(graph, "cls.seq_relationship", pooled, hidden, 2);
    const int nsp_loss = layers::cross_entropy(graph, "cls.seq_relationship.loss", nsp_logits, nsp_labels);
    loss = graph.add(OpType::Add, "loss", {loss, nsp_loss});
  }
  graph.mark_output(loss);
  return graph;
}

}  // namespace partrain
