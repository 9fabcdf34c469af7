#include "graph/activation_checkpointing.h"

#include <algorithm>
#include <set>
#include <string>

#include "core/error.h"
#include "graph/layer_names.h"
#include "graph/saved_tensors.h"

namespace partrain {

namespace {
// The layer a task counts in: its name's, except for Megatron's f (TensorParallelCopy, or under
// sequence parallelism the all-gather that replaces it), named after the value it copies but run
// for its consumers — with it in the previous layer, that layer's output and its copy (or gathered
// whole sequence) would both be checkpoints of the next.
std::string layer_of_task(const Graph& graph, const Task& task) {
  const bool feeds_its_consumers = task.op == OpType::TensorParallelCopy || task.op == OpType::SequenceParallelAllGather;
  if (feeds_its_consumers && !graph.value(task.outputs[0]).consumers.empty())
    return layer_of(graph.task(graph.value(task.outputs[0]).consumers.front()).name);
  return layer_of(task.name);
}
}  // namespace

std::vector<std::vector<int>> layer_checkpoint_blocks(const Graph& graph, std::span<const int> tasks,
                                                      int layers_per_block) {
  PARTRAIN_CHECK(layers_per_block >= 1, "per-layer checkpointing: recompute_layers must be at least 1, not "
                                            << layers_per_block);
  std::vector<std::vector<int>> blocks;
  std::set<std::string> seen;
  int layers_in_block = 0;
  for (int task : tasks) {
    const std::string layer = layer_of_task(graph, graph.task(task));
    const bool new_layer = seen.insert(layer).second;
    if (blocks.empty() || (new_layer && layers_in_block == layers_per_block)) {
      blocks.emplace_back();
      layers_in_block = 0;
    }
    if (new_layer) ++layers_in_block;
    blocks.back().push_back(task);
  }
  return blocks;
}

namespace {
// The task producing `value`, when it is a non-constant task of kind `op`; −1 otherwise.
int producer_of_kind(const Graph& graph, int value, OpType op) {
  const int producer = graph.value(value).producer;
  return producer >= 0 && graph.task(producer).op == op ? producer : -1;
}

// The only consumer of `value` when it has exactly one and it is of kind `op`; −1 otherwise.
int only_consumer_of_kind(const Graph& graph, int value, OpType op) {
  const std::vector<int>& consumers = graph.value(value).consumers;
  return consumers.size() == 1 && graph.task(consumers[0]).op == op ? consumers[0] : -1;
}

// The first and last task of the attention core around Softmax task `softmax`, or {−1, −1}.
std::pair<int, int> attention_core(const Graph& graph, const Task& softmax) {
  // The scores MatMul carries the 1/√d scale as its alpha (layers::attention).
  const int scores = producer_of_kind(graph, softmax.inputs[0], OpType::MatMul);
  int probabilities = softmax.outputs[0];
  if (const int dropout = only_consumer_of_kind(graph, probabilities, OpType::Dropout); dropout >= 0)
    probabilities = graph.task(dropout).outputs[0];
  const int context = only_consumer_of_kind(graph, probabilities, OpType::MatMul);
  if (scores < 0 || context < 0) return {-1, -1};
  return {scores, context};
}
}  // namespace

std::vector<std::vector<int>> attention_core_segments(const Graph& graph, std::span<const int> tasks) {
  std::vector<std::vector<int>> segments;
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    const Task& task = graph.task(tasks[i]);
    if (task.op != OpType::Softmax || task.constant) continue;
    const auto [first, last] = attention_core(graph, task);
    const auto begin = std::find(tasks.begin(), tasks.end(), first);
    const auto end = std::find(tasks.begin(), tasks.end(), last);
    if (begin == tasks.end() || end == tasks.end() || end < begin) continue;
    segments.emplace_back(begin, end + 1);
  }
  return segments;
}

std::vector<int> segment_checkpoints(const Graph& graph, std::span<const int> segment) {
  const std::set<int> members(segment.begin(), segment.end());
  std::set<int> checkpoints;
  for (int id : segment)
    for (int input : graph.task(id).inputs) {
      const int producer = graph.value(input).producer;
      if (is_microbatch_value(graph, input) && (producer < 0 || !members.count(producer))) checkpoints.insert(input);
    }
  return {checkpoints.begin(), checkpoints.end()};
}

std::vector<int> tasks_outside_segments(std::span<const int> tasks, const std::vector<std::vector<int>>& segments) {
  std::set<int> inside;
  for (const std::vector<int>& segment : segments) inside.insert(segment.begin(), segment.end());
  std::vector<int> outside;
  for (int task : tasks)
    if (!inside.count(task)) outside.push_back(task);
  std::sort(outside.begin(), outside.end());
  return outside;
}

}  // namespace partrain
