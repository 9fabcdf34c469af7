#pragma once
// Plausible data for the inputs and labels of a trimmed subgraph under measurement
// (profile/profiler.h): a task set is timed at the work it does in training only when its token ids
// index real table rows, its labels name real classes (and are ignore_index where training's are),
// and its attention masks mask nothing.
#include <cstdint>
#include <map>
#include <random>
#include <string>

#include "core/tensor.h"
#include "graph/graph.h"

namespace partrain::profile {

/// A host tensor for the Input or Label `value` of `graph` at `batch` samples:
/// - integer values (token ids, labels, also when they arrive as boundary activations): uniform in
///   [0, n), n the smallest range their readers accept, followed through shape ops (Gather indices:
///   the table's rows; SoftmaxCrossEntropy labels: the classes); 0 when no reader bounds them;
/// - labels of a loss task named in `counted_label_shares` (task name -> share in [0, 1] of the
///   positions that count, e.g. BERT's masked-language-model loss at `[data] mask_probability`):
///   the loss's ignore_index (its attribute, default −100) at each position with probability
///   1 − share, as real batches have it; the loss kernels skip those rows;
/// - f32/bf16/f16 values: normal(0, 1), except additive attention masks (Attention input 3,
///   Softmax input 1), which are 0.
/// Draws from `generator`. Throws partrain::Error for an unsupported dtype.
Tensor synthetic_input(const Graph& graph, const Value& value, std::int64_t batch,
                       const std::map<std::string, double>& counted_label_shares, std::mt19937_64& generator);

}  // namespace partrain::profile
