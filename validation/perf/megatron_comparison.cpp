// Megatron-LM comparison (issue 25 item 4; validation/perf/README.md §Megatron-LM's measured
// throughput). Not a test: it prints predictions beside published measurements.
//
// For each GPT of Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
// Using Megatron-LM" (SC'21), Table 1 — with the layout those runs used, as NVIDIA's artifact
// examples/sc21/run_table_1.sh gives it (t, p, micro-batch, global batch, interleaving, per-layer
// recomputation) — the analytic cost model with the a100-80gb preset predicts the step time of
// that layout (manual planner, 1F1B or interleaved 1F1B), from which the TFLOP/s per GPU follow by
// the paper's own count (§5.1: 96·B·s·l·h²·(1 + s/6h + V/16lh) FLOPs per iteration, recomputation
// included). Beside them: what they measured, the ratio, and the automatic plan (make_3d_plan:
// rannc with t, ZeRO, sequence parallelism and the activation policy chosen) for the same model
// and GPUs, its samples/s against the layout's under the same cost model.
//
// Attention is built unfused, as Megatron-LM ran it in 2021 (a batched GEMM with the 1/√d scale as
// its alpha, softmax, dropout, batched GEMM, the scores through memory in each); `--fused-attention` builds partrain's fused
// Attention op (no attention dropout) instead.
//
// `--choose-interleaving` lets the automatic plan's rannc choose the interleaving degree too
// (schedule = "interleaved", virtual_stages = "auto"; docs/planning.md, RaNNC).
//
// `--gemm-tflops X` prices a large, well-shaped GEMM at X TFLOP/s instead of the preset's (the best
// bf16 matmul over shapes with CUDA 12.1): the GEMM rate of another software generation, from a
// GEMM-level measurement, applied to every row alike (validation/perf/README.md says which).
//
// Usage: megatron_comparison [--fused-attention] [--no-automatic] [--choose-interleaving] [--rows N] [--model NAME]
//        [--breakdown] [--gemm-tflops X]
// (--model 529.6B: that row of the table only; --breakdown: each op type's kernel seconds under the row)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "graph/tensor_parallel.h"
#include "io/device_presets.h"
#include "models/model.h"
#include "partition/common/cost_model.h"
#include "partition/common/kernel_timing.h"
#include "partition/planner.h"
#include "plan/plan.h"

namespace {

using namespace partrain;

struct TableOneRow {
  const char* name;
  std::int64_t heads, hidden, layers;
  int tensor_parallel, pipeline_stages, gpus;
  std::int64_t microbatch, global_batch;
  int layers_per_virtual_stage;  // 0: plain 1F1B
  bool torch_ddp;                // DDP=torch (bucketed all-reduce overlapping the backward); else local (after it)
  double measured_tflops;        // per GPU, Table 1
};

// Table 1 of Narayanan et al. SC'21 (vocabulary 51,200, sequence 2048) with run_table_1.sh's layouts.
const TableOneRow kTableOne[] = {
    {"1.7B", 24, 2304, 24, 1, 1, 32, 16, 512, 0, true, 137},
    {"3.6B", 32, 3072, 30, 2, 1, 64, 16, 512, 0, true, 138},
    {"7.5B", 32, 4096, 36, 4, 1, 128, 16, 512, 0, true, 142},
    {"18.4B", 48, 6144, 40, 8, 1, 256, 8, 1024, 0, true, 135},
    {"39.1B", 64, 8192, 48, 8, 2, 512, 4, 1536, 0, false, 138},
    {"76.1B", 80, 10240, 60, 8, 4, 1024, 2, 1792, 5, false, 140},
    {"145.6B", 96, 12288, 80, 8, 8, 1536, 2, 2304, 5, false, 148},
    {"310.1B", 128, 16384, 96, 8, 16, 1920, 1, 2160, 3, false, 155},
    {"529.6B", 128, 20480, 105, 8, 35, 2520, 1, 2520, 1, false, 163},
    {"1008.0B", 160, 25600, 128, 8, 64, 3072, 1, 3072, 0, false, 163},
};

constexpr std::int64_t kVocabulary = 51200;
constexpr std::int64_t kSequence = 2048;

Graph gpt_of(const TableOneRow& row, bool fused_attention) {
  ModelConfig config;
  config.type = "gpt";
  config.layers = row.layers;
  config.hidden = row.hidden;
  config.heads = row.heads;
  config.vocab = kVocabulary;
  config.max_position = kSequence;
  config.seq_len = kSequence;
  config.dropout = 0.1;
  config.fused_attention = fused_attention;
  return build_model(config);
}

// The a100-80gb preset; `gemm_flops` > 0 replaces the rate of a large, well-shaped GEMM (FLOP/s).
partition::DeviceSpec a100(double gemm_flops) {
  DevicePreset preset = *find_device_preset("a100-80gb");
  if (gemm_flops > 0) preset.gemm_efficiency = gemm_flops / preset.peak_bf16_flops;
  partition::DeviceSpec device;
  device.flops_per_second = preset.peak_bf16_flops * preset.gemm_efficiency;
  device.memory_bytes = preset.memory_bytes;
  device.link_bandwidth = preset.link_bandwidth;
  device.network_bandwidth = preset.network_bandwidth;
  device.devices_per_node = preset.devices_per_node;
  device.link_latency = preset.link_latency;
  device.kernels.peak_flops = preset.peak_bf16_flops;
  device.kernels.gemm_efficiency = preset.gemm_efficiency;
  device.kernels.memory_bandwidth = preset.memory_bandwidth;
  device.kernels.memory_efficiency = preset.memory_efficiency;
  device.kernels.multiprocessors = preset.multiprocessors;
  device.kernels.kernel_seconds = preset.kernel_seconds;
  return device;
}

// FLOPs of one iteration as Narayanan et al. count them (§5.1, with activation recomputation).
double megatron_flops(const TableOneRow& row) {
  const double b = static_cast<double>(row.global_batch), s = kSequence, l = static_cast<double>(row.layers);
  const double h = static_cast<double>(row.hidden), v = kVocabulary;
  return 96.0 * b * s * l * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * l * h));
}

