#pragma once
// The tiny reference models of the unit and MPI tests.
#include <string>

#include "graph/graph.h"
#include "graph/interpreter.h"
#include "io/config.h"

namespace partrain::testing {

/// Tiny "bert" or "gpt" (2 layers, hidden 128, 2 heads, vocab 8000, seq_len 64; bert: intermediate
/// 512) or "resnet" (ResNet-18, base width 8, 10 classes, 28x28x1 images).
ModelConfig tiny_model_config(const std::string& type);

/// A smaller "bert" or "gpt" for tensor-parallel tests: 2 layers, hidden 64, 4 heads (t = 2 and 4
/// divide them), intermediate 128, vocab 512, seq_len 16, dropout 0.1.
ModelConfig small_transformer_config(const std::string& type);

/// Inputs, labels (valid ids for every table: 0 and 1) and initialised parameters (seed 7) for a
/// batch of `batch` samples of `graph`; float inputs deterministic in [-1, 1], attention masks 0.
TensorMap model_feeds(const Graph& graph, std::int64_t batch);

}  // namespace partrain::testing
