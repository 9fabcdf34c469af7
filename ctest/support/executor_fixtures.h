#pragma once
// A tiny classifier and everything a PipelineExecutor needs to run it (a plan, data, initial
// values), for the tests of the executor's actions (unit: one rank; mpi: two ranks) and the
// interpreter-level references they compare against.
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "graph/graph.h"
#include "graph/interpreter.h"
#include "io/batch_source.h"
#include "plan/plan.h"

namespace partrain::testing {

/// logits = Gemm(Tanh(Dropout(Gemm(x, w1, b1), p = 0.25)), w2, b2); loss = SoftmaxCrossEntropy(logits,
/// labels). x is [B, 4] f32, labels [B] i64 in [0, 3), hidden width 6. The dropout makes every
/// pass depend on its random context (the step and the samples' indices).
struct TinyClassifier {
  Graph graph;
  int x = -1, labels = -1, w1 = -1, b1 = -1, w2 = -1, b2 = -1;
  int hidden = -1, dropped = -1, activated = -1, logits = -1, loss = -1;
  TinyClassifier();
  /// The tasks producing hidden and dropped (stage 0 of the two-stage plan) and the others.
  std::vector<int> first_tasks() const;
  std::vector<int> second_tasks() const;
  /// Reproducible initial values of w1, b1, w2, b2 (host, f32).
  std::unordered_map<int, Tensor> initial_values() const;
};

/// In-memory samples: sample g of the stream is row g mod 32 of fixed random x and labels.
class TinyClassifierData final : public io::BatchSource {
 public:
  TinyClassifierData();
  io::NamedTensors samples(std::int64_t first, std::int64_t count) const override;
  std::int64_t samples_per_epoch() const override { return 32; }
  std::int64_t tokens_per_sample() const override { return 0; }
  const std::string& path() const override { return path_; }

 private:
  Tensor x_, labels_;
  std::string path_ = "tiny-classifier-data";
};

/// A one-pipeline plan of `model` over `stages` (task lists) with `replicas` each, `microbatches`
/// per step of `global_batch` samples, 1F1B, fp32 and `optimizer` ("adamw" or "sgd").
Plan tiny_plan(const TinyClassifier& model, const std::vector<std::vector<int>>& stages,
               const std::vector<int>& replicas, std::int64_t global_batch, int microbatches,
               const std::string& optimizer = "adamw");

/// The executor's random context of samples starting at `first_sample` of step `step` under `seed`
/// (PipelineExecutor keys dropout masks by the sample's index in the step).
RandomContext sample_random(std::uint64_t seed, std::int64_t step, std::int64_t first_sample);

/// The interpreter's training forward of `model` over samples [first, first + count) of step
/// `step` (of `global_batch` samples) of `data` with `parameters` (host), dropout keyed as the
/// executor does: every value of the graph.
TensorMap reference_forward(const TinyClassifier& model, const TinyClassifierData& data,
                            const std::unordered_map<int, Tensor>& parameters, std::uint64_t seed,
                            std::int64_t step, std::int64_t global_batch, std::int64_t first, std::int64_t count);

/// Bit-level equality of two host tensors (shape, dtype and every byte).
bool bitwise_equal(const Tensor& a, const Tensor& b);

}  // namespace partrain::testing