partition::PlannerOptions layout_options(const TableOneRow& row) {
  partition::PlannerOptions options;
  options.planner = "uniform";
  options.world_size = row.gpus;
  options.stages = row.pipeline_stages;
  options.tensor_parallel = row.tensor_parallel;
  options.zero = 0;
  options.global_batch = row.global_batch;
  const int data_parallel = row.gpus / (row.tensor_parallel * row.pipeline_stages);
  options.microbatches = static_cast<int>(row.global_batch / (data_parallel * row.microbatch));
  if (row.layers_per_virtual_stage > 0) {
    options.schedule = ScheduleKind::Interleaved;
    options.virtual_stages = static_cast<int>(row.layers / row.pipeline_stages / row.layers_per_virtual_stage);
  }
  options.mixed_precision = true;  // their fp16 moves the same bytes as our bf16
  options.optimizer = "adamw";
  options.optimizer_state_copies = 2;
  options.recompute = "layers";  // --recompute-method uniform, one layer per checkpoint
  if (row.torch_ddp) options.overlap_bucket_bytes = 25.0 * (1 << 20);  // PyTorch DDP's bucket_cap_mb
  options.memory_margin = 0;
  return options;
}

// Where a layout's predicted seconds go: each op type's kernel seconds for one microbatch on one GPU
// (forward, backward; the whole rank's graph, all layers), the tensor-parallel all-reduces apart.
void print_breakdown(const Graph& graph, const TableOneRow& row, const partition::DeviceSpec& device) {
  std::map<std::string, std::pair<double, double>> by_op;
  std::vector<int> all;
  for (const Task& task : graph.tasks()) {
    const auto [forward, backward] = partition::task_kernel_seconds(graph, task.id, row.microbatch, device.kernels, 2.0);
    auto& sums = by_op[std::string(op_name(task.op))];
    sums.first += forward;
    sums.second += backward;
    all.push_back(task.id);
  }
  double forward_total = 0, backward_total = 0;
  std::printf("  %s, one microbatch of %lld on one GPU (ms):\n  | op | forward | backward |\n  |---|---|---|\n", row.name,
              static_cast<long long>(row.microbatch));
  for (const auto& [name, sums] : by_op) {
    if (sums.first + sums.second <= 0) continue;
    std::printf("  | %s | %.2f | %.2f |\n", name.c_str(), 1e3 * sums.first, 1e3 * sums.second);
    forward_total += sums.first;
    backward_total += sums.second;
  }
  const partition::TensorParallelTraffic traffic = partition::tensor_parallel_traffic(graph, all, row.microbatch, true);
  std::printf("  | all kernels | %.2f | %.2f |\n", 1e3 * forward_total, 1e3 * backward_total);
  std::printf("  | tensor-parallel all-reduces | %.2f | %.2f |\n",
              1e3 * partition::tensor_parallel_allreduce_seconds(device, row.tensor_parallel, traffic.forward_bytes,
                                                                 traffic.forward_allreduces),
              1e3 * partition::tensor_parallel_allreduce_seconds(device, row.tensor_parallel, traffic.backward_bytes,
                                                                 traffic.backward_allreduces));
}

}  // namespace

