#include "models/layers.h"

#include <cmath>
#include <vector>

namespace partrain::layers {

int linear(Graph& graph, const std::string& name, int x, std::int64_t in, std::int64_t out, bool conv1d_layout,
           TensorParallelHint parallel) {
  const int weight = graph.add_parameter(name + ".weight", conv1d_layout ? Shape{in, out} : Shape{out, in});
  const int bias = graph.add_parameter(name + ".bias", {out});
  const int y = graph.add(OpType::Gemm, name, {x, weight, bias}, {{"trans_b", std::int64_t{conv1d_layout ? 0 : 1}}});
  graph.hint_tensor_parallel(y, parallel);
  return y;
}

int layer_norm(Graph& graph, const std::string& name, int x, std::int64_t hidden, double eps) {
  const int weight = graph.add_parameter(name + ".weight", {hidden});
  const int bias = graph.add_parameter(name + ".bias", {hidden});
  return graph.add(OpType::LayerNorm, name, {x, weight, bias}, {{"eps", eps}});
}

int dropout(Graph& graph, const std::string& name, int x, double p) {
  if (p <= 0) return x;
  return graph.add(OpType::Dropout, name, {x}, {{"p", p}});
}

int position_ids(Graph& graph, const std::string& name, std::int64_t length) {
  std::vector<std::int64_t> ids(static_cast<std::size_t>(length));
  for (std::int64_t i = 0; i < length; ++i) ids[static_cast<std::size_t>(i)] = i;
  return graph.add_constant(name, Tensor::from_vector<std::int64_t>({length}, ids));
}

int attention(Graph& graph, const std::string& name, int q, int k, int v, std::int64_t hidden, std::int64_t heads,
              int mask, bool causal, double attention_dropout, bool fused) {
  const std::int64_t head_size = hidden / heads;
  const Attributes split_heads{{"shape", std::vector<std::int64_t>{0, 0, heads, head_size}}};
  const Attributes swap_sequence_and_heads{{"perm", std::vector<std::int64_t>{0, 2, 1, 3}}};
  auto to_heads = [&](int x, const std::string& label) {
    const int reshaped = graph.add(OpType::Reshape, name + "." + label + "_split_heads", {x}, split_heads);
    return graph.add(OpType::Permute, name + "." + label + "_heads", {reshaped}, swap_sequence_and_heads);
  };
  const int q_heads = to_heads(q, "query"), k_heads = to_heads(k, "key"), v_heads = to_heads(v, "value");
  int context;
  if (fused) {
    std::vector<int> inputs{q_heads, k_heads, v_heads};
    if (mask >= 0) inputs.push_back(mask);
    context = graph.add(OpType::Attention, name + ".attention", inputs, {{"causal", std::int64_t{causal ? 1 : 0}}});
  } else {
    // The 1/√d scale rides on the score GEMM (its alpha), as Megatron-LM's baddbmm does: no pass
    // of its own over the B·h·S·T scores, forward or backward.
    const int scores = graph.add(OpType::MatMul, name + ".scores", {q_heads, k_heads},
                                 {{"trans_b", std::int64_t{1}}, {"alpha", 1.0 / std::sqrt(static_cast<double>(head_size))}});
    std::vector<int> softmax_inputs{scores};
    if (mask >= 0) softmax_inputs.push_back(mask);
    const int probabilities =
        graph.add(OpType::Softmax, name + ".probabilities", softmax_inputs, {{"causal", std::int64_t{causal ? 1 : 0}}});
    const int dropped = dropout(graph, name + ".attention_dropout", probabilities, attention_dropout);
    context = graph.add(OpType::MatMul, name + ".context_heads", {dropped, v_heads});
  }
  const int permuted = graph.add(OpType::Permute, name + ".context_permuted", {context}, swap_sequence_and_heads);
  return graph.add(OpType::Reshape, name + ".context", {permuted},
                   {{"shape", std::vector<std::int64_t>{0, 0, hidden}}});
}

int cross_entropy(Graph& graph, const std::string& name, int logits, int labels) {
  return graph.add(OpType::SoftmaxCrossEntropy, name, {logits, labels}, {{"ignore_index", std::int64_t{-100}}});
}

}  // namespace partrain::layers
