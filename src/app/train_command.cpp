// partrain train: the main job. Every rank reads the experiment file and builds the graph; rank 0
// plans (or loads --plan) and broadcasts the plan; every rank instantiates its stage and runs the
// schedule for [train] steps; rank 0 logs a line per step, writes metrics.jsonl, the plan JSON and
// (with [log] trace) a Chrome trace of every rank's actions.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "app/checkpoint_resume.h"
#include "app/collective_decision.h"
#include "app/commands.h"
#include "app/mpi_command.h"
#include "app/plan_agreement.h"
#include "app/planning.h"
#include "app/prediction_report.h"
#include "app/replanning.h"
#include "app/stop_signals.h"
#include "comm/mpi_communicator.h"
#include "comm/device_communicator.h"
#include "core/allocator.h"
#include "core/backend_registry.h"
#include "core/collective_error.h"
#include "core/error.h"
#include "core/statistics.h"
#include "graph/op_profile.h"
#include "graph/tensor_parallel.h"
#include "io/batch_file.h"
#include "io/batch_source.h"
#include "io/checkpoint.h"
#include "io/chrome_trace.h"
#include "io/hdf5_file.h"
#include "io/config.h"
#include "io/metrics_file.h"
#include "io/run_lock.h"
#include "models/model.h"
#include "runtime/checkpointing.h"
#include "runtime/executor.h"
#include <nlohmann/json.hpp>

