// Agreeing on a plan (docs/architecture.md §Data flow): distributed profiling of the layers over every
// rank, then rank 0 plans (or loads a saved plan) and broadcasts it. What `partrain train` and
// `partrain eval` share, so both run a checkpoint under plans made the same way.
#include "app/plan_agreement.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <omp.h>

#include "app/capslog_profiling.h"
#include "app/collective_decision.h"
#include "app/optimizer_profile.h"
#include "app/planning.h"
#include "comm/mpi_communicator.h"
#include "core/backend_registry.h"
#include "core/error.h"
#include "io/progress_bar.h"
#include "models/bert.h"
#include "partition/common/calibrated_cost_model.h"
#include "partition/capslog/capslog_profiling.h"
#include "partition/planner.h"
#include "profile/communication_profile.h"
#include "profile/distributed_profiler.h"
#include "profile/machine_load.h"
#include "profile/speed_calibration.h"
#include "profile/speed_reference.h"
#include <nlohmann/json.hpp>

namespace partrain::app {
namespace {

// The ProfileDB backend key: what changes a measurement. One GPU model's measurements are not
// reused on another; on the CPU the ranks of a node share its cores, so the key holds how many ranks
// run per node and with how many threads each (a cache measured by 4 ranks on 2 cores would price a
// 2-rank plan at oversubscribed speed). Layers timed with warm caches ([profile] flush_caches =
// false) are another measurement again. Collective over MPI_COMM_WORLD.
std::string profile_backend_name(const Backend& backend, const ExperimentConfig& config) {
  const int ranks_per_node = comm::MpiCommunicator::node_local_size();
  const std::string caches = config.profile.flush_caches ? "" : "-warm";
  if (!backend.device().is_cpu()) return "cuda:" + gpu_backend()->device_name(backend.device().index) + caches;
  return "cpu-" + std::to_string(ranks_per_node) + "ranks-" + std::to_string(omp_get_max_threads()) + "threads" + caches;
}

// A cache measured under other conditions than the run's: other processes kept a different number
// of cores busy (profile::other_load_differs), or the cache did not record its load. Then its times
// are scaled for this run by `speed_ratio` (its layers' time now over their cached time) when that
// is beyond profile::kCalibrationTolerance, and the run says so; the cache keeps its own speed
// (profile::at_recorded_speed). Under the same load, a speed difference is this machine's
// run-to-run noise (a VM: 0.8-1.6x in one minute, uncorrelated with the steps that followed), and
// the cache is used as measured. Returns the factor applied (1: none).
double adapt_to_current_speed(profile::ProfileDB& database, double speed_ratio, double other_load_cores,
                              std::size_t references, const std::string& cache) {
  const double cached_load = database.other_load_cores();
  const bool known = cached_load >= 0 && other_load_cores >= 0;
  if (known && !profile::other_load_differs(cached_load, other_load_cores)) {
    if (std::abs(speed_ratio - 1) > profile::kCalibrationTolerance)
      std::printf("profile: %s: %zu of its layers now take %.2fx their cached time under the same load (%.1f cores "
                  "busy with other processes then, %.1f now): used as measured ([profile] refresh = true measures "
                  "again)\n",
                  cache.c_str(), references, speed_ratio, cached_load, other_load_cores);
    return 1.0;
  }
  const double factor = profile::adapt_to_speed(database, speed_ratio);
  if (factor != 1.0 && known)
    std::printf("profile: %s was measured under other load (%.1f cores busy with other processes then, %.1f now; %zu of "
                "its layers take %.2fx their cached time): its times are scaled by %.2f for this run ([profile] "
                "refresh = true measures again)\n",
                cache.c_str(), cached_load, other_load_cores, references, speed_ratio, factor);
  else if (factor != 1.0)
    std::printf("profile: %s was measured at another speed (%zu of its layers now take %.2fx their cached time): its "
                "times are scaled by %.2f for this run ([profile] refresh = true measures again)\n",
                cache.c_str(), references, speed_ratio, factor);
  return factor;
}

// How the profiler measures for this run: the passes of [profile], the run's precision, and BERT's
// masked-language-model labels counting at [data] mask_probability.
profile::ProfilerOptions profiler_options(const ExperimentConfig& config) {
  profile::ProfilerOptions options;
  options.warmup = static_cast<int>(config.profile.warmup);
  options.repeats = static_cast<int>(config.profile.repeats);
  options.flush_caches = config.profile.flush_caches;
  options.seed = static_cast<std::uint64_t>(config.train.seed);
  options.mixed_precision = config.train.precision != "fp32";
  options.compute_dtype = config.train.precision == "fp16" ? DType::F16 : DType::BF16;
  // BERT's MLM loss counts only the masked tokens: timed on all-valid labels it computed every
  // position's softmax, which training skips (the profile over-priced BERT's last stage).
  if (config.model.type == "bert") options.counted_label_shares[kBertMaskedLanguageModelLoss] = config.data.mask_probability;
  return options;
}

// Rank 0's cached ProfileDB at `cache`: empty (a new cache) when there is none, when [profile]
// refresh = true, or when it is damaged (measured again, not fatal). Other ranks get an empty DB.
profile::ProfileDB load_cache(const ExperimentConfig& config, const Graph& graph, const std::string& backend_name,
                              const std::string& cache, bool leader) {
  profile::ProfileDB empty(graph.hash(), backend_name, config.train.precision);
  if (!leader || !std::filesystem::exists(cache)) return empty;
  if (config.profile.refresh) {
    std::printf("profile: [profile] refresh = true: measuring again instead of using %s\n", cache.c_str());
    return empty;
  }
  try {
    return profile::ProfileDB::load(cache);
  } catch (const Error& error) {
    std::printf("profile: ignoring %s: %s\n", cache.c_str(), error.message().c_str());
    return empty;
  }
}

// The cache's speed against this run's (docs/planning.md §Profiling): rank 0 names a few cached
// layers of `requests`, every rank times them while the other load is measured, and rank 0 adapts
// `database` (adapt_to_current_speed). Returns the factor applied to the cached times (rank 0; 1
// elsewhere). Collective over `world`.
double adapt_cache_to_run(profile::ProfileDB& database, const Graph& graph,
                          const std::vector<profile::ProfileRequest>& requests, const profile::ProfilerOptions& options,
                          const std::string& cache, comm::Communicator& world, Backend& backend) {
  std::string reference_text;
  if (world.rank() == 0)
    reference_text = profile::speed_references_to_text(profile::choose_speed_references(database, requests));
  world.broadcast_bytes(reference_text, 0);
  const std::vector<profile::SpeedReference> references = profile::speed_references_from_text(reference_text);
  if (references.empty()) return 1.0;  // a new cache (the same on every rank: broadcast)
  const profile::OtherLoadMeter meter;
  const double speed_ratio = profile::measured_speed_ratio(graph, references, backend, world, options);
  const double load_now = profile::other_load_cores(meter, world, comm::MpiCommunicator::node_local_size());
  return world.rank() == 0 ? adapt_to_current_speed(database, speed_ratio, load_now, references.size(), cache) : 1.0;
}

// Point-to-point and all-reduce costs on the communicator training uses, once per cache (rank 0's
// `database` gets them). Collective over `world` and `device_world`.
void measure_communication_once(profile::ProfileDB& database, comm::Communicator& world,
                                comm::Communicator& device_world, Backend& backend) {
  std::string measure = "0";
  if (world.rank() == 0) {
    const auto& groups = database.communication().allreduce;
    measure = world.size() > 1 && (groups.empty() || groups.rbegin()->first < world.size()) ? "1" : "0";
  }
  world.broadcast_bytes(measure, 0);
  if (measure != "1") return;
  profile::CommunicationProfile communication = profile::measure_communication(device_world, backend);
  if (world.rank() != 0) return;
  std::printf("profile: communication (%s): p2p %.1f us + %.2f GB/s; all-reduce over %d ranks %.1f us + %.2f GB/s\n",
              communication.communicator.c_str(), communication.within_node.latency_seconds * 1e6,
              communication.within_node.bytes_per_second / 1e9, communication.allreduce.rbegin()->first,
              communication.allreduce.rbegin()->second.latency_seconds * 1e6,
              communication.allreduce.rbegin()->second.bytes_per_second / 1e9);
  database.set_communication(std::move(communication));
}

// Distributed profiling (docs/planning.md §Profiling): rank 0 lists every layer at microbatch sizes 1,
// 2, 4, ... (what the calibrated cost model needs), drops what its cached ProfileDB already holds, and
// every rank measures its share. A new cache records the conditions it was measured under (speed
// calibration, other load); a cached one is adapted to this run's (adapt_cache_to_run) and saved at
// its own speed. Collective over `world`; returns the complete DB on every rank.
profile::ProfileDB profile_layers(const ExperimentConfig& config, const Graph& graph, comm::Communicator& world,
                                  comm::Communicator& device_world, Backend& backend) {
  const bool leader = world.rank() == 0;
  const std::string cache = profile_cache_path(config, graph, backend);
  profile::ProfileDB database = load_cache(config, graph, profile_backend_name(backend, config), cache, leader);
  profile::ProfilerOptions options = profiler_options(config);
  std::vector<profile::ProfileRequest> requests;
  if (leader) requests = partition::calibration_requests(graph, config.train.global_batch);
  // A new cache (or an older one without them) records the conditions it is measured under.
  const bool record_conditions =
      world.all_reduce_scalar(leader && database.calibration_seconds() == 0 ? 1.0 : 0.0, comm::ReduceOp::Max) > 0;
  if (record_conditions) {
    const double calibration = profile::speed_calibration_seconds(backend, world);  // collective
    if (leader) database.set_calibration_seconds(calibration);
  }
  // The cache a stage's data must fit to run warm: a CPU's last-level cache is shared by the node's
  // ranks, a GPU's L2 is its own.
  const int sharing_ranks = backend.device().is_cpu() ? comm::MpiCommunicator::node_local_size() : 1;  // (collective)
  const double cache_bytes_per_rank = backend.flushed_cache_bytes() / sharing_ranks;
  options.warm_cache_bytes = cache_bytes_per_rank;
  if (leader && database.cache_bytes_per_rank() == 0) database.set_cache_bytes_per_rank(cache_bytes_per_rank, sharing_ranks);
  // Ranks that share their node's cores (more ranks times threads than the node's CPUs, as 4 ranks on
  // 2 cores) are timed by CPU time, the seconds on cores of their own, and a new cache says so: the
  // simulator then shares the cores among the ranks computing at each moment (TimelineCosts).
  const int node_cpus = backend.device().is_cpu() ? comm::MpiCommunicator::node_cpu_count() : 0;  // (collective)
  const double concurrent_ranks = node_cpus / static_cast<double>(omp_get_max_threads());
  options.cpu_time = backend.device().is_cpu() && sharing_ranks > concurrent_ranks;
  if (leader && options.cpu_time && database.size() == 0) {
    database.set_core_sharing(sharing_ranks, concurrent_ranks);
    std::printf("profile: %d ranks share this node's %d CPUs (%d threads each): layers are timed by CPU time, and "
                "the plan's simulator shares the cores\n",
                sharing_ranks, node_cpus, omp_get_max_threads());
  }
  const double speed_factor = adapt_cache_to_run(database, graph, requests, options, cache, world, backend);

  io::ProgressBar progress("profiling on " + std::to_string(world.size()) + " ranks");
  const profile::OtherLoadMeter profiling_meter;
  const profile::DistributedProfileReport report = profile::profile_distributed(
      graph, requests, world, backend, options, database, [&progress](double fraction) { progress.update(fraction); });
  progress.finish();
  if (record_conditions) {  // the load the layers were measured under (−1 when the window was too short to tell)
    const double load = profile::other_load_cores(profiling_meter, world, comm::MpiCommunicator::node_local_size());
    if (leader) database.set_other_load_cores(load);
  }
  measure_communication_once(database, world, device_world, backend);
  // The optimizer step's cost per parameter byte (rank 0 plans; it measures on its own device).
  if (leader && !database.optimizer_seconds_per_byte().count(config.train.optimizer)) {
    const double seconds = measure_optimizer_seconds_per_byte(backend, config.train.optimizer,
                                                              runtime_options(config.train).optimizer, 5,
                                                              options.cpu_time,
                                                              options.mixed_precision ? options.compute_dtype : DType::F32);
    database.set_optimizer_seconds_per_byte(config.train.optimizer, seconds);
    std::printf("profile: %s step %.3f ms per million parameters\n", config.train.optimizer.c_str(), seconds * 4e9);
  }
  if (leader) {
    std::filesystem::create_directories(config.profile.cache_dir);
    profile::at_recorded_speed(database, speed_factor).save(cache);
    std::printf("profile: measured %zu task sets on %d ranks; %zu measurements in %s\n", report.requests.size(),
                world.size(), database.size(), cache.c_str());
  }
  return database;
}

}  // namespace

std::string profile_cache_path(const ExperimentConfig& config, const Graph& graph, const Backend& backend) {
  return config.profile.cache_dir + "/" +
         profile::ProfileDB::cache_file_name(graph.hash(), profile_backend_name(backend, config), config.train.precision);
}

Plan agree_on_plan(const ExperimentConfig& config, PlannedGraphs& graphs, const std::string& plan_file, bool profile,
                   comm::Communicator& world, comm::Communicator& device_world, Backend& backend,
                   const profile::ProfileDB* corrected_profile) {
  const Graph& model = graphs.model();
  const bool profiling = profile && config.profile.enabled && plan_file.empty();
  // A GPU run plans for its GPUs' own memory (the smallest over the ranks) unless the config sets
  // device_memory; CPU backends report none and keep the config's.
  const double device_memory = world.all_reduce_scalar(
      config.parallel.device_memory_given ? 0.0 : backend.device_memory_bytes(), comm::ReduceOp::Min);
  // The graphs the planner may choose among, each with its measurements (the same list on every
  // rank, so the collective profiling matches up).
  std::map<std::uint64_t, profile::ProfileDB> databases;
  if (profiling) {
    const PlanningSetup setup = planning_setup(config, world.size(), device_memory);
    for (int t : partition::tensor_parallel_candidates(graphs.provider(), setup.device, setup.options)) {
      for (bool sequence_parallel : partition::sequence_parallel_choices(setup.options, t)) {
        const Graph* graph = nullptr;
        try {
          graph = &graphs.of_degree(t, sequence_parallel);
        } catch (const Error&) {
          if (!setup.options.choose_sequence_parallel) throw;
          continue;  // the sequence does not divide by t: make_3d_plan skips it too
        }
        if (corrected_profile && corrected_profile->graph_hash() == graph->hash())
          databases.emplace(graph->hash(), *corrected_profile);
        else
          databases.emplace(graph->hash(), profile_layers(config, *graph, world, device_world, backend));
      }
    }
  }
  // CAPSlog (capslog.txt §III-A): its profiling partitionings run as trimmed profiling runs on the
  // ranks. Rank 0 plans; the jobs the planner lacks are measured collectively and it plans again
  // (each round only measures what the stage counts it reached ask for). The peaks are cached in the
  // model's ProfileDB. Without profiling, CAPSlog prices its profiling GPUs analytically.
  const bool trimmed = profiling && planning_setup(config, world.size(), device_memory).options.planner == "capslog" &&
                       databases.count(model.hash()) > 0;
  partition::CapslogMeasurements measurements;  // rank 0's
  if (trimmed && world.rank() == 0)
    for (const auto& [key, bytes] : databases.at(model.hash()).stage_peak_bytes()) measurements.insert(key, bytes);
  constexpr int kCapslogRounds = 4;
  std::string text;
  for (int round = 1;; ++round) {
    std::vector<partition::CapslogProfilingJob> jobs;  // rank 0's, to measure before planning again
    text = decide_on_rank0(world, [&] {
      Plan plan;
      if (!plan_file.empty()) {
        plan = Plan::load(plan_file);
      } else {
        PlanningSetup setup = planning_setup(config, world.size(), device_memory);
        if (trimmed) setup.options.capslog_measurements = &measurements;
        const partition::CostModelFactory costs = [&](const Graph& graph) -> std::unique_ptr<partition::CostModel> {
          if (!profiling) return planning_cost_model(setup, graph, nullptr);
          auto found = databases.find(graph.hash());
          PARTRAIN_CHECK(found != databases.end(), "internal: a graph the planner tries was not profiled");
          return planning_cost_model(setup, graph, &found->second);
        };
        io::ProgressBar progress("planning (" + setup.options.planner + ")");
        setup.options.progress = [&progress](double fraction) { progress.update(fraction); };
        partition::ThreeDimensionalPlan result = plan_experiment(config, graphs, setup, costs);
        progress.finish();
        jobs = measurements.take_requests();
        if (!jobs.empty() && round < kCapslogRounds) return std::string("measure");
        if (!jobs.empty())
          std::printf("capslog: %zu profiling GPUs still unmeasured after %d rounds: their peaks are analytic\n",
                      jobs.size(), round);
        if (result.candidates.size() > 1) std::fputs(format_layout_candidates(result).c_str(), stdout);
        plan = std::move(result.plan);
      }
      PARTRAIN_CHECK(plan.world_size == world.size(), (plan_file.empty() ? "the plan" : plan_file)
                                                          << " is for " << plan.world_size << " ranks, but "
                                                          << world.size() << " are running");
      if (!plan_file.empty()) check_plan_matches_config(plan, config, plan_file);
      plan.validate(graphs.of_degree(plan.tensor_parallel, plan.sequence_parallel));
      return plan.to_json().dump();
    });
    if (text != "measure") break;
    io::ProgressBar progress("capslog trimmed profiling on " + std::to_string(world.size()) + " ranks");
    run_capslog_profiling(config, model, jobs, world, backend, measurements,
                          [&progress](double fraction) { progress.update(fraction); });
    progress.finish();
    if (world.rank() == 0) {
      profile::ProfileDB& database = databases.at(model.hash());
      for (const auto& [key, bytes] : measurements.peaks()) database.set_stage_peak_bytes(key, bytes);
      const std::string cache = config.profile.cache_dir + "/" +
                                profile::ProfileDB::cache_file_name(model.hash(), database.backend(), database.dtype());
      database.save(cache);
      std::printf("capslog: measured %zu trimmed profiling GPUs on %d ranks (%zu peaks cached in %s)\n", jobs.size(),
                  world.size(), measurements.peaks().size(), cache.c_str());
      std::fflush(stdout);
    }
  }
  return Plan::from_json(nlohmann::json::parse(text), "broadcast plan");
}

}  // namespace partrain::app
