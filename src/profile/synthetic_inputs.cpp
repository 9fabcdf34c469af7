#include "profile/synthetic_inputs.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/float16.h"

namespace partrain::profile {

namespace {

constexpr std::int64_t kUnbounded = std::numeric_limits<std::int64_t>::max();

bool is_shape_op(OpType op) {
  return op == OpType::Reshape || op == OpType::Permute || op == OpType::Slice || op == OpType::Concat ||
         op == OpType::Split;
}

// Calls visit(task, k) for every task that reads `value` as its input k, following shape ops (which
// copy elements) to the tasks that read their outputs; the shape ops themselves are not visited.
template <typename Visit>
void visit_readers(const Graph& graph, int value, Visit&& visit, int depth = 0) {
  if (depth > 64) return;
  for (int consumer : graph.value(value).consumers) {
    const Task& task = graph.task(consumer);
    for (std::size_t k = 0; k < task.inputs.size(); ++k) {
      if (task.inputs[k] != value) continue;
      if (is_shape_op(task.op))
        for (int output : task.outputs) visit_readers(graph, output, visit, depth + 1);
      else
        visit(task, k);
    }
  }
}

// The number of valid values of an integer value: the smallest range its readers accept (Gather
// indices: table rows; SoftmaxCrossEntropy labels: classes). kUnbounded when no reader bounds it.
std::int64_t index_limit(const Graph& graph, int value) {
  std::int64_t limit = kUnbounded;
  visit_readers(graph, value, [&](const Task& task, std::size_t k) {
    if (task.op == OpType::Gather && k == 1) limit = std::min(limit, graph.value(task.inputs[0]).type.shape.at(0));
    if (task.op == OpType::SoftmaxCrossEntropy && k == 1) {
      const Shape& logits = graph.value(task.inputs[0]).type.shape;
      if (!logits.empty() && logits.back() > 0) limit = std::min(limit, logits.back());
    }
  });
  return limit;
}

// The loss task (SoftmaxCrossEntropy or VocabParallelCrossEntropy) that reads `value` as its labels;
// nullptr when none does.
const Task* label_loss(const Graph& graph, int value) {
  const Task* loss = nullptr;
  visit_readers(graph, value, [&](const Task& task, std::size_t k) {
    if (!loss && k == 1 && (task.op == OpType::SoftmaxCrossEntropy || task.op == OpType::VocabParallelCrossEntropy))
      loss = &task;
  });
  return loss;
}

// True when the value is an additive attention mask (Attention input 3, Softmax input 1): zeros.
bool is_attention_mask(const Graph& graph, int value) {
  for (int consumer : graph.value(value).consumers) {
    const Task& task = graph.task(consumer);
    if (task.op == OpType::Attention && task.inputs.size() > 3 && task.inputs[3] == value) return true;
    if (task.op == OpType::Softmax && task.inputs.size() > 1 && task.inputs[1] == value) return true;
  }
  return false;
}

}  // namespace

Tensor synthetic_input(const Graph& graph, const Value& value, std::int64_t batch,
                       const std::map<std::string, double>& counted_label_shares, std::mt19937_64& generator) {
  const Shape shape = with_batch(value.type.shape, batch);
  const std::int64_t count = numel(shape);
  switch (value.type.dtype) {
    case DType::I32:
    case DType::I64: {
      const std::int64_t limit = index_limit(graph, value.id);
      std::vector<std::int64_t> data(static_cast<std::size_t>(count), 0);
      if (limit != kUnbounded && limit > 0) {
        std::uniform_int_distribution<std::int64_t> distribution(0, limit - 1);
        for (auto& x : data) x = distribution(generator);
      }
      if (const Task* loss = label_loss(graph, value.id)) {
        const auto found = counted_label_shares.find(loss->name);
        if (found != counted_label_shares.end() && found->second < 1) {
          const std::int64_t ignore_index = loss->attributes.get_int("ignore_index", -100);
          std::uniform_real_distribution<double> uniform(0.0, 1.0);
          for (auto& x : data)
            if (uniform(generator) >= found->second) x = ignore_index;
        }
      }
      if (value.type.dtype == DType::I64) return Tensor::from_vector<std::int64_t>(shape, data);
      return Tensor::from_vector<std::int32_t>(shape, std::vector<std::int32_t>(data.begin(), data.end()));
    }
    case DType::F32:
    case DType::BF16:
    case DType::F16: {
      std::vector<float> data(static_cast<std::size_t>(count), 0.0f);
      if (!is_attention_mask(graph, value.id)) {
        std::normal_distribution<float> distribution(0.0f, 1.0f);
        for (auto& x : data) x = distribution(generator);
      }
      if (value.type.dtype == DType::F32) return Tensor::from_vector<float>(shape, data);
      if (value.type.dtype == DType::F16)
        return Tensor::from_vector<Float16>(shape, std::vector<Float16>(data.begin(), data.end()));
      return Tensor::from_vector<BFloat16>(shape, std::vector<BFloat16>(data.begin(), data.end()));
    }
  }
  PARTRAIN_FAIL("profiler: input '" << value.name << "' has an unsupported dtype " << dtype_name(value.type.dtype));
}


}  // namespace partrain::profile
