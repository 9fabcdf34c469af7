// The profiler (profile/profiler.h) and the request assignment of distributed profiling on a tiny
// BERT. Timings are only checked for positivity (machine noise); sizes are checked exactly against
// hand-computed values.
#include <gtest/gtest.h>

#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "graph/autodiff.h"
#include "graph/subgraph.h"
#include "kernels/cpu/cpu_backend.h"
#include "models/model.h"
#include "partition/common/plan_builder.h"
#include "profile/distributed_profiler.h"
#include "profile/profiler.h"
#include "support/tiny_models.h"

namespace partrain {
namespace {

constexpr std::int64_t kHidden = 128, kSeq = 64, kVocab = 8000;

ModelConfig tiny_bert() { return testing::tiny_model_config("bert"); }

const Graph& bert() {
  static const Graph graph = build_model(tiny_bert());
  return graph;
}

std::vector<int> tasks_with_prefix(const Graph& graph, const std::string& prefix) {
  std::vector<int> ids;
  for (const Task& task : graph.tasks())
    if (task.name.starts_with(prefix)) ids.push_back(task.id);
  return ids;
}

std::vector<int> layer_tasks(int layer) {
  return tasks_with_prefix(bert(), "bert.encoder.layer." + std::to_string(layer) + ".");
}

std::vector<int> all_tasks(const Graph& graph) {
  std::vector<int> ids;
  for (const Task& task : graph.tasks()) ids.push_back(task.id);
  return ids;
}

profile::ProfilerOptions quick() {
  profile::ProfilerOptions options;
  options.warmup = 0;
  options.repeats = 1;
  return options;
}

TEST(Profiler, EncoderLayerFigures) {
  const std::vector<int> tasks = layer_tasks(0);
  ASSERT_FALSE(tasks.empty());
  const profile::Measurement m = profile::measure_task_set(bert(), tasks, 2, cpu_backend(), {});
  EXPECT_GT(m.forward_seconds, 0.0);
  EXPECT_GT(m.backward_seconds, 0.0);

  // Parameters: every Param the tasks read, counted once, 4 bytes per element.
  std::set<int> params;
  for (int t : tasks)
    for (int input : bert().task(t).inputs)
      if (bert().value(input).kind == ValueKind::Param) params.insert(input);
  std::int64_t elements = 0;
  for (int p : params) elements += numel(bert().value(p).type.shape);
  // 4 linears of H×H, two of H×4H, two LayerNorms (hand count).
  EXPECT_EQ(elements, 4 * (kHidden * kHidden + kHidden) + 2 * (kHidden * 512) + 512 + kHidden + 4 * kHidden);
  EXPECT_DOUBLE_EQ(m.parameter_bytes, 4.0 * static_cast<double>(elements));

  // One [B, S, H] f32 activation enters (the embeddings' output) and one leaves.
  EXPECT_DOUBLE_EQ(m.boundary_input_bytes, 4.0 * kHidden * kSeq * 2);
  EXPECT_DOUBLE_EQ(m.boundary_output_bytes, 4.0 * kHidden * kSeq * 2);

  // Activations scale exactly with the batch (no constant tasks in an encoder layer); the peak
  // holds at least the stored activations.
  const profile::Measurement m4 = profile::measure_task_set(bert(), tasks, 4, cpu_backend(), quick());
  EXPECT_GT(m.activation_bytes, 10 * 4.0 * kHidden * kSeq * 2);
  EXPECT_DOUBLE_EQ(m4.activation_bytes, 2 * m.activation_bytes);
  EXPECT_GE(m.peak_bytes, m.activation_bytes);
  EXPECT_DOUBLE_EQ(m4.parameter_bytes, m.parameter_bytes);
  EXPECT_DOUBLE_EQ(m4.boundary_input_bytes, 2 * m.boundary_input_bytes);
}

TEST(Profiler, PeakGrowsWithBatch) {
  const std::vector<int> tasks = layer_tasks(1);
  const profile::Measurement one = profile::measure_task_set(bert(), tasks, 1, cpu_backend(), quick());
  const profile::Measurement four = profile::measure_task_set(bert(), tasks, 4, cpu_backend(), quick());
  // Activation-dominated: roughly 4x (the fresh parameter gradients are the batch-independent part).
  EXPECT_GT(four.peak_bytes, 2.5 * one.peak_bytes) << one.peak_bytes << " -> " << four.peak_bytes;
  EXPECT_LT(four.peak_bytes, 4.5 * one.peak_bytes) << one.peak_bytes << " -> " << four.peak_bytes;
  // The per-sample part grows linearly within the allocator's rounding.
  EXPECT_GE(four.peak_bytes - one.peak_bytes, 3 * one.activation_bytes);
}

TEST(Profiler, LeavesAllocatorAccountingAsItWas) {
  CachingAllocator& allocator = cpu_backend().allocator();
  const std::vector<int> tasks = layer_tasks(0);  // builds the graph (and its constants) first
  const Tensor held = Tensor::zeros({1000});      // something live before
  const std::size_t before = allocator.current_bytes();
  profile::measure_task_set(bert(), tasks, 2, cpu_backend(), quick());
  EXPECT_EQ(allocator.current_bytes(), before);
  EXPECT_EQ(held.numel(), 1000);
}

/// The CPU backend's kernels and host operations, counting flush_caches calls.
class FlushCountingBackend final : public Backend {
 public:
  FlushCountingBackend() { register_cpu_kernels(*this); }
  Device device() const override { return cpu_device(); }
  std::string name() const override { return "flush-counting cpu"; }
  void synchronise() override {}
  void copy(const Tensor& destination, const Tensor& source) override { cpu_backend().copy(destination, source); }
  void fill_zero(const Tensor& tensor) override { cpu_backend().fill_zero(tensor); }
  void accumulate(const Tensor& accumulator, const Tensor& value) override { cpu_backend().accumulate(accumulator, value); }
  void convert(const Tensor& destination, const Tensor& source) override { cpu_backend().convert(destination, source); }
  double sum_of_squares(std::span<const Tensor> tensors, std::span<const double> weights) override {
    return cpu_backend().sum_of_squares(tensors, weights);
  }
  void scale(const Tensor& tensor, double factor) override { cpu_backend().scale(tensor, factor); }
  void adamw_update(const Tensor& parameter, const Tensor& gradient, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                    const AdamWUpdate& update) override {
    cpu_backend().adamw_update(parameter, gradient, exp_avg, exp_avg_sq, update);
  }
  void sgd_update(const Tensor& parameter, const Tensor& gradient, const Tensor& momentum_buffer,
                  const SgdUpdate& update) override {
    cpu_backend().sgd_update(parameter, gradient, momentum_buffer, update);
  }
  void flush_caches() override {
    ++flushes;
    cpu_backend().flush_caches();
  }
  void flush_private_caches() override {
    ++private_flushes;
    cpu_backend().flush_private_caches();
  }
  int flushes = 0, private_flushes = 0;
};

// Each timed repeat is a forward and backward each from flushed caches, then the same again warm
// (the cores' own caches flushed, the shared one kept; the warm-up passes need no flush); the flush
// buffers are not the allocator's, so the memory figures do not move.
TEST(Profiler, TimesEachPassFromFlushedCachesAndThenWarm) {
  const std::vector<int> tasks = layer_tasks(0);
  profile::ProfilerOptions options;
  options.warmup = 2;
  options.repeats = 3;
  FlushCountingBackend flushing;
  const profile::Measurement cold = profile::measure_task_set(bert(), tasks, 2, flushing, options);
  EXPECT_EQ(flushing.flushes, 2 * options.repeats);
  EXPECT_EQ(flushing.private_flushes, 2 * options.repeats);  // the warm passes: the cores' own caches
  options.flush_caches = false;
  FlushCountingBackend warm_backend;
  const profile::Measurement warm = profile::measure_task_set(bert(), tasks, 2, warm_backend, options);
  EXPECT_EQ(warm_backend.flushes, 0);
  EXPECT_EQ(warm_backend.private_flushes, 0);
  // The flushed profile also times each pass again with its data cached; the unflushed one has
  // nothing else to give.
  EXPECT_GT(cold.warm_forward_seconds, 0);
  EXPECT_LE(cold.warm_forward_seconds, cold.forward_seconds);
  EXPECT_GT(cold.warm_backward_seconds, 0);
  EXPECT_LE(cold.warm_backward_seconds, cold.backward_seconds);
  EXPECT_EQ(warm.warm_forward_seconds, warm.forward_seconds);
  EXPECT_EQ(warm.warm_backward_seconds, warm.backward_seconds);
  EXPECT_EQ(cold.peak_bytes, warm.peak_bytes);
  // A set whose weights and gradients exceed the rank's cache is never priced warm: no warm passes.
  options.flush_caches = true;
  options.warm_cache_bytes = 2 * cold.parameter_bytes - 1;
  FlushCountingBackend large_backend;
  const profile::Measurement large = profile::measure_task_set(bert(), tasks, 2, large_backend, options);
  EXPECT_EQ(large_backend.flushes, 2 * options.repeats);
  EXPECT_EQ(large_backend.private_flushes, 0);
  EXPECT_EQ(large.warm_forward_seconds, 0);
  EXPECT_EQ(large.warm_backward_seconds, 0);
  EXPECT_GT(large.forward_seconds, 0);
  EXPECT_EQ(cold.activation_bytes, warm.activation_bytes);
  EXPECT_GT(cold.forward_seconds, 0);
  EXPECT_GT(cold.backward_seconds, 0);
}

// The CPU's flush covers twice the largest data cache the kernel reports (an independent reading of
// /sys here), and leaves tensors and the allocator's figures alone.
TEST(CpuBackend, FlushCachesCoversTwiceTheLargestDataCache) {
  std::size_t largest = 0;
  for (int index = 0; index < 8; ++index) {
    const std::string directory = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::ifstream type_file(directory + "type"), size_file(directory + "size");
    std::string type;
    std::size_t kib = 0;
    char unit = 0;
    if (!(type_file >> type) || !(size_file >> kib >> unit) || type == "Instruction") continue;
    largest = std::max(largest, kib << (unit == 'M' ? 20 : 10));
  }
  if (largest == 0) GTEST_SKIP() << "this machine does not list its caches in /sys";
  EXPECT_EQ(last_level_cache_bytes(), largest);
  EXPECT_LT(private_cache_bytes(), last_level_cache_bytes());
  CachingAllocator& allocator = cpu_backend().allocator();
  const Tensor held = Tensor::full({1000}, 3.5f);
  const std::size_t before = allocator.current_bytes();
  cpu_backend().flush_caches();
  cpu_backend().flush_private_caches();
  EXPECT_EQ(allocator.current_bytes(), before);
  EXPECT_EQ(held.to_float_vector(), std::vector<float>(1000, 3.5f));
}

// ProfilerOptions::cpu_time's clock is the process's CPU time over its OpenMP threads, not the wall
// clock: across a 100 ms sleep and across 100 ms of spinning (however many other processes share
// the core) it moves as getrusage's CPU time does, divided by the threads. (Helper threads that
// spin count, as they do for getrusage: OpenBLAS's, unless OPENBLAS_NUM_THREADS=1 as
// jobscripts/mpi-env.sh sets.)
TEST(Profiler, CpuTimeClockCountsWorkNotWaiting) {
  const double threads = omp_get_max_threads();
  const auto rusage_seconds = [] {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
           1e-6 * static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec);
  };
  const auto expect_cpu_time = [&](const char* what, double start, double rusage_start) {
    const double counted = (profile::pass_clock_seconds(true) - start) * threads;
    const double used = rusage_seconds() - rusage_start;
    EXPECT_NEAR(counted, used, 0.1 * used + 0.005) << what;
  };
  double start = profile::pass_clock_seconds(true), begin = rusage_seconds();
  const double wall = profile::pass_clock_seconds(false);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_GE(profile::pass_clock_seconds(false) - wall, 0.1);
  expect_cpu_time("sleeping", start, begin);
  start = profile::pass_clock_seconds(true);
  begin = rusage_seconds();
  volatile double sink = 0;
  while (rusage_seconds() - begin < 0.1) sink = sink + 1.0;
  expect_cpu_time("spinning", start, begin);
}

TEST(Profiler, EmbeddingsHeadAndWholeModelGetValidInputs) {
  // Token ids, token types and labels must be in range, or the Gather / cross-entropy kernels throw.
  const profile::Measurement embeddings =
      profile::measure_task_set(bert(), tasks_with_prefix(bert(), "bert.embeddings."), 2, cpu_backend(), quick());
  EXPECT_DOUBLE_EQ(embeddings.boundary_input_bytes, 0.0);
  EXPECT_DOUBLE_EQ(embeddings.boundary_output_bytes, 4.0 * kHidden * kSeq * 2);
  EXPECT_GE(embeddings.parameter_bytes, 4.0 * kVocab * kHidden);

  const profile::Measurement whole = profile::measure_task_set(bert(), all_tasks(bert()), 1, cpu_backend(), quick());
  EXPECT_GT(whole.forward_seconds, 0.0);
  EXPECT_GT(whole.backward_seconds, 0.0);
  EXPECT_DOUBLE_EQ(whole.boundary_input_bytes, 0.0);
  EXPECT_DOUBLE_EQ(whole.boundary_output_bytes, 0.0);
  EXPECT_DOUBLE_EQ(whole.parameter_bytes, 4.0 * static_cast<double>(bert().parameter_count()));
}

// The profiler times the backward the executor runs for the same tasks (build_backward of the
// stage's subgraph): the same steps, each computing the same input gradients, and the gradients of
// the boundary activations sent back. Cut out of the model, a layer's input is an Input of the
// trimmed graph; a plain backward of the trimmed graph computes neither the loss's gradient of the
// logits nor any layer's input gradient, which priced a GPT stage's backward at a third of its time.
TEST(Profiler, TimesTheSameBackwardAsAStage) {
  for (const std::string type : {"gpt", "bert", "resnet"}) {
    const Graph graph = build_model(testing::tiny_model_config(type));
    const std::vector<partition::LayerGroup> groups = partition::layer_groups(graph);
    ASSERT_GE(groups.size(), 3u) << type;
    int with_input_gradients = 0;
    for (std::size_t first = 0; first < groups.size(); ++first) {
      for (std::size_t last = first + 1; last <= std::min(groups.size(), first + 2); ++last) {
        const std::vector<int> tasks = partition::join_groups(groups, first, last);
        const Subgraph stage = extract_subgraph(graph, tasks);
        const BackwardProgram executed = build_backward(graph, stage);
        const Graph trimmed = standalone_graph(graph, stage);
        const BackwardProgram profiled = standalone_backward(graph, stage, trimmed);
        const std::string where = type + " groups [" + groups[first].name + ", " + groups[last - 1].name + "]";
        ASSERT_EQ(profiled.steps.size(), executed.steps.size()) << where;
        for (std::size_t i = 0; i < executed.steps.size(); ++i) {
          EXPECT_EQ(trimmed.task(profiled.steps[i].task).name, graph.task(executed.steps[i].task).name) << where;
          EXPECT_EQ(profiled.steps[i].input_grad_needed, executed.steps[i].input_grad_needed) << where;
        }
        EXPECT_EQ(profiled.input_grads.size(), executed.input_grads.size()) << where;
        EXPECT_EQ(profiled.parameter_grads.size(), executed.parameter_grads.size()) << where;
        with_input_gradients += executed.input_grads.empty() ? 0 : 1;
      }
    }
    EXPECT_GT(with_input_gradients, 0) << type;
  }
}

// The loss alone (GPT's last group) has no parameters; its backward is the gradient of the logits,
// as expensive as its forward, not nothing.
TEST(Profiler, LossBackwardIsMeasured) {
  const Graph graph = build_model(testing::tiny_model_config("gpt"));
  const std::vector<partition::LayerGroup> groups = partition::layer_groups(graph);
  const profile::Measurement loss = profile::measure_task_set(graph, groups.back().tasks, 4, cpu_backend(), {});
  EXPECT_GT(loss.backward_seconds, 0.2 * loss.forward_seconds) << groups.back().name;
}

TEST(Profiler, RejectsBadArguments) {
  const std::vector<int> tasks = layer_tasks(0);
  EXPECT_THROW(profile::measure_task_set(bert(), tasks, 0, cpu_backend(), quick()), Error);
  profile::ProfilerOptions no_repeats = quick();
  no_repeats.repeats = 0;
  EXPECT_THROW(profile::measure_task_set(bert(), tasks, 1, cpu_backend(), no_repeats), Error);
  // Layer 0 and layer 1 without what lies between them (layer 0's output LayerNorm) is not convex.
  std::vector<int> gap = layer_tasks(0);
  const std::vector<int> one = layer_tasks(1);
  gap.pop_back();
  gap.insert(gap.end(), one.begin(), one.end());
  EXPECT_THROW(profile::measure_task_set(bert(), gap, 1, cpu_backend(), quick()), Error);
  EXPECT_THROW(profile::measure_task_set(bert(), std::vector<int>{}, 1, cpu_backend(), quick()), Error);
}

TEST(DistributedProfiler, AssignmentBalancesEstimatedCost) {
  std::vector<profile::ProfileRequest> requests;
  for (int layer = 0; layer < 2; ++layer)
    for (std::int64_t batch : {1, 2}) requests.push_back({layer_tasks(layer), batch});
  requests.push_back({tasks_with_prefix(bert(), "bert.embeddings."), 1});
  const std::vector<int> owner = profile::assign_requests(bert(), requests, 2);
  ASSERT_EQ(owner.size(), requests.size());
  EXPECT_EQ(owner, profile::assign_requests(bert(), requests, 2));  // deterministic
  double load[2] = {0, 0};
  for (std::size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(owner[i] == 0 || owner[i] == 1);
    load[owner[i]] += profile::estimated_request_cost(bert(), requests[i]);
  }
  // The two layers are equal: each rank gets one layer at batch 2 and one at batch 1.
  EXPECT_NEAR(load[0] / load[1], 1.0, 0.2);
  EXPECT_GT(profile::estimated_request_cost(bert(), requests[1]), profile::estimated_request_cost(bert(), requests[0]));
  EXPECT_THROW(profile::assign_requests(bert(), requests, 0), Error);
}

}  // namespace
}  // namespace partrain
