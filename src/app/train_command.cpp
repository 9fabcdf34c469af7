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
#include <functional>
#include <map>
#include <memory>

#include <omp.h>
#include <string>
#include <vector>

#include "app/commands.h"
#include "app/optimizer_profile.h"
#include "app/planning.h"
#include "app/prediction_report.h"
#include "app/stop_signals.h"
#include "comm/mpi_communicator.h"
#include "comm/device_communicator.h"
#include "core/allocator.h"
#include "core/backend_registry.h"
#include "core/collective_error.h"
#include "core/error.h"
#include "graph/tensor_parallel.h"
#include "io/batch_source.h"
#include "io/checkpoint.h"
#include "io/chrome_trace.h"
#include "io/hdf5_file.h"
#include "io/config.h"
#include "io/metrics_file.h"
#include "io/progress_bar.h"
#include "io/run_lock.h"
#include "models/model.h"
#include "partition/planner.h"
#include "partition/calibrated_cost_model.h"
#include "profile/communication_profile.h"
#include "profile/distributed_profiler.h"
#include "runtime/checkpointing.h"
#include "runtime/executor.h"

namespace partrain::app {
namespace {

constexpr const char* kErrorPrefix = "ERROR:";

// Runs `decide` on rank 0 only and gives its result to every rank. An error on rank 0 becomes the
// same error on every rank, so all ranks stop cleanly instead of waiting in a collective.
std::string decide_on_rank0(comm::Communicator& world, const std::function<std::string()>& decide) {
  std::string text;
  if (world.rank() == 0) {
    try {
      text = decide();
    } catch (const Error& error) {
      text = std::string(kErrorPrefix) + error.message();
    }
  }
  world.broadcast_bytes(text, 0);
  if (text.rfind(kErrorPrefix, 0) == 0) PARTRAIN_FAIL(text.substr(std::string(kErrorPrefix).size()));
  return text;
}

// The ProfileDB backend key: what changes a measurement. One GPU model's measurements are not
// reused on another; on the CPU the ranks of a node share its cores, so the key holds how many ranks
// run per node and with how many threads each (a cache measured by 4 ranks on 2 cores would price a
// 2-rank plan at oversubscribed speed). Collective over MPI_COMM_WORLD.
std::string profile_backend_name(const Backend& backend) {
  const int ranks_per_node = comm::MpiCommunicator::node_local_size();
  if (!backend.device().is_cpu()) return "cuda:" + gpu_backend()->device_name(backend.device().index);
  return "cpu-" + std::to_string(ranks_per_node) + "ranks-" + std::to_string(omp_get_max_threads()) + "threads";
}

// Distributed profiling (DESIGN.md "Profiling"): rank 0 lists every layer at microbatch sizes 1, 2,
// 4, ... (what the calibrated cost model needs), drops what its cached ProfileDB already holds, and
// every rank measures its share. Collective over `world`; returns the complete DB on every rank.
profile::ProfileDB profile_layers(const ExperimentConfig& config, const Graph& graph, comm::Communicator& world,
                                  comm::Communicator& device_world, Backend& backend) {
  const std::string backend_name = profile_backend_name(backend);
  profile::ProfileDB database(graph.hash(), backend_name, config.train.precision);
  const std::string cache = config.profile.cache_dir + "/" +
                            profile::ProfileDB::cache_file_name(graph.hash(), database.backend(), database.dtype());
  std::vector<profile::ProfileRequest> requests;
  if (world.rank() == 0) {
    if (std::filesystem::exists(cache)) {
      try {
        database = profile::ProfileDB::load(cache);
      } catch (const Error& error) {  // a damaged cache is measured again, not fatal
        std::printf("profile: ignoring %s: %s\n", cache.c_str(), error.message().c_str());
        database = profile::ProfileDB(graph.hash(), backend_name, config.train.precision);
      }
    }
    requests = partition::calibration_requests(graph, config.train.global_batch);
  }
  profile::ProfilerOptions options;
  options.warmup = static_cast<int>(config.profile.warmup);
  options.repeats = static_cast<int>(config.profile.repeats);
  options.seed = static_cast<std::uint64_t>(config.train.seed);
  options.mixed_precision = config.train.precision == "bf16";
  ProgressBar progress("profiling on " + std::to_string(world.size()) + " ranks");
  const profile::DistributedProfileReport report = profile::profile_distributed(
      graph, requests, world, backend, options, database, [&progress](double fraction) { progress.update(fraction); });
  progress.finish();
  // Point-to-point and all-reduce costs on the communicator training uses, once per cache.
  std::string measure = "0";
  if (world.rank() == 0) {
    const auto& groups = database.communication().allreduce;
    measure = world.size() > 1 && (groups.empty() || groups.rbegin()->first < world.size()) ? "1" : "0";
  }
  world.broadcast_bytes(measure, 0);
  if (measure == "1") {
    profile::CommunicationProfile communication = profile::measure_communication(device_world, backend);
    if (world.rank() == 0) {
      std::printf("profile: communication (%s): p2p %.1f us + %.2f GB/s; all-reduce over %d ranks %.1f us + %.2f GB/s\n",
                  communication.communicator.c_str(), communication.within_node.latency_seconds * 1e6,
                  communication.within_node.bytes_per_second / 1e9, communication.allreduce.rbegin()->first,
                  communication.allreduce.rbegin()->second.latency_seconds * 1e6,
                  communication.allreduce.rbegin()->second.bytes_per_second / 1e9);
      database.set_communication(std::move(communication));
    }
  }
  // The optimizer step's cost per parameter byte (rank 0 plans; it measures on its own device).
  if (world.rank() == 0 && !database.optimizer_seconds_per_byte().count(config.train.optimizer)) {
    const double seconds = measure_optimizer_seconds_per_byte(backend, config.train.optimizer,
                                                              runtime_options(config.train).optimizer);
    database.set_optimizer_seconds_per_byte(config.train.optimizer, seconds);
    std::printf("profile: %s step %.3f ms per million parameters\n", config.train.optimizer.c_str(), seconds * 4e9);
  }
  if (world.rank() == 0) {
    std::filesystem::create_directories(config.profile.cache_dir);
    database.save(cache);
    std::printf("profile: measured %zu task sets on %d ranks; %zu measurements in %s\n", report.requests.size(),
                world.size(), database.size(), cache.c_str());
  }
  return database;
}

// Rank 0 plans (on profiled or analytic costs) or loads --plan, and broadcasts the plan as JSON; a
// planning error on rank 0 becomes the same error on every rank, so all ranks stop cleanly.
Plan agree_on_plan(const ExperimentConfig& config, const Graph& graph, const TrainArguments& arguments,
                   comm::Communicator& world, comm::Communicator& device_world, Backend& backend) {
  const bool profiling = config.profile.enabled && arguments.plan_file.empty();
  const profile::ProfileDB database =
      profiling ? profile_layers(config, graph, world, device_world, backend) : profile::ProfileDB();
  const std::string text = decide_on_rank0(world, [&] {
    Plan plan;
    if (!arguments.plan_file.empty()) {
      plan = Plan::load(arguments.plan_file);
    } else {
      PlanningSetup setup = planning_setup(config, world.size());
      const std::unique_ptr<partition::CostModel> cost =
          profiling ? partition::make_calibrated_cost_model(graph, database, setup.device)
                    : partition::make_analytic_cost_model(graph, setup.device);
      ProgressBar progress("planning (" + setup.options.planner + ")");
      setup.options.progress = [&progress](double fraction) { progress.update(fraction); };
      plan = partition::make_plan(graph, *cost, setup.options);
      progress.finish();
    }
    PARTRAIN_CHECK(plan.world_size == world.size(), (arguments.plan_file.empty() ? "the plan" : arguments.plan_file)
                                                        << " is for " << plan.world_size << " ranks, but "
                                                        << world.size() << " are running");
    if (!arguments.plan_file.empty()) check_plan_matches_config(plan, config, arguments.plan_file);
    plan.validate(graph);
    return plan.to_json().dump();
  });
  return Plan::from_json(nlohmann::json::parse(text), "broadcast plan");
}

std::string output_directory(const ExperimentConfig& config) {
  if (!config.log.dir.empty()) return config.log.dir;
  return "runs/" + std::filesystem::path(config.path).stem().string();
}

// Whether `path` is `directory` or lies below it (lexically, after making both absolute).
bool is_within(const std::string& path, const std::string& directory) {
  const std::filesystem::path inner = std::filesystem::absolute(path).lexically_normal();
  const std::filesystem::path outer = std::filesystem::absolute(directory).lexically_normal();
  const std::filesystem::path relative = inner.lexically_relative(outer);
  return !relative.empty() && *relative.begin() != "..";
}

// Training FLOPs of one sample: forward FLOPs of the batch-dependent tasks × 3 (backward ≈ 2 × forward).
double training_flops_per_sample(const Graph& graph) {
  double flops = 0;
  for (const Task& task : graph.tasks())
    if (!task.constant) flops += task.cost.forward_flops;
  return 3 * flops;
}

// Rank 0 writes `tensors` (by value id, from the first replica of each stage in pipeline copy 0:
// the executor's parameters and buffers, or its gradients) to `path` as /<group>/<name> (f32, the
// tensor's shape).
void save_tensors(const std::string& path, const std::string& group, const Graph& graph,
                  const std::unordered_map<int, Tensor>& tensors, const runtime::PipelineExecutor& executor,
                  comm::Communicator& world) {
  std::string bytes;
  const Placement placement = executor.placement();
  if (placement.copy == 0 && placement.replica == 0) {
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

// Rank 0 writes what an independent reference needs to redo the first steps (validation/golden):
// every initial parameter and buffer as /model/<name> (f32) and the samples of every step (samples
// [0, steps * global_batch) of the run's stream, step k's global batch being rows [k * B, (k + 1) * B))
// as /batch/<input or label name> (f32 or i64), with the config TOML as the attribute "config".
void save_initial(const std::string& path, const ExperimentConfig& config, const Graph& graph,
                  const io::BatchSource& data) {
  io::Hdf5File file = io::Hdf5File::create(path);
  file.write_string_attribute("/", "config", config.text);
  const std::unordered_map<int, Tensor> initial =
      initialize_parameters(graph, static_cast<std::uint64_t>(config.train.seed), config.model.initializer_range);
  for (const auto& [value, tensor] : initial)
    file.write("model/" + graph.value(value).name, graph.value(value).type.shape, tensor.to_float_vector());
  for (const auto& [name, tensor] : data.samples(0, config.train.steps * config.train.global_batch)) {
    const Shape& shape = tensor.shape();
    if (tensor.dtype() == DType::I64) {
      const std::int64_t* begin = tensor.data<std::int64_t>();
      file.write("batch/" + name, shape, std::vector<std::int64_t>(begin, begin + tensor.numel()));
    } else {
      file.write("batch/" + name, shape, tensor.to_float_vector());
    }
  }
}

// Writes checkpoint `step` collectively (parallel HDF5; each tensor by the first replica of the first
// stage holding it) and keeps the newest [checkpoint] keep.
void save_checkpoint(const ExperimentConfig& config, const std::string& directory, std::int64_t step, const Graph& graph,
                     const Plan& plan, const runtime::PipelineExecutor& executor, comm::Communicator& world) {
  io::CheckpointInfo info;
  info.step = step;
  info.consumed_samples = step * config.train.global_batch;
  info.data_cursor = info.consumed_samples;
  info.seed = static_cast<std::uint64_t>(config.train.seed);
  info.lr_step = step;
  info.config_toml = config.text;
  info.plan_json = plan.to_json().dump();
  info.optimizer = config.train.optimizer;
  const std::string path = io::write_checkpoint(world, directory, info, runtime::checkpoint_tensors(graph, plan, executor),
                                                static_cast<int>(config.checkpoint.keep));
  if (world.rank() == 0) {
    std::printf("checkpoint: %s\n", path.c_str());
    std::fflush(stdout);
  }
}

// save_checkpoint under [checkpoint] on_error: a write that failed on any rank (the same
// CollectiveError on every rank) stops the run ("stop"), or is a warning on rank 0 and training goes
// on ("continue"). Returns whether the checkpoint was written.
bool checkpoint_or_warn(const ExperimentConfig& config, const std::string& directory, std::int64_t step,
                        const Graph& graph, const Plan& plan, const runtime::PipelineExecutor& executor,
                        comm::Communicator& world) {
  try {
    save_checkpoint(config, directory, step, graph, plan, executor, world);
    return true;
  } catch (const CollectiveError& error) {
    if (config.checkpoint.on_error != "continue") throw;
    if (world.rank() == 0) {
      std::printf("warning: %s; training goes on ([checkpoint] on_error = \"continue\")\n", error.message().c_str());
      std::fflush(stdout);
    }
    return false;
  }
}

// The checkpoint to resume from: `resume` "latest" is the newest valid checkpoint in `directory`
// (rank 0 says which damaged ones it skipped), else the path itself (check_train_request found it).
// Decided on rank 0 before profiling and planning, so a run with nothing to resume stops at once.
std::string resume_path(const std::string& resume, const std::string& directory, comm::Communicator& world) {
  return decide_on_rank0(world, [&] {
    if (resume != "latest") return resume;  // checked by check_train_request
    std::vector<std::string> skipped;
    std::string chosen = io::latest_valid_checkpoint(directory, &skipped);
    for (const std::string& reason : skipped) std::printf("resume: skipping %s\n", reason.c_str());
    return chosen;
  });
}

// Restores the run from the checkpoint at `path` (every rank reads the file); returns the step to
// continue at.
std::int64_t resume_from(const std::string& path, const Graph& graph, runtime::PipelineExecutor& executor,
                         comm::Communicator& world) {
  const io::Checkpoint checkpoint =
      io::read_checkpoint(path, runtime::required_checkpoint_tensors(graph, executor.optimizer().state_names()));
  runtime::restore_checkpoint(checkpoint, graph, executor);
  if (world.rank() == 0) {
    std::printf("resume: %s (step %lld)\n", path.c_str(), static_cast<long long>(checkpoint.info.step));
    std::fflush(stdout);
  }
  return checkpoint.info.step;
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
    const auto readable = [](const std::string& path) {
      return std::filesystem::is_regular_file(path) && std::ifstream(path).good();
    };
    PARTRAIN_CHECK(arguments.plan_file.empty() || readable(arguments.plan_file),
                   "--plan " << arguments.plan_file << ": no such readable plan file (make one with `partrain plan "
                             << config.path << " --save FILE`)");
    PARTRAIN_CHECK(resume.empty() || resume == "latest" || resume == "auto" || readable(resume),
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

int train(const TrainArguments& arguments, comm::Communicator& world, bool& training_started) {
  const bool leader = world.rank() == 0;
  const ExperimentConfig config = load_experiment(arguments.config, arguments.overrides);
  check_train_request(config, arguments, world);
  const std::string directory = output_directory(config);
  const std::string checkpoint_directory =
      config.checkpoint.dir.empty() ? directory + "/checkpoints" : config.checkpoint.dir;
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
  const std::string checkpoint_path = resume.empty() ? "" : resume_path(resume, checkpoint_directory, world);
  // The tensor-parallel degree: the loaded plan's, or [parallel] tensor_parallel.
  const int tensor_parallel =
      arguments.plan_file.empty()
          ? static_cast<int>(config.parallel.tensor_parallel)
          : std::stoi(decide_on_rank0(world, [&] { return std::to_string(Plan::load(arguments.plan_file).tensor_parallel); }));
  const Graph model = build_model(config.model);
  const Graph graph = planned_graph(config, tensor_parallel);
  const std::unique_ptr<io::BatchSource> data = io::make_batch_source(config, false);
  // Every rank computes on its node's GPU (one per rank, NCCL between them) or on the CPU (MPI).
  Backend& backend = select_backend(config.train.device, comm::MpiCommunicator::node_local_rank());
  const std::unique_ptr<comm::Communicator> device_world = comm::make_device_world(world, backend);
  comm::Communicator& run_world = device_world ? *device_world : world;
  const Plan plan = agree_on_plan(config, graph, arguments, world, run_world, backend);

  PARTRAIN_CHECK(!(config.log.save_gradients && plan.zero == 1),
                 "[log] save_gradients = true (" << config.path << ") needs whole reduced gradients, which ZeRO-1 "
                                                   "(the plan's zero = 1) keeps only in parts; use zero = 0");
  if (leader) {
    std::printf("model: %s (%s, %lld parameters), data: %s (%lld samples per epoch)\n", config.path.c_str(),
                config.model.type.c_str(), static_cast<long long>(model.parameter_count()), data->path().c_str(),
                static_cast<long long>(data->samples_per_epoch()));
    std::fputs(format_plan_table(plan).c_str(), stdout);
    plan.save(directory + "/plan.json");
    std::printf("outputs: %s/ (plan.json, metrics.jsonl%s)\n", directory.c_str(),
                config.log.trace.empty() ? "" : (", " + config.log.trace).c_str());
    std::fflush(stdout);
  }

  if (leader && config.log.save_initial) save_initial(directory + "/initial_parameters.h5", config, model, *data);
  // The initial values are a temporary: the executor keeps its own stage's copy, so the whole model's
  // host copy does not sit in the allocator (and in the measured peak) for the whole run. They are
  // drawn for the whole model (the same numbers under any plan) and cut to this rank's tensor part.
  runtime::PipelineExecutor executor(
      graph, plan, run_world, backend, *data,
      shard_values(model,
                   initialize_parameters(model, static_cast<std::uint64_t>(config.train.seed), config.model.initializer_range),
                   graph, plan.placement_of(world.rank()).tensor_rank),
      runtime_options(config.train));
  const std::unique_ptr<io::BatchSource> heldout =
      config.train.eval_every > 0 ? io::make_batch_source(config, true) : nullptr;

  const std::int64_t first_step = checkpoint_path.empty() ? 0 : resume_from(checkpoint_path, graph, executor, world);
  training_started = true;

  std::ofstream metrics;
  if (leader) {  // a resumed run appends to the metrics of the run it continues, less the steps it redoes
    if (first_step > 0) {
      const std::int64_t dropped = io::drop_metrics_after(directory + "/metrics.jsonl", first_step);
      if (dropped > 0)
        std::printf("resume: dropped %lld rows of %s/metrics.jsonl past step %lld\n", static_cast<long long>(dropped),
                    directory.c_str(), static_cast<long long>(first_step));
    }
    metrics.open(directory + "/metrics.jsonl", first_step > 0 ? std::ios::app : std::ios::trunc);
    PARTRAIN_CHECK(metrics, directory << "/metrics.jsonl: cannot write");
  }
  const double flops_per_sample = training_flops_per_sample(model);  // the whole model's, not one rank's part
  double first_loss = NAN, last_loss = NAN;
  std::vector<double> step_seconds, measured_peak_bytes(static_cast<std::size_t>(world.size()), 0.0);
  std::int64_t checkpointed_step = first_step;  // the step of the newest checkpoint on disk
  int stop_signal = 0;
  for (std::int64_t step = first_step; step < config.train.steps; ++step) {
    // SIGUSR1/SIGTERM on any rank: every rank stops at the same step boundary (one all-reduce).
    if (step > first_step) {
      stop_signal = static_cast<int>(world.all_reduce_scalar(received_stop_signal(), comm::ReduceOp::Max));
      if (stop_signal != 0) {
        const std::string path = (std::filesystem::path(checkpoint_directory) / io::checkpoint_file_name(step)).string();
        if (checkpointed_step != step) save_checkpoint(config, checkpoint_directory, step, graph, plan, executor, world);
        if (leader) {
          std::printf("stopped by %s after step %lld of %lld: checkpoint %s; resume with --resume latest (exit code %d)\n",
                      stop_signal_name(stop_signal), static_cast<long long>(step),
                      static_cast<long long>(config.train.steps), path.c_str(), kExitStoppedBySignal);
          std::fflush(stdout);
        }
        break;
      }
    }
    const runtime::StepResult result = executor.train_step(step);
    // Every rank's own peak (collective), for the row and the end-of-run prediction check.
    const std::vector<std::string> rank_peaks = world.gather_bytes(std::to_string(result.rank_peak_memory_bytes), 0);
    std::vector<double> rank_peak_bytes;
    for (const std::string& peak : rank_peaks) rank_peak_bytes.push_back(std::stod(peak));
    if (config.log.save_gradients && step == 0)
      save_tensors(directory + "/gradients.h5", "grad", graph, executor.gradients(), executor, world);
    PARTRAIN_CHECK(std::isfinite(result.loss), "step " << step << ": the loss is not finite (" << result.loss << ")");
    if (step == first_step) first_loss = result.loss;
    last_loss = result.loss;
    const bool evaluate = heldout && ((step + 1) % config.train.eval_every == 0 || step + 1 == config.train.steps);
    const double eval_loss = evaluate ? executor.evaluate(*heldout, config.train.eval_batches) : NAN;
    if (config.checkpoint.every > 0 && ((step + 1) % config.checkpoint.every == 0 || step + 1 == config.train.steps))
      if (checkpoint_or_warn(config, checkpoint_directory, step + 1, graph, plan, executor, world))
        checkpointed_step = step + 1;
    if (!leader) continue;
    const double samples_per_second = config.train.global_batch / result.seconds;
    const double tokens_per_second = samples_per_second * data->tokens_per_sample();
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
                              {"predicted_seconds", plan.predicted_step_seconds},
                              {"rank_peak_memory_bytes", rank_peak_bytes}};
    step_seconds.push_back(result.seconds);
    for (std::size_t rank = 0; rank < rank_peak_bytes.size(); ++rank)
      measured_peak_bytes[rank] = std::max(measured_peak_bytes[rank], rank_peak_bytes[rank]);
    if (evaluate) record["eval_loss"] = eval_loss;
    metrics << record.dump() << '\n';
    metrics.flush();
    if ((step + 1) % config.log.every == 0 || step + 1 == config.train.steps) {
      std::printf("step %lld/%lld | loss %.6f | lr %.3e | grad_norm %.4f | %.1f samples/s | %.0f tokens/s | "
                  "%.4f TFLOP/s | peak %.1f MiB | predicted %.3f s/step\n",
                  static_cast<long long>(step + 1), static_cast<long long>(config.train.steps), result.loss, result.lr,
                  result.grad_norm, samples_per_second, tokens_per_second, tflops,
                  result.peak_memory_bytes / (1 << 20), plan.predicted_step_seconds);
      std::fflush(stdout);
    }
    if (evaluate) {
      std::printf("eval after step %lld | held-out loss %.6f over %lld batches\n", static_cast<long long>(step + 1),
                  eval_loss, static_cast<long long>(config.train.eval_batches));
      std::fflush(stdout);
    }
  }

  if (!config.log.trace.empty()) {
    const std::vector<std::string> parts = world.gather_bytes(io::trace_events_to_json(executor.trace()).dump(), 0);
    if (leader) {
      std::vector<std::vector<io::TraceEvent>> events;
      for (const std::string& part : parts) events.push_back(io::trace_events_from_json(nlohmann::json::parse(part)));
      io::write_chrome_trace(directory + "/" + config.log.trace, events);
    }
  }
  if (config.log.save_parameters)
    save_tensors(directory + "/parameters.h5", "model", graph, executor.state(), executor, world);
  if (leader && config.train.steps > first_step && stop_signal == 0)
    std::printf("first loss %.6f, last loss %.6f after %lld steps\n", first_loss, last_loss,
                static_cast<long long>(config.train.steps));
  if (leader && !step_seconds.empty())
    std::printf("%s\n", prediction_error_line(plan, step_seconds, stage_peak_bytes(plan, measured_peak_bytes)).c_str());
  return stop_signal != 0 ? kExitStoppedBySignal : 0;
}

}  // namespace

int run_train(const TrainArguments& arguments) {
  comm::MpiSession session;
  std::unique_ptr<comm::Communicator> world = comm::MpiCommunicator::world();
  install_stop_signal_handlers();
  bool training_started = false;
  try {
    return train(arguments, *world, training_started);
  } catch (const CollectiveError& error) {
    // Every rank has this error (agreed collectively): one line, and every rank ends normally.
    if (world->rank() == 0) std::fprintf(stderr, "partrain: error: %s\n", error.message().c_str());
    return 1;
  } catch (const Error& error) {
    if (training_started && world->size() > 1) {
      // Past setup an error may be one rank's alone (a damaged file, a full disk) while the others
      // wait in a collective: say which rank and end them all.
      std::fprintf(stderr, "partrain: error on rank %d: %s\n", world->rank(), error.message().c_str());
      std::fflush(stderr);
      comm::MpiSession::abort(1);
    }
    // Errors every rank meets alike (config, data, plan) are printed once; errors of one rank abort all.
    if (world->rank() == 0) std::fprintf(stderr, "partrain: error: %s\n", error.message().c_str());
    return 1;
  }
}

}  // namespace partrain::app
