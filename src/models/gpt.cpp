#include "models/gpt.h"

#include "models/layers.h"

namespace partrain {

namespace {

// One pre-LN GPT-2 block: x + attn(ln_1(x)), then + mlp(ln_2(.)).
int block(Graph& graph, const ModelConfig& config, int layer, int x) {
  const std::string prefix = "transformer.h." + std::to_string(layer);
  const std::int64_t hidden = config.hidden, inner = config.intermediate_size();
  const double eps = config.layer_norm_epsilon();
  int a = layers::layer_norm(graph, prefix + ".ln_1", x, hidden, eps);
  a = layers::linear(graph, prefix + ".attn.c_attn", a, hidden, 3 * hidden, /*conv1d_layout=*/true,
                    layers::column_parallel(/*blocks=*/3));
  const std::vector<int> qkv = graph.add_task(OpType::Split, prefix + ".attn.split_qkv", {a},
                                              {{"axis", std::int64_t{2}},
                                               {"sizes", std::vector<std::int64_t>{hidden, hidden, hidden}}});
  a = layers::attention(graph, prefix + ".attn", qkv[0], qkv[1], qkv[2], hidden, config.heads, /*mask=*/-1,
                        /*causal=*/true, config.attention_dropout_probability(), config.fused_attention);
  a = layers::linear(graph, prefix + ".attn.c_proj", a, hidden, hidden, true, layers::row_parallel());
  a = layers::dropout(graph, prefix + ".attn.resid_dropout", a, config.dropout);
  x = graph.add(OpType::Add, prefix + ".attn.residual", {x, a});

  int m = layers::layer_norm(graph, prefix + ".ln_2", x, hidden, eps);
  m = layers::linear(graph, prefix + ".mlp.c_fc", m, hidden, inner, true, layers::column_parallel());
  m = graph.add(OpType::Gelu, prefix + ".mlp.gelu", {m}, {{"approximate", std::string("tanh")}});
  m = layers::linear(graph, prefix + ".mlp.c_proj", m, inner, hidden, true, layers::row_parallel());
  m = layers::dropout(graph, prefix + ".mlp.dropout", m, config.dropout);
  return graph.add(OpType::Add, prefix + ".mlp.residual", {x, m});
}

}  // namespace

Graph build_gpt(const ModelConfig& config) {
  Graph graph;
  const std::int64_t seq = config.seq_len, hidden = config.hidden;
  const int input_ids = graph.add_input("input_ids", {kBatch, seq}, DType::I64);
  const int labels = graph.add_label("labels", {kBatch, seq}, DType::I64);

  const int wte = graph.add_parameter("transformer.wte.weight", {config.vocab, hidden});
  const int wpe = graph.add_parameter("transformer.wpe.weight", {config.max_position, hidden});
  const int positions = layers::position_ids(graph, "transformer.position_ids", seq);
  const int tokens = graph.add(OpType::Gather, "transformer.wte", {wte, input_ids});
  graph.hint_tensor_parallel(tokens, layers::vocabulary_parallel(config.vocab_divisible_by));
  const int position_vectors = graph.add(OpType::Gather, "transformer.wpe", {wpe, positions});
  int x = graph.add(OpType::Add, "transformer.embeddings", {tokens, position_vectors});
  x = layers::dropout(graph, "transformer.drop", x, config.dropout);

  for (int layer = 0; layer < config.layers; ++layer) x = block(graph, config, layer, x);

  x = layers::layer_norm(graph, "transformer.ln_f", x, hidden, config.layer_norm_epsilon());
  const int logits = graph.add(OpType::MatMul, "lm_head", {x, wte}, {{"trans_b", std::int64_t{1}}});
  graph.hint_tensor_parallel(logits, layers::vocabulary_parallel(config.vocab_divisible_by));
  graph.mark_output(layers::cross_entropy(graph, "loss", logits, labels));
  return graph;
}

}  // namespace partrain
