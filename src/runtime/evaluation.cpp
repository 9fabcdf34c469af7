#include "runtime/evaluation.h"

#include <algorithm>
#include <functional>

#include "core/error.h"

namespace partrain::runtime {
namespace {

// Element i of an integer host tensor (labels are i64 or i32).
std::int64_t index_at(const Tensor& labels, std::int64_t i) {
  return labels.dtype() == DType::I64 ? labels.data<std::int64_t>()[i] : labels.data<std::int32_t>()[i];
}

}  // namespace

double EvaluationResult::loss() const {
  double loss = 0;
  for (const LossTerm& term : terms) loss += term.mean();
  return loss;
}

std::vector<int> loss_term_tasks(const Graph& graph) {
  PARTRAIN_CHECK(graph.outputs().size() == 1, "evaluation: the graph has " << graph.outputs().size()
                                                                           << " outputs, not one loss");
  std::vector<int> terms;
  const std::function<void(int)> collect = [&](int value) {
    const int producer = graph.value(value).producer;
    PARTRAIN_CHECK(producer >= 0, "evaluation: the loss depends on " << graph.value(value).name
                                                                     << ", which no task computes");
    const Task& task = graph.task(producer);
    if (task.op == OpType::SoftmaxCrossEntropy || task.op == OpType::VocabParallelCrossEntropy) {
      terms.push_back(task.id);
    } else {
      PARTRAIN_CHECK(task.op == OpType::Add, "evaluation: the loss is not a sum of cross-entropies (task "
                                                 << task.name << " is " << op_name(task.op) << ")");
      for (int input : task.inputs) collect(input);
    }
  };
  collect(graph.outputs().front());
  std::sort(terms.begin(), terms.end());
  return terms;
}

void accumulate_loss_term(const Graph& graph, int task, const TensorMap& values, Backend& backend, bool top1,
                          LossTerm& term) {
  const Task& cross_entropy = graph.task(task);
  PARTRAIN_CHECK(!top1 || cross_entropy.op == OpType::SoftmaxCrossEntropy,
                 "evaluation: no top-1 accuracy from " << cross_entropy.name
                                                       << ": its logits are split over a tensor-parallel group");
  const std::int64_t ignore_index = cross_entropy.attributes.get_int("ignore_index", -100);
  const Tensor labels = to_host(values.at(cross_entropy.inputs[1]), backend);
  std::int64_t count = 0;
  for (std::int64_t i = 0; i < labels.numel(); ++i) count += index_at(labels, i) != ignore_index;
  if (count == 0) return;  // the kernel's mean is 0 then
  const double mean = to_host(values.at(cross_entropy.outputs[0]), backend).to_float_vector().at(0);
  term.loss_sum += mean * static_cast<double>(count);
  term.count += static_cast<double>(count);
  if (!top1) return;
  const Tensor logits = to_host(values.at(cross_entropy.inputs[0]), backend);
  const std::vector<float> scores = logits.to_float_vector();
  const std::int64_t classes = logits.shape().back();
  for (std::int64_t row = 0; row < labels.numel(); ++row) {
    const std::int64_t label = index_at(labels, row);
    if (label == ignore_index) continue;
    const float* first = scores.data() + row * classes;
    term.correct += std::max_element(first, first + classes) - first == label;  // the first maximum, as torch
  }
}

}  // namespace partrain::runtime