int main(int argc, char** argv) {
  bool fused_attention = false, automatic = true, choose_interleaving = false, breakdown = false;
  double gemm_tflops = 0;
  std::size_t rows = std::size(kTableOne);
  std::string only_model;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--fused-attention")) fused_attention = true;
    else if (!std::strcmp(argv[i], "--no-automatic")) automatic = false;
    else if (!std::strcmp(argv[i], "--choose-interleaving")) choose_interleaving = true;
    else if (!std::strcmp(argv[i], "--breakdown")) breakdown = true;
    else if (!std::strcmp(argv[i], "--rows") && i + 1 < argc) rows = std::stoul(argv[++i]);
    else if (!std::strcmp(argv[i], "--model") && i + 1 < argc) only_model = argv[++i];
    else if (!std::strcmp(argv[i], "--gemm-tflops") && i + 1 < argc && (gemm_tflops = std::atof(argv[++i])) > 0) continue;
    else {
      std::fprintf(stderr, "usage: megatron_comparison [--fused-attention] [--no-automatic] [--choose-interleaving] "
                           "[--rows N] [--model NAME] [--breakdown] [--gemm-tflops X]\n");
      return 2;
    }
  }
  try {
    const partition::DeviceSpec device = a100(gemm_tflops * 1e12);
    std::printf("devices: a100-80gb preset, GEMMs at %.1f TFLOP/s, %s attention\n",
                device.kernels.peak_flops * device.kernels.gemm_efficiency / 1e12,
                fused_attention ? "fused" : "unfused (Megatron-LM 2021)");
    std::printf("| model | t | p | v | GPUs | micro | batch | predicted s/iter | predicted TFLOP/s | measured | "
                "predicted / measured | bubble | automatic plan | automatic / layout |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (std::size_t r = 0; r < rows && r < std::size(kTableOne); ++r) {
      const TableOneRow& row = kTableOne[r];
      if (!only_model.empty() && only_model != row.name) continue;
      const Graph model = gpt_of(row, fused_attention);
      const Graph graph = row.tensor_parallel > 1 ? tensor_parallel_graph(model, row.tensor_parallel) : model;
      const auto cost = partition::make_analytic_cost_model(graph, device, /*mixed_precision=*/true);
      const partition::PlannerOptions options = layout_options(row);
      const Plan layout = partition::make_plan(graph, *cost, options);
      const double tflops = megatron_flops(row) / layout.predicted_step_seconds / row.gpus / 1e12;
      std::string automatic_text = "-", ratio_text = "-";
      if (automatic) {
        partition::PlannerOptions search = options;
        search.planner = "rannc";
        search.stages = 0;
        search.tensor_parallel = 0;
        search.zero = -1;
        search.choose_sequence_parallel = true;
        search.microbatches = 0;
        search.schedule = choose_interleaving ? ScheduleKind::Interleaved : ScheduleKind::OneForwardOneBackward;
        search.virtual_stages = choose_interleaving ? 0 : 1;
        search.recompute = "auto";
        search.max_microbatches = 512;
        search.overlap_bucket_bytes = 25.0 * (1 << 20);  // partrain's bucketed all-reduce on NCCL
        const auto start = std::chrono::steady_clock::now();
        const partition::ThreeDimensionalPlan found = partition::make_3d_plan(
            model, [&device](const Graph& g) { return partition::make_analytic_cost_model(g, device, true); }, search);
        const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const Plan& plan = found.plan;
        char text[200];
        char chunks[32] = "";
        if (plan.virtual_stages > 1) std::snprintf(chunks, sizeof chunks, " (v %d)", plan.virtual_stages);
        std::snprintf(text, sizeof text, "t %d%s, zero %d, %d stages%s x %d replicas x %d pipelines, %d x %lld samples, %s, %.1f s planning",
                      plan.tensor_parallel, plan.sequence_parallel ? " sp" : "", plan.zero, plan.pipeline_stages(), chunks,
                      plan.stages[0].replicas, plan.pipeline_replicas, plan.microbatches, static_cast<long long>(plan.microbatch_size()),
                      recompute_name(plan.stages[0].recompute), wall);
        automatic_text = text;
        std::snprintf(text, sizeof text, "%.3f", plan.predicted_samples_per_second() / layout.predicted_samples_per_second());
        ratio_text = text;
      }
      std::printf("| %s | %d | %d | %d | %d | %lld | %lld | %.2f | %.1f | %.0f | %.3f | %.1f %% | %s | %s |\n", row.name,
                  row.tensor_parallel, row.pipeline_stages, options.virtual_stages, row.gpus,
                  static_cast<long long>(row.microbatch), static_cast<long long>(row.global_batch),
                  layout.predicted_step_seconds, tflops, row.measured_tflops, tflops / row.measured_tflops,
                  100 * layout.predicted_bubble_fraction, automatic_text.c_str(), ratio_text.c_str());
      if (breakdown) print_breakdown(graph, row, device);
      std::fflush(stdout);
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "megatron_comparison: %s\n", error.what());
    return 1;
  }
  return 0;
}
