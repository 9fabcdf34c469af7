// The design card's main test: a tiny model trained 10 steps on 4 ranks under a plan gives the same
// per-step losses (1e-5 relative) and final parameters (1e-4) as a single-rank run over the same
// loss pieces (gradient accumulation over the same sample groups: the last stage's replicas split
// each microbatch, and BERT's masked-token mean is taken per piece). Runs the real program under
// mpiexec on the real prepared data. Not a GoogleTest file of its own: built into
// test_distributed_training (registered with labels validation;mpi).
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/config.h"
#include "io/hdf5_file.h"
#include "graph/tensor_parallel.h"
#include "models/model.h"
#include "plan/plan.h"
#include "runtime/stage_program.h"
#include "partition/common/plan_builder.h"
#include "support/partrain_runs.h"

namespace partrain {
namespace {

struct TrainingCase {
  std::string model;                   // bert, gpt, resnet (configs/<model>-tiny.toml)
  std::string plan;                    // readable name
  std::string planner = "manual";
  std::vector<std::string> boundaries; // manual: first layer of stages 2..S
  std::vector<int> replicas;           // manual: replicas per stage
  std::string schedule = "1f1b";
  int virtual_stages = 1;              // interleaved: model chunks per pipeline rank (boundaries cut S·v chunks)
  std::string recompute = "none";      // [parallel] recompute of the run (manual plans)
  int tensor_parallel = 1;             // [parallel] tensor_parallel
  int zero = 0;                        // [parallel] zero
  bool sub_pipelined_tmp = false;      // [parallel] sub_pipelined_tmp
  bool sequence_parallel = false;      // [parallel] sequence_parallel
  int ranks = 4;                       // MPI ranks of the run
  int global_batch = 0;                // [train] global_batch of the run and its reference; 0: global_batch(model)
  std::vector<std::string> model_overrides;  // e.g. more heads, for the run and its single-rank reference
  std::vector<std::string> planner_settings; // for the run only (its reference is a fixed single-rank plan)
  bool expect_partial_recompute = false;     // the run's plan must recompute part of a stage (stage_aware)
  bool expect_interleaved = false;           // the run's plan must hold several model chunks per rank
};

std::string case_name(const TrainingCase& c) {
  const std::string recompute = c.recompute == "none"         ? ""
                                : c.recompute == "boundaries" ? "_recompute"
                                                              : "_recompute_" + c.recompute;
  return c.model + "_" + c.plan + "_" + c.schedule + recompute;
}

constexpr int kSteps = 10, kMicrobatches = 2;

// ResNet: 16 samples, so that BatchNorm normalises groups of at least 4 (over 2 samples, the
// 1x1 maps of layer4 make it degenerate and training chaotic: any rounding difference explodes).
int global_batch(const std::string& model) { return model == "resnet" ? 16 : 8; }

// The global batch of a case's run and of its single-rank reference.
int global_batch(const TrainingCase& c) { return c.global_batch > 0 ? c.global_batch : global_batch(c.model); }

// Distinguishes the single-rank references of cases that change the model, precision or batch.
std::string model_key(const TrainingCase& c) {
  std::string key = c.model;
  if (c.global_batch > 0) key += "_batch" + std::to_string(c.global_batch);
  for (const std::string& setting : c.model_overrides) key += "_" + setting;
  for (char& character : key)
    if (!std::isalnum(static_cast<unsigned char>(character)) && character != '_') character = '-';
  return key;
}

// Overrides that make the tiny models smaller still (seconds per run on 2 cores). ResNet trains
// with SGD: BatchNorm over small groups leaves many gradients at rounding level, and AdamW's first
// steps turn any such gradient into a full ±lr update whose sign is the rounding's.
std::vector<std::string> model_settings(const std::string& model) {
  if (model == "resnet") return {"model.base_width=8", "train.optimizer=sgd", "train.lr=0.002"};
  return {"model.seq_len=32"};
}

// Runs partrain train on `ranks` ranks; returns the output directory.
std::string run_training(const TrainingCase& c, int ranks, const std::string& directory, const std::vector<std::string>& extra,
                         const std::string& options = "") {
  std::ostringstream arguments;
  arguments << "train " << PARTRAIN_SOURCE_DIR << "/configs/" << c.model << "-tiny.toml"
            << " --set train.steps=" << kSteps << " --set train.global_batch=" << global_batch(c)
            << " --set log.dir=" << directory << " --set log.save_parameters=true --set train.eval_every=5"
            << " --set data.path=" << PARTRAIN_DATA_DIR << (c.model == "resnet" ? "/fashion_mnist.h5" : "/text.h5");
  for (const std::string& setting : model_settings(c.model)) arguments << " --set '" << setting << "'";
  for (const std::string& setting : c.model_overrides) arguments << " --set '" << setting << "'";
  for (const std::string& setting : extra) arguments << " --set '" << setting << "'";
  if (!options.empty()) arguments << " " << options;
  std::filesystem::create_directories(directory);
  const testing::PartrainRun run = testing::run_partrain(ranks, arguments.str(), directory + ".log");
  EXPECT_EQ(run.status, 0) << run.command << "\n" << run.log;
  return directory;
}

class DistributedTraining : public ::testing::TestWithParam<TrainingCase> {};

// The single-rank reference for `pieces` microbatches per step, shared by the cases of one ctest run
// that need it (made in a private directory, then renamed into place; a concurrent maker's copy is
// as good).
std::string reference_run(const TrainingCase& c, int pieces, const std::string& root) {
  const std::string directory = root + "/reference-" + model_key(c) + "-" + std::to_string(pieces);
  if (std::filesystem::exists(directory + "/parameters.h5")) return directory;
  const std::string temporary = directory + ".tmp" + std::to_string(::getpid());
  run_training(c, 1, temporary, {"parallel.planner=dpl", "train.microbatches=" + std::to_string(pieces),
                                 "parallel.recompute=none"});
  std::error_code error;
  std::filesystem::rename(temporary, directory, error);
  if (error) std::filesystem::remove_all(temporary);  // another process made it first
  return directory;
}

// Whether the ranks of the pipeline stage holding the last model chunk (the loss) of the plan in
// `distributed` can split their rows into Merak's sub-microbatches (as the executor decides).
bool loss_stage_can_sub_pipeline(const TrainingCase& c, const std::string& distributed) {
  const Plan plan = Plan::load(distributed + "/plan.json");
  std::vector<std::string> overrides = model_settings(c.model);
  overrides.insert(overrides.end(), c.model_overrides.begin(), c.model_overrides.end());
  const ExperimentConfig config =
      load_experiment(std::string(PARTRAIN_SOURCE_DIR) + "/configs/" + c.model + "-tiny.toml", overrides);
  const Graph model = build_model(config.model);
  const Graph graph =
      plan.tensor_parallel > 1 ? tensor_parallel_graph(model, plan.tensor_parallel, plan.sequence_parallel) : model;
  const std::vector<runtime::StageProgram> programs = runtime::build_stage_programs(graph, plan);
  std::vector<runtime::StageProgram> held;
  for (int chunk : plan.chunks_of_stage(plan.stage_of_chunk(static_cast<int>(plan.stages.size()) - 1)))
    held.push_back(programs[chunk]);
  return runtime::can_sub_pipeline(graph, held);
}

// bf16 runs (plan.json's precision) against the single-rank bf16 run. bf16 keeps 8 significant bits
// (7 stored and the implicit one), so its unit roundoff is u = 2^-8 ≈ 3.9e-3: one rounding moves a
// value by up to u relative, and two neighbouring bf16 values are one spacing, up to 2u = 2^-7, apart.
// The two runs differ only in the order of fp32 sums (gradient all-reduces, tensor-parallel partial
// sums, gradients accumulated across a pipeline cut), which changes a bf16 result only where the
// value lies within a few fp32 ulps of a rounding midpoint; that activation, gradient or working
// parameter then differs by one spacing. So the runs agree to bf16's resolution and no better:
// - every step's loss (an fp32 mean over the pieces' token losses, computed from bf16 logits) and
//   held-out loss within u relative: a bf16 computation knows no value more closely than that, and
//   a difference beyond it is not rounding;
// - the fp32 master weights by relative L2 distance over the model (as the bf16-vs-fp32 test
//   measures them) within one spacing, 2u: AdamW normalises each element's update, so an element
//   whose gradient is at bf16 rounding level gets steps of up to ±lr whose sign the rounding
//   decides, and the distance grows past a single rounding, but the bf16 copies the forward reads
//   stay within one spacing of the reference's on aggregate. A plan computing another gradient (a
//   piece dropped or counted twice) changes the updates of whole tensors, not of a few elements.
// Measured on 27 plans (seeds 1, 2, 4, 5, 7, 8, 10, 11 and 14 of each model, all trained in bf16):
// losses to 1.3e-4, parameters to 2.2e-3 (ResNet, with SGD: bitwise equal).
constexpr double kBf16LossTolerance = 0x1p-8, kBf16ParameterTolerance = 0x1p-7;

// Compares the run in `distributed` (its plan.json says how it split the batch) with the single-rank
// run over the same loss pieces: every step's loss within 1e-5 relative, the held-out losses, and the
// final parameters within 1e-4. Skips (with the reason) plans no single-rank run can mirror.
void expect_matches_single_rank(const TrainingCase& c, const std::string& distributed, const std::string& root) {
  // The loss pieces of the plan that ran: every pipeline replica's microbatches split over the last
  // stage's replicas. BatchNorm (ResNet) also needs the same grouping in every stage.
  const nlohmann::json plan = nlohmann::json::parse(std::ifstream(distributed + "/plan.json"));
  const int copies = plan.at("pipeline_replicas").get<int>(), microbatches = plan.at("microbatches").get<int>();
  const int last_replicas = plan.at("stages").back().at("replicas").get<int>();
  const int microbatch_size = global_batch(c) / (copies * microbatches);
  // Sub-pipelined TMP splits each replica's rows in two more loss pieces, on the ranks of the
  // pipeline stage holding the loss, if they can split (runtime::can_sub_pipeline).
  const int halves = plan.value("sub_pipelined_tmp", false) && microbatch_size / last_replicas >= 2 &&
                             loss_stage_can_sub_pipeline(c, distributed)
                         ? 2
                         : 1;
  if (microbatch_size % last_replicas != 0)
    GTEST_SKIP() << "the plan splits a microbatch of " << microbatch_size << " unevenly over " << last_replicas
                 << " replicas: no single-rank run has the same loss pieces";
  for (const nlohmann::json& stage : plan.at("stages"))
    if (c.model == "resnet" && stage.at("replicas").get<int>() != last_replicas)
      GTEST_SKIP() << "BatchNorm statistics: the plan groups samples differently in different stages";
  // The reason the ResNet planner cases cap the microbatch count (see planner_cases).
  if (c.model == "resnet" && microbatch_size / last_replicas < 4)
    GTEST_SKIP() << "BatchNorm over groups of " << microbatch_size / last_replicas
                 << " samples: training is chaotic, rounding differences explode";
  const std::string reference = reference_run(c, copies * microbatches * last_replicas * halves, root);

  const bool bf16 = plan.value("precision", "fp32") != "fp32";  // bf16, or fp16 (finer: the same bands hold)
  const double loss_tolerance = bf16 ? kBf16LossTolerance : 1e-5;
  const std::vector<double> expected = testing::metric_values(reference, "loss"), actual = testing::metric_values(distributed, "loss");
  ASSERT_EQ(expected.size(), static_cast<std::size_t>(kSteps));
  ASSERT_EQ(actual.size(), expected.size());
  double worst_loss = 0;
  for (std::size_t step = 0; step < expected.size(); ++step) {
    EXPECT_NEAR(actual[step], expected[step], loss_tolerance * std::abs(expected[step])) << "step " << step + 1;
    worst_loss = std::max(worst_loss, std::abs(actual[step] - expected[step]) / std::abs(expected[step]));
  }
  // Held-out evaluation every 5 steps (forward only, evaluation mode) through the same pipeline. Not
  // for ResNet with replicas: evaluation uses BatchNorm running statistics, which each replica
  // gathered from its own samples (averaged before evaluating), unlike one rank seeing all of them.
  const std::vector<double> expected_eval = testing::metric_values(reference, "eval_loss"), actual_eval = testing::metric_values(distributed, "eval_loss");
  ASSERT_EQ(expected_eval.size(), 2u);
  ASSERT_EQ(actual_eval.size(), expected_eval.size());
  const bool replicated_batch_norm = c.model == "resnet" && copies * last_replicas > 1;
  for (std::size_t i = 0; i < expected_eval.size() && !replicated_batch_norm; ++i)
    EXPECT_NEAR(actual_eval[i], expected_eval[i], loss_tolerance * std::abs(expected_eval[i])) << "evaluation " << i + 1;

  // Parameters (not BatchNorm running statistics: like DDP without SyncBatchNorm, each replica keeps
  // its own, and the file holds replica 0's).
  const io::Hdf5File expected_file = io::Hdf5File::open_read(reference + "/parameters.h5");
  const io::Hdf5File actual_file = io::Hdf5File::open_read(distributed + "/parameters.h5");
  int compared = 0;
  double difference = 0, norm = 0, worst_parameter = 0;  // over the whole model (bf16)
  for (const std::string& name : expected_file.dataset_names("model")) {
    if (name.ends_with("running_mean") || name.ends_with("running_var")) continue;
    ASSERT_TRUE(actual_file.has_dataset("model/" + name)) << name;
    const std::vector<float> a = actual_file.read<float>("model/" + name), e = expected_file.read<float>("model/" + name);
    ASSERT_EQ(a.size(), e.size()) << name;
    double worst = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      worst = std::max(worst, std::abs(double(a[i]) - e[i]));
      difference += (double(a[i]) - e[i]) * (double(a[i]) - e[i]);
      norm += double(e[i]) * e[i];
    }
    worst_parameter = std::max(worst_parameter, worst);
    if (!bf16) {
      EXPECT_LE(worst, 1e-4) << name;
    }
    ++compared;
  }
  EXPECT_GT(compared, 10);
  if (bf16) {
    const double relative = std::sqrt(difference / norm);
    std::printf("%s against one rank: worst step loss %.3g relative, parameters %.3g relative L2 (worst element %.3g)\n",
                plan.value("precision", std::string("fp32")).c_str(), worst_loss, relative, worst_parameter);
    EXPECT_LE(relative, kBf16ParameterTolerance) << "parameters, relative L2 distance over the model";
  }
}

TEST_P(DistributedTraining, MatchesSingleRankLossesAndParameters) {
  const TrainingCase& c = GetParam();
  const std::string root = PARTRAIN_RUN_DIR;  // emptied by the CTest fixture before each ctest run
  std::vector<std::string> settings = {"parallel.planner=" + c.planner, "parallel.schedule=" + c.schedule,
                                       "parallel.recompute=" + c.recompute};
  if (c.planner == "manual") {
    std::string replicas;
    for (int r : c.replicas) replicas += (replicas.empty() ? "" : ",") + std::to_string(r);
    std::string boundaries;
    for (const std::string& b : c.boundaries) boundaries += (boundaries.empty() ? "\"" : ",\"") + b + "\"";
    settings.push_back("parallel.stages=" + std::to_string(c.replicas.size()));
    settings.push_back("parallel.replicas=[" + replicas + "]");
    settings.push_back("parallel.boundaries=[" + boundaries + "]");
    settings.push_back("train.microbatches=" + std::to_string(kMicrobatches));
    settings.push_back("parallel.tensor_parallel=" + std::to_string(c.tensor_parallel));
    settings.push_back("parallel.zero=" + std::to_string(c.zero));
    settings.push_back(std::string("parallel.sub_pipelined_tmp=") + (c.sub_pipelined_tmp ? "true" : "false"));
    settings.push_back(std::string("parallel.sequence_parallel=") + (c.sequence_parallel ? "true" : "false"));
    settings.push_back("parallel.virtual_stages=" + std::to_string(c.virtual_stages));
  }
  settings.insert(settings.end(), c.planner_settings.begin(), c.planner_settings.end());
  const std::string distributed = root + "/" + case_name(c) + "-" + std::to_string(::getpid());
  run_training(c, c.ranks, distributed, settings);
  if (HasFailure()) return;
  if (c.expect_partial_recompute) {
    const nlohmann::json plan = nlohmann::json::parse(std::ifstream(distributed + "/plan.json"));
    int partial = 0;
    for (const nlohmann::json& stage : plan.at("stages")) partial += stage.at("recompute") == "stage_aware";
    ASSERT_GT(partial, 0) << "no stage of " << distributed << "/plan.json recomputes part of its layers: the "
                          << "device memory of this case no longer falls between keeping and recomputing them";
  }
  if (c.expect_interleaved) {
    const nlohmann::json plan = nlohmann::json::parse(std::ifstream(distributed + "/plan.json"));
    ASSERT_GE(plan.value("virtual_stages", 1), 2)
        << distributed << "/plan.json is not interleaved: the planner no longer predicts interleaving faster for this case";
  }

  expect_matches_single_rank(c, distributed, root);
  std::filesystem::remove_all(distributed);
}

// Every manual layout x schedule x recompute combination; `core` picks the default subset.
std::vector<TrainingCase> manual_cases(bool core) {
  std::vector<TrainingCase> result;
  struct Layout {
    std::string name;
    std::vector<int> replicas;
  };
  // Boundaries per model for 2 stages x 2 replicas, 4 stages, 3 stages with replicas (2, 1, 1), and
  // 2 stages of 1 replica in 2 pipeline replicas.
  const std::vector<std::pair<std::string, std::vector<std::vector<std::string>>>> models = {
      {"bert", {{"encoder.layer.1"}, {"encoder.layer.0", "encoder.layer.1", "pooler"}, {"encoder.layer.0", "encoder.layer.1"}, {"encoder.layer.1"}}},
      {"gpt", {{"h.1"}, {"h.0", "h.1", "ln_f"}, {"h.0", "h.1"}, {"h.1"}}},
      {"resnet", {{"layer3.0"}, {"layer2.0", "layer3.0", "layer4.0"}, {}, {"layer3.0"}}},
  };
  const std::vector<Layout> layouts = {
      {"2x2", {2, 2}}, {"4stages", {1, 1, 1, 1}}, {"3stages211", {2, 1, 1}}, {"2stages2copies", {1, 1}}};
  for (const auto& [model, boundaries] : models) {
    for (std::size_t layout = 0; layout < layouts.size(); ++layout) {
      // BatchNorm needs the same sample grouping in every stage: ResNet only with equal replicas.
      if (model == "resnet" && layout == 2) continue;
      for (const std::string schedule : {"gpipe", "1f1b", "scp"}) {
        for (bool recompute : {false, true}) {
          if (schedule == "scp" && !recompute) continue;  // scp without recomputation is 1F1B
          // The default run: 2x2 with gpipe, 4 stages with 1f1b + recompute, (2,1,1) with 1f1b.
          const bool in_core = (layout == 0 && schedule == "gpipe" && !recompute) ||
                               (layout == 1 && schedule == "1f1b" && recompute) ||
                               (layout == 2 && schedule == "1f1b" && !recompute) ||
                               (layout == 3 && schedule == "1f1b" && recompute) ||
                               (layout == 1 && schedule == "scp");  // Merak §6.1 over 4 stages
          if (in_core != core) continue;
          TrainingCase c;
          c.model = model;
          c.plan = layouts[layout].name;
          c.boundaries = boundaries[layout];
          c.replicas = layouts[layout].replicas;
          c.schedule = schedule;
          c.recompute = recompute ? "boundaries" : "none";
          result.push_back(c);
        }
      }
    }
  }
  // Data parallelism alone with 1 KiB gradient buckets (DDP's overlapped all-reduce, issue 18): many
  // buckets, most holding one gradient, each all-reduced while the backward pass goes on.
  for (const std::string model : {"bert", "gpt", "resnet"}) {
    if (!core) break;
    TrainingCase c;
    c.model = model;
    c.plan = "4replicas_small_buckets";
    c.replicas = {4};
    c.schedule = "gpipe";
    c.planner_settings = {"parallel.bucket_mb=0.001"};
    if (model == "resnet") c.planner_settings.push_back("train.microbatches=1");  // BatchNorm over 4 samples
    result.push_back(c);
  }
  return result;
}

// Megatron-LM's interleaved 1F1B (Narayanan et al. SC'21 §2.2): 2 pipeline stages x 2 replicas, each
// rank holding v = 2 model chunks (4 chunks: chunk c on stage c mod 2, so activations go 0 -> 1 -> 0
// -> 1 with the wrap from the last rank back to the first), with and without recomputation; and the
// rannc planner choosing v itself.
std::vector<TrainingCase> interleaved_cases() {
  std::vector<TrainingCase> result;
  const std::vector<std::pair<std::string, std::vector<std::string>>> models = {
      {"bert", {"encoder.layer.0", "encoder.layer.1", "pooler"}},
      {"gpt", {"h.0", "h.1", "ln_f"}},
      {"resnet", {"layer2.0", "layer3.0", "layer4.0"}},
  };
  for (const auto& [model, boundaries] : models)
    for (bool recompute : {false, true}) {
      TrainingCase c;
      c.model = model;
      c.plan = "2x2_v2";
      c.boundaries = boundaries;
      c.replicas = {2, 2};
      c.schedule = "interleaved";
      c.virtual_stages = 2;
      c.recompute = recompute ? "boundaries" : "none";
      result.push_back(c);
    }
  // rannc choosing the interleaving degree (schedule = "interleaved", virtual_stages = "auto"): a
  // GPT of 12 layers wide enough (hidden 384) that its vocabulary head weighs less than two layers,
  // and a device memory (analytic cost model, the same on every machine) that holds about a quarter
  // of its model state: 4 pipeline ranks, each with v = 2 chunks that the stage DP's blocks cut
  // anywhere, not only at layer boundaries. (Interleaved from 160 to 200 MiB; 120 MiB: plain 1F1B.)
  TrainingCase automatic;
  automatic.model = "gpt";
  automatic.plan = "rannc_auto";
  automatic.planner = "rannc";
  automatic.schedule = "interleaved";
  automatic.recompute = "boundaries";
  automatic.model_overrides = {"model.seq_len=16", "model.hidden=384", "model.heads=6", "model.layers=12"};
  automatic.planner_settings = {"parallel.virtual_stages=auto", "profile.enabled=false", "parallel.memory_margin=0",
                                "parallel.device_memory=180MiB"};
  automatic.expect_interleaved = true;
  result.push_back(automatic);
  return result;
}

TrainingCase manual_case(const std::string& model, const std::string& plan, std::vector<int> replicas,
                         std::vector<std::string> boundaries, int tensor_parallel = 1);

// The zero-bubble schedules (Qi et al. 2024, each backward split into BackwardInput and a deferred
// BackwardWeight) on 4 ranks, 4 microbatches: ZB-H1 on 4 stages of each model, ZB-V on 2 stages x 2
// replicas with 2 chunks per rank; ZB-H1 on GPT with t = 2 x 2
// stages and selective recomputation (recomputed segments keep their weight gradients in B), and
// 2 stages x 2 replicas with stage recomputation and 1 KiB gradient buckets (the overlapped
// all-reduce completes with the last BackwardWeight).
std::vector<TrainingCase> zero_bubble_cases() {
  std::vector<TrainingCase> result;
  const std::vector<std::pair<std::string, std::vector<std::string>>> models = {
      {"bert", {"encoder.layer.0", "encoder.layer.1", "pooler"}},
      {"gpt", {"h.0", "h.1", "ln_f"}},
      {"resnet", {"layer2.0", "layer3.0", "layer4.0"}},
  };
  for (const auto& [model, boundaries] : models) {
    TrainingCase c;
    c.model = model;
    c.plan = "4stages";
    c.boundaries = boundaries;
    c.replicas = {1, 1, 1, 1};
    c.schedule = "zb_h1";
    c.planner_settings = {"train.microbatches=4"};
    result.push_back(c);
    // ZB-V: 2 stages x 2 replicas, 4 chunks in a V (chunks 0 and 3 on stage 0, 1 and 2 on stage 1:
    // stage 1 hands chunk 1's outputs to its own chunk 2), stage recomputation on BERT.
    TrainingCase v = c;
    v.plan = "2x2_v";
    v.replicas = {2, 2};
    v.schedule = "zb_v";
    v.virtual_stages = 2;
    if (model == "bert") v.recompute = "boundaries";
    if (model == "resnet") v.planner_settings = {"train.microbatches=2"};  // BatchNorm over 4 samples
    result.push_back(v);
  }
  TrainingCase tensor_parallel = manual_case("gpt", "tp2_2stages", {1, 1}, {"h.1"}, 2);
  tensor_parallel.schedule = "zb_h1";
  tensor_parallel.recompute = "selective";
  tensor_parallel.planner_settings = {"train.microbatches=4"};
  result.push_back(tensor_parallel);
  TrainingCase replicated = manual_case("gpt", "2x2", {2, 2}, {"h.1"});
  replicated.schedule = "zb_h1";
  replicated.recompute = "boundaries";
  replicated.planner_settings = {"train.microbatches=4", "parallel.bucket_mb=0.001"};
  result.push_back(replicated);
  return result;
}

// A manual plan of `model` named `plan`: `replicas` per stage, stages starting at `boundaries`,
// tensor-parallel degree t.
TrainingCase manual_case(const std::string& model, const std::string& plan, std::vector<int> replicas,
                         std::vector<std::string> boundaries, int tensor_parallel) {
  TrainingCase c;
  c.model = model;
  c.plan = plan;
  c.tensor_parallel = tensor_parallel;
  c.replicas = std::move(replicas);
  c.boundaries = std::move(boundaries);
  return c;
}

// Tensor parallelism (Megatron-LM) and ZeRO-1 on 4 ranks, issue 13's cases: (a) t = 2 x 2 stages,
// (b) t = 4 (BERT-tiny with 4 heads, so that t divides them), (c) t = 2 x 2 replicas with ZeRO-1,
// (d) t = 2 x 2 stages, gpipe, recomputation and Merak's sub-pipelined TMP, (e) t = 2 x 2 replicas,
// sub-pipelined, with 1 KiB gradient buckets, (f) (c) with 1 KiB buckets; `core` picks those, the
// others (slow) vary one setting each: gpipe + recomputation without sub-pipelining, 2 replicas
// without ZeRO, ZeRO-1 alone under 2 stages x 2 replicas.
std::vector<TrainingCase> tensor_parallel_cases(bool core) {
  std::vector<TrainingCase> result;
  for (const std::string model : {"bert", "gpt"}) {
    const std::string second_stage = model == "bert" ? "encoder.layer.1" : "h.1";
    auto make = [&](const std::string& plan, int tensor_parallel, std::vector<int> replicas, bool two_stages) {
      return manual_case(model, plan, std::move(replicas), two_stages ? std::vector<std::string>{second_stage}
                                                                      : std::vector<std::string>{}, tensor_parallel);
    };
    std::vector<TrainingCase> core_cases, other_cases;
    core_cases.push_back(make("tp2_2stages", 2, {1, 1}, true));                      // (a)
    TrainingCase c = make("tp4", 4, {1}, false);                                     // (b)
    if (model == "bert") c.model_overrides = {"model.heads=4"};
    core_cases.push_back(c);
    c = make("tp2_2replicas_zero1", 2, {2}, false);                                  // (c)
    c.zero = 1;
    core_cases.push_back(c);
    c = make("tp2_2stages_subpipelined", 2, {1, 1}, true);                           // (d)
    c.schedule = "gpipe";
    c.recompute = "boundaries";
    c.sub_pipelined_tmp = true;
    core_cases.push_back(c);
    // (e) t = 2 x 2 replicas, sub-pipelined (two gradient hand-overs per parameter), 1 KiB gradient
    // buckets: the replicated LayerNorm and bias gradients keep their semantics.
    c = make("tp2_2replicas_subpipelined_small_buckets", 2, {2}, false);
    c.sub_pipelined_tmp = true;
    c.planner_settings = {"parallel.bucket_mb=0.001"};
    core_cases.push_back(c);
    // (f) (c) with 1 KiB buckets: ZeRO-1's reduce-scatter bucket by bucket during the backward.
    c = make("tp2_2replicas_zero1_small_buckets", 2, {2}, false);
    c.zero = 1;
    c.planner_settings = {"parallel.bucket_mb=0.001"};
    core_cases.push_back(c);
    c = make("tp2_2stages", 2, {1, 1}, true);
    c.schedule = "gpipe";
    c.recompute = "boundaries";
    other_cases.push_back(c);
    other_cases.push_back(make("tp2_2replicas", 2, {2}, false));
    c = make("2x2_zero1", 1, {2, 2}, true);
    c.zero = 1;
    other_cases.push_back(c);
    for (const TrainingCase& chosen : core ? core_cases : other_cases) result.push_back(chosen);
  }
  return result;
}

// Sequence parallelism (Korthikanti et al. 2022 §4.2.2) on top of tensor parallelism: t = 2 with 1
// stage (x 2 replicas) and with 2 stages, t = 4 with 1 stage and with 2 stages (8 ranks; BERT-tiny
// with 4 heads), and t = 2 x 2 replicas with ZeRO-1, sub-pipelined TMP and 1 KiB buckets (the summed
// sequence-parallel gradients are then ZeRO pieces), and t = 2 x 2 stages under each recompute policy.
// The tiny models' sequence (32) divides by t.
std::vector<TrainingCase> sequence_parallel_cases() {
  std::vector<TrainingCase> result;
  for (const std::string model : {"bert", "gpt"}) {
    const std::string second_stage = model == "bert" ? "encoder.layer.1" : "h.1";
    auto make = [&](const std::string& plan, int tensor_parallel, std::vector<int> replicas, bool two_stages) {
      TrainingCase c = manual_case(model, plan, std::move(replicas), two_stages ? std::vector<std::string>{second_stage}
                                                                                 : std::vector<std::string>{}, tensor_parallel);
      c.sequence_parallel = true;
      c.ranks = 0;
      for (int replicas_of_stage : c.replicas) c.ranks += tensor_parallel * replicas_of_stage;
      if (model == "bert" && tensor_parallel == 4) c.model_overrides = {"model.heads=4"};
      return c;
    };
    result.push_back(make("sp_tp2_2replicas", 2, {2}, false));
    result.push_back(make("sp_tp2_2stages", 2, {1, 1}, true));
    result.push_back(make("sp_tp4", 4, {1}, false));
    result.push_back(make("sp_tp4_2stages", 4, {1, 1}, true));
    TrainingCase c = make("sp_tp2_2replicas_zero1_subpipelined_small_buckets", 2, {2}, false);
    c.zero = 1;
    c.sub_pipelined_tmp = true;
    c.planner_settings = {"parallel.bucket_mb=0.001"};
    result.push_back(c);
    // With each recompute policy: the recomputed forward runs the all-gathers and reduce-scatters
    // again, the kept checkpoints are the rank's part of the sequence.
    for (const std::string recompute : {"boundaries", "selective", "layers"}) {
      c = make("sp_tp2_2stages", 2, {1, 1}, true);
      c.recompute = recompute;
      result.push_back(c);
    }
  }
  return result;
}

// Per-layer checkpointing and selective recomputation (issue 24) on 4 ranks against one, for BERT and
// GPT (unfused attention with dropout: selective recomputes QKᵀ, softmax, dropout and ×V): every
// transformer layer checkpointed over 4 stages (1f1b) and every 2 layers over 2x2; selective over
// 2x2 (gpipe), interleaved (2x2, v = 2) and 4 stages under Merak's scp; with tensor parallelism
// (t = 2, 2 stages) per layer under Merak's sub-pipelined TMP (the overlapped backward recomputes
// both halves) and selective; per layer with t = 2 x 2 replicas and ZeRO-1; and ResNet per layer
// (BatchNorm's running statistics must not change twice).
std::vector<TrainingCase> recomputation_cases() {
  std::vector<TrainingCase> result;
  for (const std::string model : {"bert", "gpt"}) {
    const bool bert = model == "bert";
    const std::vector<std::string> four_stages =
        bert ? std::vector<std::string>{"encoder.layer.0", "encoder.layer.1", "pooler"} : std::vector<std::string>{"h.0", "h.1", "ln_f"};
    const std::string second_stage = bert ? "encoder.layer.1" : "h.1";
    auto make = [&](const std::string& plan, const std::string& recompute, std::vector<int> replicas,
                    std::vector<std::string> boundaries) {
      TrainingCase c = manual_case(model, plan, std::move(replicas), std::move(boundaries));
      c.recompute = recompute;
      return c;
    };
    result.push_back(make("4stages", "layers", {1, 1, 1, 1}, four_stages));
    TrainingCase c = make("2x2_every_2_layers", "layers", {2, 2}, {second_stage});
    c.planner_settings = {"parallel.recompute_layers=2"};
    result.push_back(c);
    c = make("2x2", "selective", {2, 2}, {second_stage});
    c.schedule = "gpipe";
    result.push_back(c);
    c = make("2x2_v2", "selective", {2, 2}, four_stages);
    c.schedule = "interleaved";
    c.virtual_stages = 2;
    result.push_back(c);
    c = make("tp2_2stages_subpipelined", "layers", {1, 1}, {second_stage});
    c.tensor_parallel = 2;
    c.sub_pipelined_tmp = true;
    result.push_back(c);
    c = make("tp2_2stages", "selective", {1, 1}, {second_stage});
    c.tensor_parallel = 2;
    result.push_back(c);
    c = make("4stages", "selective", {1, 1, 1, 1}, four_stages);
    c.schedule = "scp";
    result.push_back(c);
    c = make("tp2_2replicas_zero1", "layers", {2}, {});
    c.tensor_parallel = 2;
    c.zero = 1;
    result.push_back(c);
  }
  TrainingCase resnet;
  resnet.model = "resnet";
  resnet.plan = "2x2";
  resnet.recompute = "layers";
  resnet.replicas = {2, 2};
  resnet.boundaries = {"layer3.0"};
  result.push_back(resnet);
  return result;
}

// Settings under which every plan a planner may pick from measured profiles (which differ from
// machine to machine) is one that a single rank mirrors (expect_matches_single_rank), so that the
// planner cases never skip. BERT and GPT on 4 ranks: a stage may get 1 to 4 replicas, so each
// microbatch must divide by 1, 2, 3 and 4 — 24 samples in at most 2 microbatches give microbatches
// of 24 or 12 samples (one pipeline replica), 12 or 6 (two, ≤ 2 replicas a stage) or 6 or 3 (four,
// 1 replica). ResNet (BatchNorm): every stage must group its samples alike and into groups of at
// least 4 (see global_batch), which no batch size ensures on 4 ranks (the planner may pick replicas
// (3, 1) or (2, 1, 1)); on 2 ranks every layout — 2 stages, 1 stage of 2 replicas, 2 pipeline
// replicas — has equal replicas, and at most 2 microbatches of the 16 samples leave groups of ≥ 4.
void make_mirrorable(TrainingCase& c) {
  if (c.model == "resnet") {
    c.ranks = 2;
    c.planner_settings.push_back("parallel.max_microbatches=2");
  } else {
    c.global_batch = 24;
    c.planner_settings.push_back("parallel.max_microbatches=2");
  }
}

// The plans the rannc, ideals and capslog planners pick from the measured profiles (1f1b, recompute
// as planned): BERT and GPT on 4 ranks, ResNet on 2 (see make_mirrorable).
std::vector<TrainingCase> planner_cases() {
  std::vector<TrainingCase> result;
  for (const std::string model : {"bert", "gpt", "resnet"})
    for (const std::string planner : {"rannc", "ideals", "capslog"}) {
      TrainingCase c;
      c.model = model;
      c.plan = planner;
      c.planner = planner;
      c.recompute = "boundaries";
      make_mirrorable(c);
      result.push_back(c);
    }
  // Merak's planner (its graph shards grouped into 2 balanced stages: on 4 ranks the tiny models
  // would otherwise get 1 stage) under Merak's shifted critical path schedule.
  const auto merak_case = [](const std::string& model) {
    TrainingCase c;
    c.model = model;
    c.plan = "merak";
    c.planner = "merak";
    c.schedule = "scp";
    c.recompute = "boundaries";
    c.planner_settings = {"parallel.stages=2"};
    return c;
  };
  for (const std::string model : {"bert", "gpt"}) {
    TrainingCase c = merak_case(model);
    make_mirrorable(c);
    result.push_back(c);
  }
  // ... and with Merak's stage-aware recomputation (§6.2): 4 layers, so that a stage's layers are
  // fine enough to keep some, and a device memory (on the analytic cost model, the same on every
  // machine) at which stage 0 keeps the activations of some of its layers and recomputes the others.
  // Not make_mirrorable: the analytic plan is the same on every machine, and one rank mirrors it.
  // (Windows with the saved-tensor memory model, graph/saved_tensors.h: bert 29.6–30.0 MiB, gpt
  // 29.7–30.15 MiB; below them stage 0 recomputes whole, above it keeps every layer.)
  for (const auto& [model, memory] : {std::pair{"bert", "29.8MiB"}, std::pair{"gpt", "29.9MiB"}}) {
    TrainingCase c = merak_case(model);
    c.plan = "merak_stage_aware";
    c.model_overrides = {"model.layers=4"};
    c.planner_settings.insert(c.planner_settings.end(), {"parallel.recompute=stage_aware", "profile.enabled=false",
                                                         "parallel.memory_margin=0", std::string("parallel.device_memory=") + memory});
    c.expect_partial_recompute = true;
    result.push_back(c);
  }
  return result;
}

// Mixed precision ([train] precision = "bf16": bf16 working parameters and activations, f32 master
// weights, gradients and optimizer state; on the CPU every op computes in fp32 from bf16 inputs and
// rounds its outputs, the reference the CUDA kernels are checked against). Against the fp32 run of
// the same plan: every step's loss within 1e-3 relative and the final parameters within 5e-3
// (relative L2 over the model), yet
// not bitwise equal (the bf16 path really ran). And 4 ranks (2 stages x 2 replicas) in bf16 track
// the single-rank bf16 run over the same loss pieces within 1e-3.
class MixedPrecision : public ::testing::TestWithParam<std::string> {};

TEST_P(MixedPrecision, TracksFp32AndDistributesLikeOneRank) {
  TrainingCase c;
  c.model = GetParam();
  c.plan = "mixed";
  const std::string root = std::string(PARTRAIN_RUN_DIR) + "/mixed-" + c.model + "-" + std::to_string(::getpid());
  const std::vector<std::string> single = {"parallel.planner=dpl", "train.microbatches=4", "parallel.recompute=none"};
  auto with = [](std::vector<std::string> settings, const std::string& extra) {
    settings.push_back(extra);
    return settings;
  };
  const std::string fp32 = run_training(c, 1, root + "/fp32", single);
  const std::string bf16 = run_training(c, 1, root + "/bf16", with(single, "train.precision=bf16"));
  const std::string boundary = c.model == "gpt" ? "h.1" : "encoder.layer.1";
  const std::string distributed = run_training(
      c, 4, root + "/bf16-2x2",
      {"train.precision=bf16", "parallel.planner=manual", "parallel.stages=2", "parallel.replicas=[2,2]",
       "parallel.boundaries=[\"" + boundary + "\"]", "train.microbatches=2", "parallel.recompute=none"});
  if (HasFailure()) return;

  const std::vector<double> expected = testing::metric_values(fp32, "loss"), mixed = testing::metric_values(bf16, "loss"),
                            spread = testing::metric_values(distributed, "loss");
  ASSERT_EQ(expected.size(), static_cast<std::size_t>(kSteps));
  ASSERT_EQ(mixed.size(), expected.size());
  ASSERT_EQ(spread.size(), expected.size());
  bool differs = false;
  for (std::size_t step = 0; step < expected.size(); ++step) {
    EXPECT_NEAR(mixed[step], expected[step], 1e-3 * std::abs(expected[step])) << "bf16 vs fp32, step " << step + 1;
    EXPECT_NEAR(spread[step], mixed[step], 1e-3 * std::abs(mixed[step])) << "bf16 4 ranks vs 1 rank, step " << step + 1;
    differs = differs || mixed[step] != expected[step];
  }
  EXPECT_TRUE(differs) << "bf16 losses are bitwise the fp32 ones: mixed precision did not take effect";

  // Parameters over the whole model by relative L2 distance (element-wise maxima say little here:
  // AdamW turns a rounding-level gradient into an update of about ±lr for that element).
  const io::Hdf5File expected_file = io::Hdf5File::open_read(fp32 + "/parameters.h5");
  const io::Hdf5File mixed_file = io::Hdf5File::open_read(bf16 + "/parameters.h5");
  double difference = 0, norm = 0;
  for (const std::string& name : expected_file.dataset_names("model")) {
    const std::vector<float> a = mixed_file.read<float>("model/" + name), e = expected_file.read<float>("model/" + name);
    ASSERT_EQ(a.size(), e.size()) << name;
    for (std::size_t i = 0; i < a.size(); ++i) {
      difference += (double(a[i]) - e[i]) * (double(a[i]) - e[i]);
      norm += double(e[i]) * e[i];
    }
  }
  const double relative = std::sqrt(difference / norm);
  std::printf("bf16 vs fp32 parameters after %d steps: relative L2 distance %.3g\n", kSteps, relative);
  EXPECT_LE(relative, 5e-3);
  std::filesystem::remove_all(root);
}

// ---------------- every plan the validator accepts trains like one rank ----------------
// A property test (issues 16 and 30): random plans for the tiny models — cuts at any task boundary
// (inside layers and, half the time, among the last tasks: the heads and the loss), random replicas
// per stage and pipeline replicas on 2-4 ranks, tensor parallelism (t = 2, with or without sequence
// parallelism and sub-pipelined TMP; not ResNet), ZeRO-1, two model chunks per rank (interleaved or
// zb_v), random schedule (zero-bubble zb_h1 / zb_v a third of the time), recompute per stage, microbatch count, and bf16 for every third seed — each accepted
// by Plan::validate and trained against the single-rank run over the same loss pieces (in bf16
// against the single-rank bf16 run).
// PARTRAIN_RANDOM_PLAN_SEED (first seed) and PARTRAIN_RANDOM_PLAN_CASES (how many) choose the
// cases; a failure prints the command that replays its seed alone.

struct RandomPlan {
  Plan plan;
  std::string description;
};

std::int64_t environment_number(const char* name, std::int64_t fallback) {
  const char* text = std::getenv(name);
  return text && *text ? std::stoll(text) : fallback;
}

// The 3D layout of a random plan: world size, tensor parallelism (degree, sequence parallelism,
// Merak's sub-pipelined TMP), pipeline replicas, pipeline depth and model chunks per rank.
struct RandomLayout {
  int world_size = 2, tensor_parallel = 1, pipeline_replicas = 1, devices = 2, depth = 2, virtual_stages = 1;
  bool sequence_parallel = false, sub_pipelined_tmp = false;
};

template <typename Uniform>
RandomLayout draw_layout(const std::string& model, Uniform& uniform) {
  RandomLayout layout;
  layout.world_size = uniform(2, 4);
  // ResNet has no tensor-parallel layers.
  if (model != "resnet" && layout.world_size % 2 == 0 && uniform(0, 1)) {
    layout.tensor_parallel = 2;
    layout.sequence_parallel = uniform(0, 1);
    layout.sub_pipelined_tmp = uniform(0, 2) == 0;
  }
  const int pipeline_devices = layout.world_size / layout.tensor_parallel;
  std::vector<int> copy_choices;
  for (int copies = 1; copies <= pipeline_devices; ++copies)
    if (pipeline_devices % copies == 0) copy_choices.push_back(copies);
  // Mostly one pipeline replica and several stages: pipelines are what the planners' cuts exercise.
  layout.pipeline_replicas = uniform(0, 2) ? 1 : copy_choices[uniform(0, static_cast<int>(copy_choices.size()) - 1)];
  layout.devices = pipeline_devices / layout.pipeline_replicas;
  layout.depth = uniform(std::min(2, layout.devices), layout.devices);
  // A third of the pipelines interleave two model chunks per rank (Narayanan et al. SC'21 §2.2).
  if (layout.depth >= 2 && uniform(0, 2) == 0) layout.virtual_stages = 2;
  return layout;
}

// Draws plans from `seed` until Plan::validate accepts one; `rejected` counts the others. The plan's
// tasks index `graph` or, with tensor parallelism, tensor_parallel_graph(graph, t, sequence_parallel).
RandomPlan draw_random_plan(const std::string& model, const ExperimentConfig& config, const Graph& graph,
                            std::uint64_t seed, int& rejected) {
  std::mt19937_64 random(seed);
  auto uniform = [&](int low, int high) { return std::uniform_int_distribution<int>(low, high)(random); };
  for (rejected = 0;; ++rejected) {
    const RandomLayout layout = draw_layout(model, uniform);
    const Graph parallel = layout.tensor_parallel > 1
                               ? tensor_parallel_graph(graph, layout.tensor_parallel, layout.sequence_parallel)
                               : Graph();
    const Graph& planned = layout.tensor_parallel > 1 ? parallel : graph;
    std::vector<int> ordered;  // non-constant tasks in id (topological) order: contiguous ranges are convex
    for (const Task& task : planned.tasks())
      if (!task.constant) ordered.push_back(task.id);
    const int task_count = static_cast<int>(ordered.size());
    RandomPlan drawn;
    Plan& plan = drawn.plan;
    plan.planner = "random";
    plan.graph_hash = planned.hash();
    plan.world_size = layout.world_size;
    plan.tensor_parallel = layout.tensor_parallel;
    plan.sequence_parallel = layout.sequence_parallel;
    plan.sub_pipelined_tmp = layout.sub_pipelined_tmp;
    plan.virtual_stages = layout.virtual_stages;
    plan.pipeline_replicas = layout.pipeline_replicas;
    plan.global_batch = global_batch(model);
    const int stage_count = layout.depth * layout.virtual_stages;  // model chunks
    std::vector<int> replicas(layout.depth, 1);
    if (model == "resnet") {  // BatchNorm: every stage must group samples alike (see expect_matches_single_rank)
      if (layout.devices % layout.depth != 0) continue;
      replicas.assign(layout.depth, layout.devices / layout.depth);
    } else {
      for (int extra = layout.devices - layout.depth; extra > 0; --extra) ++replicas[uniform(0, layout.depth - 1)];
    }
    for (int chunk = layout.depth; chunk < stage_count; ++chunk) replicas.push_back(replicas[chunk % layout.depth]);
    if (task_count < stage_count) continue;
    std::vector<int> cuts;  // first task position of stages 1..S-1
    while (static_cast<int>(cuts.size()) < stage_count - 1) {
      const int cut = uniform(0, 1) ? uniform(std::max(1, task_count - 12), task_count - 1) : uniform(1, task_count - 1);
      if (std::find(cuts.begin(), cuts.end(), cut) == cuts.end()) cuts.push_back(cut);
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.insert(cuts.begin(), 0);
    cuts.push_back(task_count);
    std::vector<std::vector<int>> stages;
    for (int s = 0; s < stage_count; ++s) stages.emplace_back(ordered.begin() + cuts[s], ordered.begin() + cuts[s + 1]);
    stages = partition::attach_constant_tasks(planned, std::move(stages));
    // Microbatches: the per-copy batch must split into them, each feeding every stage's replicas and
    // splitting evenly over the last stage's (the single-rank reference's loss pieces); interleaved:
    // a multiple of the pipeline depth.
    const std::int64_t per_pipeline_replica = plan.global_batch / plan.pipeline_replicas;
    std::vector<int> microbatch_choices;
    for (int m = 1; m <= per_pipeline_replica; ++m) {
      const std::int64_t size = per_pipeline_replica / m;
      // ResNet: BatchNorm over fewer than 4 samples makes training chaotic (see global_batch).
      const std::int64_t smallest_piece = model == "resnet" ? 4 : 1;
      if (per_pipeline_replica % m == 0 && size % replicas.back() == 0 && size / replicas.back() >= smallest_piece &&
          size >= *std::max_element(replicas.begin(), replicas.end()) &&
          (layout.virtual_stages == 1 || m % layout.depth == 0))
        microbatch_choices.push_back(m);
    }
    if (plan.global_batch % plan.pipeline_replicas != 0 || microbatch_choices.empty()) continue;
    plan.microbatches = microbatch_choices[uniform(0, static_cast<int>(microbatch_choices.size()) - 1)];
    plan.schedule = layout.virtual_stages > 1
                        ? ScheduleKind::Interleaved
                        : std::vector<ScheduleKind>{ScheduleKind::GPipe, ScheduleKind::OneForwardOneBackward,
                                                    ScheduleKind::ShiftedCriticalPath}[uniform(0, 2)];
    // ZeRO-1 half the time where a stage has data-parallel replicas to shard the optimizer over.
    const bool data_parallel = plan.pipeline_replicas > 1 || *std::max_element(replicas.begin(), replicas.end()) > 1;
    plan.zero = data_parallel && uniform(0, 1) ? 1 : 0;
    plan.device_memory_bytes = 16.0 * (1 << 30);
    plan.precision = parse_precision(config.train.precision);
    plan.optimizer = config.train.optimizer;
    plan.optimizer_state_copies = state_copies_of_optimizer(plan.optimizer);
    std::ostringstream description;
    description << plan.pipeline_replicas << " copies x t " << plan.tensor_parallel
                << (plan.sequence_parallel ? " sp" : "") << (plan.sub_pipelined_tmp ? " sub-pipelined" : "")
                << (plan.zero ? " zero1" : "") << " x chunks [";
    for (int s = 0; s < stage_count; ++s) {
      PlanStage stage;
      stage.tasks = stages[s];
      stage.replicas = replicas[s];
      // None, whole, (stage-aware) the tasks below a random one of the stage recomputed, per-layer
      // checkpoints every 1–2 layers, or selective.
      const int recompute = stage.tasks.size() > 1 ? uniform(0, 4) : std::array{0, 1, 3, 4}[uniform(0, 3)];
      stage.recompute = std::array{RecomputePolicy::None, RecomputePolicy::StageBoundaries, RecomputePolicy::StageAware,
                                   RecomputePolicy::Layers, RecomputePolicy::Selective}[recompute];
      if (stage.recompute == RecomputePolicy::StageAware)
        stage.recompute_until_task = stage.tasks[uniform(1, static_cast<int>(stage.tasks.size()) - 1)];
      if (stage.recompute == RecomputePolicy::Layers) stage.recompute_layers = uniform(1, 2);
      stage.summary = summarize_tasks(planned, stage.tasks);
      description << (s ? "; " : "") << "tasks " << cuts[s] << "-" << cuts[s + 1] - 1 << " ("
                  << planned.task(ordered[cuts[s]]).name << " .. " << planned.task(ordered[cuts[s + 1] - 1]).name
                  << ") x" << stage.replicas
                  << (stage.recompute == RecomputePolicy::None ? "" : std::string(" recompute ") + recompute_name(stage.recompute))
                  << (stage.recompute == RecomputePolicy::StageAware ? " below task " + std::to_string(stage.recompute_until_task) : "")
                  << (stage.recompute == RecomputePolicy::Layers ? " every " + std::to_string(stage.recompute_layers) : "");
      plan.stages.push_back(std::move(stage));
    }
    description << "], " << plan.microbatches << " microbatches, " << schedule_name(plan.schedule);
    drawn.description = description.str();
    try {
      plan.validate(planned);
    } catch (const Error&) {
      continue;  // e.g. a loss piece across stages of different replica counts
    }
    // A third of the plans run a zero-bubble schedule instead (issue 27), drawn last so that every
    // seed keeps the layout it had: zb_h1 in place of gpipe, 1f1b or scp; zb_v in place of
    // interleaved (chunk c ≥ S then runs on stage 2S − 1 − c and takes that stage's replicas).
    const std::int64_t microbatch_size = plan.global_batch / plan.pipeline_replicas / plan.microbatches;
    const bool loss_pieces_even = layout.virtual_stages == 1 || microbatch_size % replicas.front() == 0;  // zb_v: last chunk on stage 0
    if (uniform(0, 2) == 0 && loss_pieces_even) {
      Plan zero_bubble = plan;
      zero_bubble.schedule = layout.virtual_stages > 1 ? ScheduleKind::ZeroBubbleV : ScheduleKind::ZeroBubbleH1;
      for (int chunk = layout.depth; chunk < stage_count; ++chunk)
        zero_bubble.stages[chunk].replicas = replicas[stage_of_chunk(zero_bubble.schedule, chunk, layout.depth)];
      try {
        zero_bubble.validate(planned);
        const std::string old_name = schedule_name(plan.schedule);
        drawn.description.replace(drawn.description.rfind(old_name), old_name.size(), schedule_name(zero_bubble.schedule));
        plan = std::move(zero_bubble);
      } catch (const Error&) {  // e.g. a loss piece across the V's stages of different replica counts
      }
    }
    // Every third seed (1, 4, 7, ...: one case per model in the default run, seeds 1 and 2) trains in
    // bf16, against the single-rank bf16 run (see kBf16LossTolerance). A rule, not a draw: a bf16
    // case needs a reference run of its own, and bf16 on the CPU is emulated (each op widened to
    // fp32 and rounded back, about 1.7x the fp32 step time), so the rule bounds the default run's
    // cost (about 5 s); the layout, drawn before, varies with the seed.
    // BERT's seed 1 cuts between the masked-LM loss and the NSP head: an f32 loss crosses a bf16
    // pipeline (received as bf16 before the executor's value_dtypes, a truncated message).
    // Of those, seeds 4, 10, 16, ... train in fp16 (dynamic loss scaling) instead, against the
    // single-rank fp16 run with the same bands (fp16's rounding is finer than bf16's).
    if (seed % 3 == 1) {
      plan.precision = seed % 6 == 4 ? Precision::Fp16 : Precision::Bf16;
      drawn.description += std::string(", ") + precision_name(plan.precision);
    }
    return drawn;
  }
}

class RandomPlans : public ::testing::TestWithParam<std::string> {};

TEST_P(RandomPlans, EveryValidPlanTrainsLikeOneRank) {
  const std::string model = GetParam();
  TrainingCase c;
  c.model = model;
  c.plan = "random";
  std::vector<std::string> overrides = model_settings(model);
  const ExperimentConfig config =
      load_experiment(std::string(PARTRAIN_SOURCE_DIR) + "/configs/" + model + "-tiny.toml", overrides);
  const Graph graph = build_model(config.model);
  const std::uint64_t first_seed = static_cast<std::uint64_t>(environment_number("PARTRAIN_RANDOM_PLAN_SEED", 1));
  const std::int64_t cases = environment_number("PARTRAIN_RANDOM_PLAN_CASES", 2);
  const std::string root = PARTRAIN_RUN_DIR;
  for (std::int64_t i = 0; i < cases; ++i) {
    const std::uint64_t seed = first_seed + static_cast<std::uint64_t>(i);
    int rejected = 0;
    const RandomPlan drawn = draw_random_plan(model, config, graph, seed, rejected);
    std::printf("%s seed %llu: %s (%d drawn plans rejected by the validator first)\n", model.c_str(),
                static_cast<unsigned long long>(seed), drawn.description.c_str(), rejected);
    std::fflush(stdout);
    SCOPED_TRACE("random plan seed " + std::to_string(seed) + ": " + drawn.description +
                 "\nreplay: PARTRAIN_RANDOM_PLAN_SEED=" + std::to_string(seed) +
                 " PARTRAIN_RANDOM_PLAN_CASES=1 test_distributed_training --gtest_filter='RandomPlans/*/" + model + "'");
    const std::string distributed = root + "/random-" + model + "-" + std::to_string(seed) + "-" + std::to_string(::getpid());
    std::filesystem::create_directories(distributed);
    drawn.plan.save(distributed + "/random-plan.json");
    // The run and its single-rank reference in the plan's precision (a reference of its own).
    c.model_overrides.clear();
    if (drawn.plan.precision != Precision::Fp32)
      c.model_overrides.push_back(std::string("train.precision=") + precision_name(drawn.plan.precision));
    // A plan file must agree with the experiment file on tensor and sequence parallelism.
    const std::vector<std::string> settings = {
        "parallel.tensor_parallel=" + std::to_string(drawn.plan.tensor_parallel),
        std::string("parallel.sequence_parallel=") + (drawn.plan.sequence_parallel ? "true" : "false")};
    run_training(c, drawn.plan.world_size, distributed, settings, "--plan " + distributed + "/random-plan.json");
    if (HasFailure()) return;
    expect_matches_single_rank(c, distributed, root);
    if (HasFailure()) return;
    std::filesystem::remove_all(distributed);
  }
}

INSTANTIATE_TEST_SUITE_P(Property, RandomPlans, ::testing::Values("bert", "gpt", "resnet"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

INSTANTIATE_TEST_SUITE_P(Precision, MixedPrecision, ::testing::Values("bert", "gpt"),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

INSTANTIATE_TEST_SUITE_P(Core, DistributedTraining, ::testing::ValuesIn(manual_cases(true)),
                         [](const ::testing::TestParamInfo<TrainingCase>& info) { return case_name(info.param); });
INSTANTIATE_TEST_SUITE_P(ZeroBubble, DistributedTraining, ::testing::ValuesIn(zero_bubble_cases()),
                         [](const auto& info) { return case_name(info.param); });
INSTANTIATE_TEST_SUITE_P(Interleaved, DistributedTraining, ::testing::ValuesIn(interleaved_cases()),
                         [](const ::testing::TestParamInfo<TrainingCase>& info) { return case_name(info.param); });
INSTANTIATE_TEST_SUITE_P(Recomputation, DistributedTraining, ::testing::ValuesIn(recomputation_cases()),
                         [](const auto& info) { return case_name(info.param); });
INSTANTIATE_TEST_SUITE_P(Planners, DistributedTraining, ::testing::ValuesIn(planner_cases()),
                         [](const ::testing::TestParamInfo<TrainingCase>& info) { return case_name(info.param); });
INSTANTIATE_TEST_SUITE_P(TensorParallel, DistributedTraining, ::testing::ValuesIn(tensor_parallel_cases(true)),
                         [](const ::testing::TestParamInfo<TrainingCase>& info) { return case_name(info.param); });
INSTANTIATE_TEST_SUITE_P(SequenceParallel, DistributedTraining, ::testing::ValuesIn(sequence_parallel_cases()),
                         [](const ::testing::TestParamInfo<TrainingCase>& info) { return case_name(info.param); });
INSTANTIATE_TEST_SUITE_P(TensorParallelMatrix, DistributedTraining, ::testing::ValuesIn(tensor_parallel_cases(false)),
                         [](const ::testing::TestParamInfo<TrainingCase>& info) { return case_name(info.param); });
INSTANTIATE_TEST_SUITE_P(Matrix, DistributedTraining, ::testing::ValuesIn(manual_cases(false)),
                         [](const ::testing::TestParamInfo<TrainingCase>& info) { return case_name(info.param); });

}  // namespace
}  // namespace partrain
