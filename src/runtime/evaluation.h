#pragma once
// Held-out evaluation (`partrain eval`, [train] eval_every): the loss kept as sums and counts of its
// cross-entropy terms, so that the result does not depend on how a plan cuts the batch into pieces
// (BERT's masked-token mean over a whole batch is not the mean of its pieces' means), plus top-1
// accuracy from the logits that feed each term.
#include <cstdint>
#include <string>
#include <vector>

#include "core/backend.h"
#include "graph/graph.h"
#include "graph/interpreter.h"

namespace partrain::runtime {

/// One cross-entropy term of a model's loss, summed over everything evaluated.
struct LossTerm {
  std::string name;     ///< its SoftmaxCrossEntropy task ("cls.predictions.loss", "loss")
  double loss_sum = 0;  ///< Σ per-position cross-entropy over the positions that count
  double count = 0;     ///< positions that count (label != ignore_index)
  double correct = 0;   ///< of those, positions whose logits' arg max is the label (when counted)

  /// Mean cross-entropy per position that counts (0 when none does).
  double mean() const { return count > 0 ? loss_sum / count : 0; }
  /// Top-1 accuracy over the positions that count (0 when none does).
  double accuracy() const { return count > 0 ? correct / count : 0; }
};

/// What an evaluation measured, identical on every rank.
struct EvaluationResult {
  std::vector<LossTerm> terms;  ///< in the graph's task order
  std::int64_t samples = 0;     ///< samples evaluated

  /// The model's loss over everything evaluated: Σ over its terms of the term's mean (the graph's
  /// loss adds its cross-entropy terms, each a mean over its positions: BERT's MLM + NSP).
  double loss() const;
};

/// The SoftmaxCrossEntropy (or, in a tensor-parallel graph, VocabParallelCrossEntropy: the whole
/// logits' loss on every rank of the group) tasks whose outputs the graph's output (the loss) adds
/// up, in task order. Throws partrain::Error naming the task when the loss is anything else (evaluation needs
/// per-position sums, which only such losses give).
std::vector<int> loss_term_tasks(const Graph& graph);

/// Adds one piece's share of cross-entropy task `task` to `term`: the task's output (the piece's
/// mean) times the piece's positions that count and, with `top1`, the positions whose logits' arg
/// max is the label (the logits are copied to the host for this; not for vocabulary-parallel
/// logits, an error). `values` hold the task's inputs and output on `backend`'s device.
void accumulate_loss_term(const Graph& graph, int task, const TensorMap& values, Backend& backend, bool top1,
                          LossTerm& term);

}  // namespace partrain::runtime
