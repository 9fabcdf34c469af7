#include "support/executor_fixtures.h"

#include <cstring>

#include "graph/subgraph.h"
#include "kernels/cpu/cpu_backend.h"
#include "support/gradient_check.h"

namespace partrain::testing {

TinyClassifier::TinyClassifier() {
  x = graph.add_input("x", {kBatch, 4});
  labels = graph.add_label("labels", {kBatch});
  w1 = graph.add_parameter("w1", {6, 4});
  b1 = graph.add_parameter("b1", {6});
  w2 = graph.add_parameter("w2", {3, 6});
  b2 = graph.add_parameter("b2", {3});
  hidden = graph.add(OpType::Gemm, "hidden", {x, w1, b1});
  dropped = graph.add(OpType::Dropout, "dropped", {hidden}, Attributes().set("p", 0.25));
  activated = graph.add(OpType::Tanh, "activated", {dropped});
  logits = graph.add(OpType::Gemm, "logits", {activated, w2, b2});
  loss = graph.add(OpType::SoftmaxCrossEntropy, "loss", {logits, labels});
  graph.mark_output(loss);
}

std::vector<int> TinyClassifier::first_tasks() const {
  return {graph.value(hidden).producer, graph.value(dropped).producer};
}

std::vector<int> TinyClassifier::second_tasks() const {
  return {graph.value(activated).producer, graph.value(logits).producer, graph.value(loss).producer};
}

std::unordered_map<int, Tensor> TinyClassifier::initial_values() const {
  return {{w1, normal_tensor({6, 4}, 11, 0.5f)},
          {b1, normal_tensor({6}, 12, 0.1f)},
          {w2, normal_tensor({3, 6}, 13, 0.5f)},
          {b2, normal_tensor({3}, 14, 0.1f)}};
}

TinyClassifierData::TinyClassifierData()
    : x_(normal_tensor({32, 4}, 21)), labels_(index_tensor({32}, 3, 22)) {}

io::NamedTensors TinyClassifierData::samples(std::int64_t first, std::int64_t count) const {
  Tensor x = Tensor::zeros({count, 4});
  Tensor labels = Tensor::zeros({count}, DType::I64);
  for (std::int64_t i = 0; i < count; ++i) {
    const std::int64_t row = (first + i) % 32;
    std::memcpy(x.data<float>() + i * 4, x_.data<float>() + row * 4, 4 * sizeof(float));
    labels.data<std::int64_t>()[i] = labels_.data<std::int64_t>()[row];
  }
  return {{"x", x}, {"labels", labels}};
}

Plan tiny_plan(const TinyClassifier& model, const std::vector<std::vector<int>>& stages,
               const std::vector<int>& replicas, std::int64_t global_batch, int microbatches,
               const std::string& optimizer) {
  Plan plan;
  plan.planner = "test";
  plan.graph_hash = model.graph.hash();
  plan.global_batch = global_batch;
  plan.microbatches = microbatches;
  plan.optimizer = optimizer;
  plan.optimizer_state_copies = state_copies_of_optimizer(optimizer);
  plan.world_size = 0;
  for (std::size_t s = 0; s < stages.size(); ++s) {
    PlanStage stage;
    stage.tasks = stages[s];
    stage.replicas = replicas[s];
    plan.stages.push_back(stage);
    plan.world_size += replicas[s];
  }
  plan.validate(model.graph);
  return plan;
}

RandomContext sample_random(std::uint64_t seed, std::int64_t step, std::int64_t first_sample) {
  RandomContext random;
  random.seed = seed;
  random.step = static_cast<std::uint32_t>(step);
  random.first_sample = static_cast<std::uint32_t>(first_sample);
  return random;
}

TensorMap reference_forward(const TinyClassifier& model, const TinyClassifierData& data,
                            const std::unordered_map<int, Tensor>& parameters, std::uint64_t seed,
                            std::int64_t step, std::int64_t global_batch, std::int64_t first, std::int64_t count) {
  TensorMap values(parameters.begin(), parameters.end());
  const io::NamedTensors batch = data.samples(step * global_batch + first, count);
  values[model.x] = batch.at("x");
  values[model.labels] = batch.at("labels");
  ExecutionOptions options;
  options.training = true;
  options.random = sample_random(seed, step, first);
  run_forward(model.graph, whole_graph(model.graph), values, cpu_backend(), options);
  return values;
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

}  // namespace partrain::testing
