#pragma once
// Model builders: forward operator graphs of BERT, GPT-2 and ResNet from the [model] section, with
// parameter names that follow Hugging Face (BERT, GPT-2) and torchvision (ResNet), and their
// initial parameter values.
#include <cstdint>
#include <string>
#include <unordered_map>

#include "core/tensor.h"
#include "graph/graph.h"
#include "io/config.h"

namespace partrain {

/// Builds the forward graph of config.type (bert, gpt or resnet) with the training loss (a scalar
/// f32, mean cross-entropy) marked as the graph's only output. Throws partrain::Error on an
/// unknown type.
Graph build_model(const ModelConfig& config);

/// Initial values of every Param and Buffer of a graph built by build_model, by value id, following
/// Hugging Face / torchvision: linear and embedding weights normal(0, initializer_range) (GPT-2's
/// residual projections c_proj: divided by sqrt(2 * layers)), LayerNorm weight 1 and bias 0, biases
/// 0; ResNet convolutions kaiming-normal (fan_out, ReLU gain), BatchNorm weight 1 bias 0,
/// running_mean 0, running_var 1, fc weight and bias uniform(+-1/sqrt(fan_in)) (nn.Linear default).
/// Each value draws from its own std::mt19937_64 seeded by (seed, name), so the values do not
/// depend on creation order or on which other parameters exist.
std::unordered_map<int, Tensor> initialize_parameters(const Graph& graph, std::uint64_t seed,
                                                      double initializer_range = 0.02);

/// True for parameters of the task heads (BERT "cls.*" and "classifier.*", ResNet "fc.*"); GPT-2's LM head is tied to
/// wte and has no parameter of its own.
bool is_head_parameter(const std::string& name);

/// Number of trainable parameter elements outside the task heads (BertModel incl. pooler, the GPT-2
/// transformer, ResNet without fc).
std::int64_t body_parameter_count(const Graph& graph);

}  // namespace partrain
