// The profiler's synthetic inputs (profile/synthetic_inputs.h) on a tiny BERT: token ids and labels
// in the ranges their readers accept, and the masked-language-model loss's labels ignore_index at
// the share of positions training does not count (binomial bounds, 6 standard deviations).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "graph/subgraph.h"
#include "models/bert.h"
#include "models/model.h"
#include "profile/synthetic_inputs.h"
#include "support/tiny_models.h"

namespace partrain {
namespace {

const Graph& bert() {
  static const Graph graph = build_model(testing::tiny_model_config("bert"));
  return graph;
}

const Task& task_named(const Graph& graph, const std::string& name) {
  for (const Task& task : graph.tasks())
    if (task.name == name) return task;
  ADD_FAILURE() << "no task " << name;
  return graph.tasks().front();
}

// The values of `tensor` (integer) as int64.
std::vector<std::int64_t> integers(const Tensor& tensor) {
  std::vector<std::int64_t> out;
  if (tensor.dtype() == DType::I64) {
    const auto* data = tensor.data<std::int64_t>();
    out.assign(data, data + tensor.numel());
  } else {
    const auto* data = tensor.data<std::int32_t>();
    out.assign(data, data + tensor.numel());
  }
  return out;
}

struct LabelCounts {
  std::int64_t ignored = 0, in_range = 0, out_of_range = 0;
};

LabelCounts count(const std::vector<std::int64_t>& labels, std::int64_t ignore_index, std::int64_t classes) {
  LabelCounts counts;
  for (std::int64_t label : labels) {
    if (label == ignore_index) ++counts.ignored;
    else if (label >= 0 && label < classes) ++counts.in_range;
    else ++counts.out_of_range;
  }
  return counts;
}

// The masked-language-model loss's label value and its class count.
struct MaskedLoss {
  int labels = -1;
  std::int64_t classes = 0, ignore_index = 0;
};

MaskedLoss masked_loss(const Graph& graph) {
  const Task& loss = task_named(graph, kBertMaskedLanguageModelLoss);
  EXPECT_EQ(loss.op, OpType::SoftmaxCrossEntropy);
  MaskedLoss found;
  found.classes = graph.value(loss.inputs.at(0)).type.shape.back();
  found.ignore_index = loss.attributes.get_int("ignore_index", -100);
  // The loss may read the Label through shape ops (a flattening reshape): walk back to it.
  int value = loss.inputs.at(1);
  while (graph.value(value).kind != ValueKind::Label) {
    const int producer = graph.value(value).producer;
    EXPECT_GE(producer, 0);
    if (producer < 0) return found;
    value = graph.task(producer).inputs.at(0);
  }
  found.labels = value;
  return found;
}

TEST(SyntheticInputs, MaskedLanguageModelLabelsCountAtTheGivenShare) {
  const MaskedLoss loss = masked_loss(bert());
  ASSERT_GE(loss.labels, 0);
  const Value& labels = bert().value(loss.labels);
  constexpr std::int64_t kBatch = 64;
  for (const double share : {0.15, 0.5}) {
    std::mt19937_64 generator(7);
    const std::map<std::string, double> shares{{kBertMaskedLanguageModelLoss, share}};
    const LabelCounts counts =
        count(integers(profile::synthetic_input(bert(), labels, kBatch, shares, generator)), loss.ignore_index, loss.classes);
    const double n = static_cast<double>(counts.ignored + counts.in_range + counts.out_of_range);
    ASSERT_GT(n, 1000.0);
    EXPECT_EQ(counts.out_of_range, 0);
    const double standard_deviation = std::sqrt(share * (1 - share) / n);
    EXPECT_NEAR(static_cast<double>(counts.in_range) / n, share, 6 * standard_deviation) << "share " << share;
  }
}

TEST(SyntheticInputs, LossesNotNamedCountEveryLabel) {
  const MaskedLoss loss = masked_loss(bert());
  ASSERT_GE(loss.labels, 0);
  std::mt19937_64 generator(7);
  const std::map<std::string, double> other{{"another.loss", 0.15}};
  const LabelCounts counts = count(integers(profile::synthetic_input(bert(), bert().value(loss.labels), 16, other, generator)),
                                   loss.ignore_index, loss.classes);
  EXPECT_EQ(counts.ignored, 0);
  EXPECT_EQ(counts.out_of_range, 0);
  EXPECT_GT(counts.in_range, 0);
}

TEST(SyntheticInputs, ShareZeroIgnoresEveryLabelAndOneNone) {
  const MaskedLoss loss = masked_loss(bert());
  ASSERT_GE(loss.labels, 0);
  for (const double share : {0.0, 1.0}) {
    std::mt19937_64 generator(3);
    const LabelCounts counts =
        count(integers(profile::synthetic_input(bert(), bert().value(loss.labels), 8,
                                                {{kBertMaskedLanguageModelLoss, share}}, generator)),
              loss.ignore_index, loss.classes);
    EXPECT_EQ(counts.in_range == 0, share == 0.0) << share;
    EXPECT_EQ(counts.ignored == 0, share == 1.0) << share;
    EXPECT_EQ(counts.out_of_range, 0);
  }
}

// Integer inputs read by a Gather index its table's rows: token ids below the vocabulary, token
// types below the type table's rows; also in a trimmed graph where they arrive as inputs.
TEST(SyntheticInputs, TokenIdsIndexTheirTables) {
  std::mt19937_64 generator(11);
  int checked = 0;
  for (const Value& value : bert().values()) {
    if (value.kind != ValueKind::Input || (value.type.dtype != DType::I32 && value.type.dtype != DType::I64)) continue;
    std::int64_t rows = 0;
    for (int consumer : value.consumers) {
      const Task& task = bert().task(consumer);
      if (task.op == OpType::Gather && task.inputs.at(1) == value.id) rows = bert().value(task.inputs[0]).type.shape.at(0);
    }
    if (rows == 0) continue;
    const LabelCounts counts = count(integers(profile::synthetic_input(bert(), value, 4, {}, generator)), -1, rows);
    EXPECT_EQ(counts.out_of_range, 0) << value.name;
    EXPECT_EQ(counts.ignored, 0) << value.name;
    ++checked;
  }
  EXPECT_GE(checked, 2);  // token ids and token types
}

}  // namespace
}  // namespace partrain