namespace partrain::app {
namespace {

// Whether `path` is `directory` or lies below it (lexically, after making both absolute).
bool is_within(const std::string& path, const std::string& directory) {
  const std::filesystem::path inner = std::filesystem::absolute(path).lexically_normal();
  const std::filesystem::path outer = std::filesystem::absolute(directory).lexically_normal();
  const std::filesystem::path relative = inner.lexically_relative(outer);
  return !relative.empty() && *relative.begin() != "..";
}

// Rank 0 writes `tensors` (by value id, from the first replica of each stage in pipeline replica 0:
// the executor's parameters and buffers, or its gradients) to `path` as /<group>/<name> (f32, the
// tensor's shape).
void save_tensors(const std::string& path, const std::string& group, const Graph& graph,
                  const std::unordered_map<int, Tensor>& tensors, const runtime::PipelineExecutor& executor,
                  comm::Communicator& world) {
  std::string bytes;
  const Placement placement = executor.placement();
  if (placement.pipeline_replica == 0 && placement.replica == 0) {
    for (const auto& [value, tensor] : tensors) {
      const std::vector<float> values = to_host(tensor, executor.backend()).to_float_vector();
      const std::int64_t header[3] = {value, static_cast<std::int64_t>(values.size()), placement.tensor_rank};
      bytes.append(reinterpret_cast<const char*>(header), sizeof header);
      bytes.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
    }
  }
  const std::vector<std::string> gathered = world.gather_bytes(bytes, 0);
  if (world.rank() != 0) return;
  // value id -> tensor rank -> values (tied parameters: every holder has the same values, the first is kept)
  std::map<int, std::map<int, std::vector<float>>> pieces;
  for (const std::string& from_rank : gathered) {
    for (std::size_t offset = 0; offset < from_rank.size();) {
      std::int64_t header[3] = {0, 0, 0};
      std::memcpy(header, from_rank.data() + offset, sizeof header);
      offset += sizeof header;
      std::vector<float> values(static_cast<std::size_t>(header[1]));
      std::memcpy(values.data(), from_rank.data() + offset, values.size() * sizeof(float));
      offset += values.size() * sizeof(float);
      pieces[static_cast<int>(header[0])].try_emplace(static_cast<int>(header[2]), std::move(values));
    }
  }
  io::Hdf5File file = io::Hdf5File::create(path);
  for (auto& [id, by_tensor_rank] : pieces) {
    const Value& value = graph.value(id);
    if (!value.sharding.sharded()) {
      file.write(group + "/" + value.name, value.type.shape, by_tensor_rank.begin()->second);
      continue;
    }
    // A tensor-parallel parameter: its parts assembled into the whole tensor.
    const Tensor whole = Tensor::zeros(whole_shape(value));
    for (const auto& [tensor_rank, values] : by_tensor_rank)
      place_shard(whole, Tensor::from_vector<float>(value.type.shape, values), value.sharding, tensor_rank);
    file.write(group + "/" + value.name, whole.shape(), whole.to_float_vector());
  }
}

// What the run's parts share once the plan and the executor exist. After planning the plan, not
// the config, says the global batch, the tensor-parallel degree, the precision and the optimizer.
struct TrainingRun {
  const ExperimentConfig& config;
  const Plan& plan;
  const Graph& model;  // the whole model
  const Graph& graph;  // the graph the plan's stages index (the model, or its tensor-parallel graph)
  runtime::PipelineExecutor& executor;
  const io::BatchSource& data;
  const io::BatchSource* heldout;  // the held-out split when [train] eval_every > 0, else null
  comm::Communicator& world;
  std::string directory;             // the run's outputs
  std::string checkpoint_directory;  // where checkpoints go and are looked for
};

// Rank 0 writes what an independent reference needs to redo the first steps (validation/golden):
// every initial parameter and buffer as /model/<name> (f32) and the samples of every step (samples
// [0, steps * global_batch) of the run's stream, step k's global batch being rows [k * B, (k + 1) * B),
// B the plan's) as /batch/<input or label name> (f32 or i64), with the config TOML as the attribute "config".
void save_initial(const std::string& path, const ExperimentConfig& config, const Plan& plan, const Graph& graph,
                  const io::BatchSource& data) {
  io::Hdf5File file = io::Hdf5File::create(path);
  file.write_string_attribute("/", "config", config.text);
  const std::unordered_map<int, Tensor> initial =
      initialize_parameters(graph, static_cast<std::uint64_t>(config.train.seed), config.model.initializer_range);
  for (const auto& [value, tensor] : initial)
    file.write("model/" + graph.value(value).name, graph.value(value).type.shape, tensor.to_float_vector());
  io::write_batches(file, data.samples(0, config.train.steps * plan.global_batch));
}

// Writes checkpoint `step` collectively (parallel HDF5; each tensor by the first replica of the first
// stage holding it) and keeps the newest [checkpoint] keep.
void save_checkpoint(const TrainingRun& run, std::int64_t step) {
  const ExperimentConfig& config = run.config;
  io::CheckpointInfo info;
  info.step = step;
  info.consumed_samples = step * run.plan.global_batch;
  info.data_cursor = info.consumed_samples;
  info.seed = static_cast<std::uint64_t>(config.train.seed);
  info.lr_step = step;
  info.config_toml = config.text;
  info.plan_json = run.plan.to_json().dump();
  info.optimizer = run.plan.optimizer;
  if (const runtime::LossScaler* scaler = run.executor.loss_scaler()) {
    info.loss_scale = scaler->scale();
    info.loss_scale_good_steps = scaler->good_steps();
  }
  const std::string path =
      io::write_checkpoint(run.world, run.checkpoint_directory, info,
                           runtime::checkpoint_tensors(run.graph, run.plan, run.executor),
                           static_cast<int>(config.checkpoint.keep), config.checkpoint.write_timeout);
  if (run.world.rank() == 0) {
    std::printf("checkpoint: %s\n", path.c_str());
    std::fflush(stdout);
  }
}

// save_checkpoint under [checkpoint] on_error: a write that failed on any rank (the same
// CollectiveError on every rank) stops the run ("stop"), or is a warning on rank 0 and training goes
// on ("continue"). Returns whether the checkpoint was written.
bool checkpoint_or_warn(const TrainingRun& run, std::int64_t step) {
  try {
    save_checkpoint(run, step);
    return true;
  } catch (const CollectiveError& error) {
    if (run.config.checkpoint.on_error != "continue") throw;
    if (run.world.rank() == 0) {
      std::printf("warning: %s; training goes on ([checkpoint] on_error = \"continue\")\n", error.message().c_str());
      std::fflush(stdout);
    }
    return false;
  }
}

// Requests refused before any work (and before the run directory is touched): a [parallel]
// world_size other than the MPI world size, nothing to train, a --plan or --resume file that is not
// there (looked for on rank 0).
void check_train_request(const ExperimentConfig& config, const TrainArguments& arguments, comm::Communicator& world) {
  const long long world_size = world.size();
  PARTRAIN_CHECK(config.parallel.world_size == 0 || config.parallel.world_size == world_size,
                 "[parallel] world_size = " << config.parallel.world_size << " (" << config.path
                                            << ") but the MPI world has " << world_size
                                            << (world_size == 1 ? " rank" : " ranks") << ": start "
                                            << config.parallel.world_size
                                            << " ranks or set parallel.world_size=0 (the MPI world size)");
  PARTRAIN_CHECK(config.train.steps > 0, "[train] steps = 0 (" << config.path
                                                               << "): nothing to train; to see the plan without "
                                                                  "training use `partrain plan "
                                                               << config.path << "`");
  const std::string resume = !arguments.resume.empty() ? arguments.resume : config.checkpoint.resume;
  decide_on_rank0(world, [&] {
    PARTRAIN_CHECK(arguments.plan_file.empty() || readable_file(arguments.plan_file),
                   "--plan " << arguments.plan_file << ": no such readable plan file (make one with `partrain plan "
                             << config.path << " --save FILE`)");
    PARTRAIN_CHECK(resume.empty() || resume == "latest" || resume == "auto" || readable_file(resume),
                   "--resume " << resume
                               << ": no such readable checkpoint file (give a step_NNNNNN.h5, latest or auto)");
    return std::string();
  });
}

// One run per directory (io/run_lock.h): rank 0 locks the run directory, and the checkpoint
// directory when it lies elsewhere and this run writes or searches it; a directory in use stops
// every rank. The locks live as long as the returned vector (empty on other ranks).
std::vector<io::RunLock> lock_run_directories(const std::string& directory, const std::string& checkpoint_directory,
                                              bool checkpoint_elsewhere, comm::Communicator& world) {
  std::vector<io::RunLock> locks;
  decide_on_rank0(world, [&] {
    std::vector<std::string> directories{directory};
    if (checkpoint_elsewhere) directories.push_back(checkpoint_directory);
    for (const std::string& path : directories) {
      locks.push_back(io::RunLock::acquire(path));
      if (locks.back().took_over())
        std::printf("warning: %s was left by a run that is gone (%s); taking it over\n", locks.back().path().c_str(),
                    locks.back().previous_holder().describe().c_str());
    }
    std::fflush(stdout);
    return std::string();
  });
  return locks;
}

// [log] op_profile: rank 0 prints the profile of the first rank of each stage (pipeline replica 0,
// replica 0, tensor rank 0); `step_seconds` is that rank's summed step time. Collective.
void print_op_profiles(const OpProfile& profile, double step_seconds, const Plan& plan, comm::Communicator& world) {
  const std::vector<std::string> parts =
      world.gather_bytes(std::to_string(step_seconds) + "\n" + profile.serialise(), 0);
  if (world.rank() != 0) return;
  for (int rank = 0; rank < static_cast<int>(parts.size()); ++rank) {
    const Placement placement = plan.placement_of(rank);
    if (placement.pipeline_replica != 0 || placement.replica != 0 || placement.tensor_rank != 0) continue;
    const std::string& part = parts[static_cast<std::size_t>(rank)];
    const std::size_t end_of_line = part.find('\n');
    const double seconds = std::stod(part.substr(0, end_of_line));
    std::printf("op profile, stage %d (rank %d), summed over the run:\n%s", placement.stage, rank,
                OpProfile::deserialise(part.substr(end_of_line + 1)).format(seconds).c_str());
  }
  std::fflush(stdout);
}

// What the step loop leaves for the end of the run.
struct StepLoopResult {
  double first_loss = NAN, last_loss = NAN;      // of the steps this run trained
  std::vector<double> step_seconds;              // on rank 0: every step's time
  std::vector<double> measured_peak_bytes;       // on rank 0: every rank's peak net of its baseline
  int stop_signal = 0;                           // SIGUSR1 or SIGTERM that stopped the run, or 0
  std::optional<Plan> next_plan;                 // re-planning: the plan to go on under, from
  std::string switch_checkpoint;                 //   this checkpoint (empty: the run is finished)
};

// What re-planning during training needs beyond the run ([profile] replan_threshold).
struct Replanning {
  bool enabled = false;           // a plan made on profiled costs, not yet re-planned in this job
  PlannedGraphs* graphs = nullptr;
  comm::Communicator* device_world = nullptr;
};

// Rank 0 prints the model, the data and the plan table, and saves the plan as plan.json.
void announce_run(const ExperimentConfig& config, const Graph& model, const io::BatchSource& data, const Plan& plan,
                  const std::string& directory) {
  std::printf("model: %s (%s, %lld parameters), data: %s (%lld samples per epoch)\n", config.path.c_str(),
              config.model.type.c_str(), static_cast<long long>(model.parameter_count()), data.path().c_str(),
              static_cast<long long>(data.samples_per_epoch()));
  std::fputs(format_plan_table(plan).c_str(), stdout);
  plan.save(directory + "/plan.json");
  std::printf("outputs: %s/ (plan.json, metrics.jsonl%s)\n", directory.c_str(),
              config.log.trace.empty() ? "" : (", " + config.log.trace).c_str());
  std::fflush(stdout);
}

// On rank 0 the run's metrics.jsonl, open for the rows of the steps from `first_step` on: a resumed
// run appends to the metrics of the run it continues, less the steps it redoes. Closed elsewhere.
std::ofstream open_metrics(const std::string& directory, std::int64_t first_step, comm::Communicator& world) {
  std::ofstream metrics;
  if (world.rank() != 0) return metrics;
  if (first_step > 0) {
    const std::int64_t dropped = io::drop_metrics_after(directory + "/metrics.jsonl", first_step);
    if (dropped > 0)
      std::printf("resume: dropped %lld rows of %s/metrics.jsonl past step %lld\n", static_cast<long long>(dropped),
                  directory.c_str(), static_cast<long long>(first_step));
  }
  metrics.open(directory + "/metrics.jsonl", first_step > 0 ? std::ios::app : std::ios::trunc);
  PARTRAIN_CHECK(metrics, directory << "/metrics.jsonl: cannot write");
  return metrics;
}

// SIGUSR1/SIGTERM on any rank: every rank stops at the same step boundary (one all-reduce) before
// step `step`, after a checkpoint of it when the newest on disk (`checkpointed_step`) is older.
// Returns the signal, or 0 to go on. Collective.
int stop_for_signal(const TrainingRun& run, std::int64_t step, std::int64_t checkpointed_step) {
  const int signal = static_cast<int>(run.world.all_reduce_scalar(received_stop_signal(), comm::ReduceOp::Max));
  if (signal == 0) return 0;
  const std::string path = (std::filesystem::path(run.checkpoint_directory) / io::checkpoint_file_name(step)).string();
  if (checkpointed_step != step) save_checkpoint(run, step);
  if (run.world.rank() == 0) {
    std::printf("stopped by %s after step %lld of %lld: checkpoint %s; resume with --resume latest (exit code %d)\n",
                stop_signal_name(signal), static_cast<long long>(step), static_cast<long long>(run.config.train.steps),
                path.c_str(), kExitStoppedBySignal);
    std::fflush(stdout);
  }
  return signal;
}

// fp16's part of a step's log line: " | loss scale S" and, for a skipped step, " | skipped (overflow)".
std::string loss_scale_text(const runtime::StepResult& result) {
  if (result.loss_scale <= 0) return {};
  char text[96];
  std::snprintf(text, sizeof text, " | loss scale %g%s", result.loss_scale, result.skipped ? " | skipped (overflow)" : "");
  return text;
}

// Rank 0's record of step `step` (0-based): its metrics.jsonl row and, every [log] every steps, the
// log line (samples/s of the plan's global batch), and the evaluation line when it evaluated.
void record_step(const TrainingRun& run, std::int64_t step, const runtime::StepResult& result,
                 std::optional<double> eval_loss,
                 const std::vector<double>& rank_peak_bytes, const std::vector<double>& rank_baseline_bytes,
                 double flops_per_sample, const nlohmann::json& replan, std::ofstream& metrics) {
  const ExperimentConfig& config = run.config;
  const double samples_per_second = run.plan.global_batch / result.seconds;
  const double tokens_per_second = samples_per_second * run.data.tokens_per_sample();
  const double tflops = samples_per_second * flops_per_sample / 1e12;
  nlohmann::json record{{"step", step + 1},
                        {"loss", result.loss},
                        {"lr", result.lr},
                        {"grad_norm", result.grad_norm},
                        {"seconds", result.seconds},
                        {"samples_per_second", samples_per_second},
                        {"tokens_per_second", tokens_per_second},
                        {"tflops", tflops},
                        {"peak_memory_bytes", result.peak_memory_bytes},
                        {"predicted_seconds", run.plan.predicted_step_seconds},
                        {"rank_peak_memory_bytes", rank_peak_bytes},
                        {"rank_baseline_bytes", rank_baseline_bytes}};
  if (eval_loss) record["eval_loss"] = *eval_loss;
  if (!replan.is_null()) record["replan"] = replan;
  if (result.loss_scale > 0) {  // fp16: the scale the step's backward used, and whether it was skipped
    record["loss_scale"] = result.loss_scale;
    record["skipped"] = result.skipped;
  }
  metrics << record.dump() << '\n';
  metrics.flush();
  if ((step + 1) % config.log.every == 0 || step + 1 == config.train.steps) {
    std::printf("step %lld/%lld | loss %.6f | lr %.3e | grad_norm %.4f | %.1f samples/s | %.0f tokens/s | "
                "%.4f TFLOP/s | peak %.1f MiB | predicted %.3f s/step%s\n",
                static_cast<long long>(step + 1), static_cast<long long>(config.train.steps), result.loss, result.lr,
                result.grad_norm, samples_per_second, tokens_per_second, tflops,
                result.peak_memory_bytes / (1 << 20), run.plan.predicted_step_seconds, loss_scale_text(result).c_str());
    std::fflush(stdout);
  }
  if (eval_loss) {
    std::printf("eval after step %lld | held-out loss %.6f over %lld batches\n", static_cast<long long>(step + 1),
                *eval_loss, static_cast<long long>(config.train.eval_batches));
    std::fflush(stdout);
  }
}

// Whether the run re-plans after step `step` (0-based): the step closing [profile] replan_window
// steps after one warm-up step, with steps left to train after it.
bool replans_after(const TrainingRun& run, const Replanning& replanning, std::int64_t first_step, std::int64_t step) {
  const ProfileConfig& profile = run.config.profile;
  const std::int64_t last_of_window = first_step + profile.replan_window;
  return replanning.enabled && profile.replan_threshold > 0 && step == last_of_window &&
         step + 1 < run.config.train.steps;
}

// What one re-planning check decided: the metrics row's "replan" record, and the plan to switch to.
struct ReplanOutcome {
  nlohmann::json record;
  std::optional<Plan> plan;
};

// Issue 26 item 3: compares the window's measured step (rank 0's median, `window_seconds`) with the
// plan's prediction; beyond [profile] replan_threshold, rank 0 corrects the plan graph's ProfileDB
// with each stage's measured costs (in memory: the cache keeps what profiling measured, and this
// job's conditions need not be the next one's) and every rank plans again at the plan's
// tensor-parallel degree and ZeRO stage (the other degrees' profiles were not corrected).
// Collective over the world.
ReplanOutcome check_prediction(const TrainingRun& run, const Replanning& replanning, std::int64_t first_step,
                               const std::vector<double>& window_seconds) {
  const ExperimentConfig& config = run.config;
  comm::Communicator& world = run.world;
  const std::int64_t window_begin = first_step + 1, window_end = first_step + 1 + config.profile.replan_window;
  const std::map<int, MeasuredStageCosts> measured = gather_stage_costs(
      measured_stage_costs(run.executor.trace(), run.plan, world.rank(), window_begin, window_end), world);
  const double measured_step = median(window_seconds);  // rank 0's: its own step times, as logged
  const double predicted = run.plan.predicted_step_seconds;
  const double error = predicted > 0 ? measured_step / predicted - 1.0 : 0.0;
  const std::map<int, profile::TimeCorrection> corrections = stage_corrections(run.plan, measured);
  ReplanOutcome outcome;
  outcome.record = {{"measured_seconds", measured_step}, {"predicted_seconds", predicted}, {"error", error},
                    {"threshold", config.profile.replan_threshold}};
  const bool replan = world.all_reduce_scalar(
                          world.rank() == 0 && std::abs(error) > config.profile.replan_threshold ? 1.0 : 0.0,
                          comm::ReduceOp::Max) > 0;
  if (!replan) {
    if (world.rank() == 0)
      std::printf("replan: step time measured %.4f s, predicted %.4f s (%+.1f%%): within [profile] replan_threshold "
                  "%.0f%%, plan kept\n", measured_step, predicted, 100 * error, 100 * config.profile.replan_threshold);
    outcome.record["replanned"] = false;
    return outcome;
  }
  Backend& backend = run.executor.backend();
  if (!run.executor.traces_device_time()) {
    // Host times of a device's actions are the queueing of its kernels, not their work: stage
    // corrections from them would be wrong (a backend without a device timer).
    if (world.rank() == 0)
      std::printf("replan: step time measured %.4f s, predicted %.4f s (%+.1f%%): beyond [profile] replan_threshold "
                  "%.0f%%, but stage costs are not yet measured on %s during training: plan kept\n",
                  measured_step, predicted, 100 * error, 100 * config.profile.replan_threshold,
                  backend.device().to_string().c_str());
    outcome.record["replanned"] = false;
    outcome.record["reason"] = "stage costs not measured on the device during training";
    return outcome;
  }
  // Rank 0 corrects the plan graph's profile in memory: the cache keeps what profiling measured.
  const std::string cache = profile_cache_path(config, run.graph, backend);  // collective
  profile::ProfileDB corrected(run.graph.hash(), "", config.train.precision);
  if (world.rank() == 0) {
    std::printf("%s\n", describe_corrections(measured_step, predicted, config.profile.replan_threshold, corrections).c_str());
    corrected = profile::ProfileDB::load(cache);
    correct_profile(corrected, run.plan, corrections);
    std::printf("replan: planning again on %s corrected with the measured stage costs\n", cache.c_str());
    std::fflush(stdout);
  }
  ExperimentConfig same_degree = config;  // the profiles of other degrees were not corrected
  same_degree.parallel.tensor_parallel = run.plan.tensor_parallel;
  same_degree.parallel.tensor_parallel_given = true;
  same_degree.parallel.sequence_parallel = run.plan.sequence_parallel;
  same_degree.parallel.choose_sequence_parallel = false;
  same_degree.parallel.zero = run.plan.zero;
  same_degree.parallel.zero_given = true;
  Plan candidate = agree_on_plan(same_degree, *replanning.graphs, "", true, world, *replanning.device_world, backend,
                                 &corrected);
  outcome.record["replanned"] = true;
  outcome.record["new_predicted_seconds"] = candidate.predicted_step_seconds;
  const bool same = same_layout(candidate, run.plan);
  const bool better = !same && faster_plan(candidate, measured_step);
  outcome.record["switched"] = better;
  if (world.rank() == 0) {
    if (same)
      std::printf("replan: the corrected costs choose the same plan (now predicted at %.4f s per step): plan kept\n",
                  candidate.predicted_step_seconds);
    else
      std::printf(better ? "replan: a new plan is predicted at %.4f s per step against %.4f s measured: switching to it "
                           "at the next checkpoint\n"
                         : "replan: the best plan on the corrected costs is predicted at %.4f s per step against %.4f "
                           "s measured: not %.0f%% faster, plan kept\n",
                  candidate.predicted_step_seconds, measured_step, 100 * kReplanMinimumGain);
  }
  std::fflush(stdout);
  if (better) outcome.plan = std::move(candidate);
  return outcome;
}

// The step loop from `first_step` to [train] steps (or a stop signal): each step trained, its
// gradients saved ([log] save_gradients, step 0), evaluated and checkpointed when due, recorded
// by rank 0; then, with [log] op_profile, the loop's kernel times. Collective.
StepLoopResult run_steps(const TrainingRun& run, const Replanning& replanning, std::int64_t first_step,
                         const std::vector<double>& rank_baseline_bytes, std::ofstream& metrics) {
  const ExperimentConfig& config = run.config;
  comm::Communicator& world = run.world;
  const double flops_per_sample = training_flops_per_sample(run.model);  // the whole model's, not one rank's part
  StepLoopResult loop;
  loop.measured_peak_bytes.assign(static_cast<std::size_t>(world.size()), 0.0);
  std::int64_t checkpointed_step = first_step;  // the step of the newest checkpoint on disk
  OpProfile op_profile;  // [log] op_profile: this rank's kernel times over the training steps
  double op_profiled_seconds = 0.0;
  std::optional<ScopedOpProfile> op_profile_scope;
  if (config.log.op_profile) op_profile_scope.emplace(&op_profile);
  std::vector<double> window_seconds;  // every rank's own step times after the first (re-planning)
  std::optional<Plan> pending_plan;     // re-planned, waiting for the next checkpoint
  for (std::int64_t step = first_step; step < config.train.steps; ++step) {
    if (step > first_step) {
      loop.stop_signal = stop_for_signal(run, step, checkpointed_step);
      if (loop.stop_signal != 0) break;
    }
    const runtime::StepResult result = run.executor.train_step(step);
    op_profiled_seconds += result.seconds;
    // Every rank's own peak (collective), for the row and the end-of-run prediction check.
    std::vector<double> rank_peak_bytes;
    for (const std::string& peak : world.gather_bytes(std::to_string(result.rank_peak_memory_bytes), 0))
      rank_peak_bytes.push_back(std::stod(peak));
    if (config.log.save_gradients && step == 0)
      save_tensors(run.directory + "/gradients.h5", "grad", run.graph, run.executor.gradients(), run.executor, world);
    PARTRAIN_CHECK(std::isfinite(result.loss), "step " << step << ": the loss is not finite (" << result.loss << ")");
    if (step == first_step) loop.first_loss = result.loss;
    loop.last_loss = result.loss;
    const bool evaluate = run.heldout && ((step + 1) % config.train.eval_every == 0 || step + 1 == config.train.steps);
    std::optional<double> eval_loss;
    if (evaluate) eval_loss = run.executor.evaluate(*run.heldout, config.train.eval_batches).loss();
    if (step > first_step) window_seconds.push_back(result.seconds);
    nlohmann::json replan_record;
    if (replans_after(run, replanning, first_step, step)) {
      ReplanOutcome outcome = check_prediction(run, replanning, first_step, window_seconds);
      replan_record = std::move(outcome.record);
      pending_plan = std::move(outcome.plan);
    }
    if (config.checkpoint.every > 0 && ((step + 1) % config.checkpoint.every == 0 || step + 1 == config.train.steps))
      if (checkpoint_or_warn(run, step + 1)) checkpointed_step = step + 1;
    // A new plan takes over at the next checkpoint; without periodic checkpoints, at once.
    const bool switching = pending_plan && step + 1 < config.train.steps &&
                           (checkpointed_step == step + 1 || config.checkpoint.every == 0);
    if (switching) {
      if (checkpointed_step != step + 1) save_checkpoint(run, step + 1);
      replan_record["switch_after_step"] = step + 1;
    }
    if (world.rank() == 0) {
      loop.step_seconds.push_back(result.seconds);
      for (std::size_t rank = 0; rank < rank_peak_bytes.size(); ++rank)
        loop.measured_peak_bytes[rank] =
            std::max(loop.measured_peak_bytes[rank], rank_peak_bytes[rank] - rank_baseline_bytes[rank]);
      record_step(run, step, result, eval_loss, rank_peak_bytes, rank_baseline_bytes, flops_per_sample, replan_record,
                  metrics);
    }
    if (switching) {
      loop.next_plan = std::move(pending_plan);
      loop.switch_checkpoint =
          (std::filesystem::path(run.checkpoint_directory) / io::checkpoint_file_name(step + 1)).string();
      break;
    }
  }
  op_profile_scope.reset();
  if (config.log.op_profile) print_op_profiles(op_profile, op_profiled_seconds, run.plan, world);
  return loop;
}

// After the steps: the Chrome trace ([log] trace), the final parameters ([log] save_parameters),
// and on rank 0 the first and last loss and the prediction's error. Collective.
void finish_run(const TrainingRun& run, std::int64_t first_step, const StepLoopResult& loop) {
  const ExperimentConfig& config = run.config;
  const bool leader = run.world.rank() == 0;
  if (!config.log.trace.empty()) {
    const std::vector<std::string> parts =
        run.world.gather_bytes(io::trace_events_to_json(run.executor.trace()).dump(), 0);
    if (leader) {
      std::vector<std::vector<io::TraceEvent>> events;
      for (const std::string& part : parts) events.push_back(io::trace_events_from_json(nlohmann::json::parse(part)));
      io::write_chrome_trace(run.directory + "/" + config.log.trace, events);
    }
  }
  if (config.log.save_parameters)
    save_tensors(run.directory + "/parameters.h5", "model", run.graph, run.executor.whole_state(), run.executor, run.world);
  if (leader && config.train.steps > first_step && loop.stop_signal == 0)
    std::printf("first loss %.6f, last loss %.6f after %lld steps\n", loop.first_loss, loop.last_loss,
                static_cast<long long>(config.train.steps));
  if (leader && !loop.step_seconds.empty())
    std::printf("%s\n", prediction_error_line(run.plan, loop.step_seconds,
                                              stage_peak_bytes(run.plan, loop.measured_peak_bytes)).c_str());
}

int train(const TrainArguments& arguments, comm::Communicator& world, bool& training_started) {
  const bool leader = world.rank() == 0;
  const ExperimentConfig config = load_experiment(arguments.config, arguments.overrides);
  check_train_request(config, arguments, world);
  const std::string directory = output_directory(config);
  const std::string checkpoint_directory = app::checkpoint_directory(config);
  std::string resume = !arguments.resume.empty() ? arguments.resume : config.checkpoint.resume;
  if (resume == "auto")  // a requeued job: resume when an earlier run of it left a checkpoint
    resume = decide_on_rank0(world, [&] {
      return io::list_checkpoints(checkpoint_directory).empty() ? std::string() : std::string("latest");
    });
  const bool checkpoint_elsewhere = !config.checkpoint.dir.empty() &&
                                    (config.checkpoint.every > 0 || resume == "latest") &&
                                    !is_within(checkpoint_directory, directory);
  const std::vector<io::RunLock> locks =
      lock_run_directories(directory, checkpoint_directory, checkpoint_elsewhere, world);
  std::string checkpoint_path = resume.empty() ? "" : resume_path(resume, checkpoint_directory, world);
  PlannedGraphs graphs(config);
  const Graph& model = graphs.model();
  const std::unique_ptr<io::BatchSource> data = io::make_batch_source(config, false);
  // Every rank computes on its node's GPU (one per rank, NCCL between them) or on the CPU (MPI).
  Backend& backend = select_backend(config.train.device, comm::MpiCommunicator::node_local_rank());
  const std::unique_ptr<comm::Communicator> device_world = comm::make_device_world(world, backend);
  comm::Communicator& run_world = device_world ? *device_world : world;
  // From here on the plan, not the config, says the global batch, degree, precision and optimizer.
  Plan plan = agree_on_plan(config, graphs, arguments.plan_file, true, world, run_world, backend);
  PARTRAIN_CHECK(!(config.log.save_gradients && plan.zero == 1),
                 "[log] save_gradients = true (" << config.path << ") needs whole reduced gradients, which ZeRO-1 "
                                                   "(the plan's zero = 1) keeps only in parts; use zero = 0");
  if (leader) announce_run(config, model, *data, plan, directory);
  if (leader && config.log.save_initial)
    save_initial(directory + "/initial_parameters.h5", config, plan, model, *data);
  const std::unique_ptr<io::BatchSource> heldout =
      config.train.eval_every > 0 ? io::make_batch_source(config, true) : nullptr;
  // Re-planning during training needs a plan made on profiled costs (not a --plan file).
  Replanning replanning{config.profile.enabled && arguments.plan_file.empty() &&
                            plan.cost_model.rfind("profiled", 0) == 0,
                        &graphs, &run_world};
  std::ofstream metrics;
  for (int segment = 0;; ++segment) {  // one segment per plan: a re-planned run goes on under the new one
    // The graph the plan's stages index: the model, or its tensor_parallel_graph for the plan's degree.
    const Graph& graph = graphs.of_degree(plan.tensor_parallel, plan.sequence_parallel);
    // What the process holds before the stage exists (graphs' constants, data, profiles): the
    // planners predict the stage's own memory, so the end-of-run check and the metrics' net peaks
    // (rank_peak_memory_bytes − rank_baseline_bytes) leave it out — as CAPSlog's trimmed runs do.
    backend.synchronise();
    const double baseline_bytes = static_cast<double>(backend.allocator().current_bytes());
    // The initial values are a temporary: the executor keeps its own stage's copy, so the whole model's
    // host copy does not sit in the allocator (and in the measured peak) for the whole run. They are
    // drawn for the whole model (the same numbers under any plan) and cut to this rank's tensor part.
    runtime::PipelineExecutor executor(
        graph, plan, run_world, backend, *data,
        initial_values(config, model, graph, plan.placement_of(world.rank()).tensor_rank),
        runtime_options(config.train, config.parallel));
    std::vector<double> rank_baseline_bytes;  // on rank 0: every rank's baseline_bytes
    for (const std::string& bytes : world.gather_bytes(std::to_string(baseline_bytes), 0))
      rank_baseline_bytes.push_back(std::stod(bytes));
    const std::int64_t first_step = checkpoint_path.empty() ? 0 : resume_from(checkpoint_path, graph, executor, world);
    training_started = true;

    const TrainingRun run{config, plan, model, graph, executor, *data, heldout.get(), world, directory, checkpoint_directory};
    if (segment == 0) metrics = open_metrics(directory, first_step, world);
    StepLoopResult loop = run_steps(run, replanning, first_step, rank_baseline_bytes, metrics);
    if (!loop.next_plan) {
      finish_run(run, first_step, loop);
      return loop.stop_signal != 0 ? kExitStoppedBySignal : 0;
    }
    if (leader) {  // the first plan stays next to the run's outputs
      std::filesystem::copy_file(directory + "/plan.json", directory + "/plan-before-replan.json",
                                 std::filesystem::copy_options::overwrite_existing);
      std::printf("replan: switching to the new plan after step %lld (plan-before-replan.json keeps the first)\n",
                  static_cast<long long>(first_step + static_cast<std::int64_t>(loop.step_seconds.size())));
      announce_run(config, model, *data, *loop.next_plan, directory);
    }
    plan = std::move(*loop.next_plan);
    checkpoint_path = loop.switch_checkpoint;
    replanning.enabled = false;  // once per job: a second correction would chase the noise of the first
  }
}

}  // namespace

int run_train(const TrainArguments& arguments) {
  install_stop_signal_handlers();
  return run_on_every_rank(
      [&](comm::Communicator& world, bool& training_started) { return train(arguments, world, training_started); });
}

}  // namespace partrain::app
