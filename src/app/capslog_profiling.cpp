#include "app/capslog_profiling.h"

#include <algorithm>
#include <string>

#include <nlohmann/json.hpp>

#include "app/planning.h"
#include "app/trimmed_pipeline_communicator.h"
#include "core/error.h"
#include "runtime/executor.h"

namespace partrain::app {

double measure_trimmed_stage(const ExperimentConfig& config, const Graph& model, const partition::CapslogProfilingJob& job,
                             Backend& backend, const io::BatchSource& data) {
  PARTRAIN_CHECK(job.plan.graph_hash == model.hash(),
                 "capslog profiling: job " << job.key << " is for another graph than the model of " << config.path);
  TrimmedPipelineCommunicator world(job.plan.world_size, job.device, backend);
  backend.synchronise();
  const double before = static_cast<double>(backend.allocator().current_bytes());
  double peak = 0;
  {
    // The initial values are a temporary, as in `partrain train`: only the stage's copy stays.
    runtime::PipelineExecutor executor(model, job.plan, world, backend, data, initial_values(config, model, model, 0),
                                       runtime_options(config.train, config.parallel));
    for (int step = 0; step < kCapslogProfilingSteps; ++step)
      peak = std::max(peak, executor.train_step(step).rank_peak_memory_bytes);
  }
  return std::max(0.0, peak - before);
}

void run_capslog_profiling(const ExperimentConfig& config, const Graph& model,
                           const std::vector<partition::CapslogProfilingJob>& jobs, comm::Communicator& world,
                           Backend& backend, partition::CapslogMeasurements& measurements,
                           const std::function<void(double)>& progress) {
  // 1. Rank 0's jobs to every rank.
  std::string message;
  if (world.rank() == 0) {
    nlohmann::json list = nlohmann::json::array();
    for (const partition::CapslogProfilingJob& job : jobs)
      list.push_back({{"key", job.key}, {"device", job.device}, {"plan", job.plan.to_json()}});
    message = list.dump();
  }
  world.broadcast_bytes(message, 0);
  std::vector<partition::CapslogProfilingJob> all;
  for (const nlohmann::json& entry : nlohmann::json::parse(message))
    all.push_back({entry.at("key").get<std::string>(), Plan::from_json(entry.at("plan"), "capslog profiling job"),
                   entry.at("device").get<int>()});

  // 2. Each rank its share, round robin; a failure is reported instead of results (no rank hangs).
  const std::unique_ptr<io::BatchSource> data = all.empty() ? nullptr : io::make_batch_source(config, false);
  nlohmann::json mine = nlohmann::json::object();
  std::string failure;
  std::size_t own = 0, done = 0;
  for (std::size_t i = world.rank(); i < all.size(); i += world.size()) ++own;
  for (std::size_t i = world.rank(); i < all.size() && failure.empty(); i += world.size()) {
    try {
      mine[all[i].key] = measure_trimmed_stage(config, model, all[i], backend, *data);
    } catch (const std::exception& error) {
      failure = "rank " + std::to_string(world.rank()) + ", " + all[i].key + ": " + error.what();
    }
    ++done;
    if (world.rank() == 0 && progress) progress(static_cast<double>(done) / static_cast<double>(own));
  }
  const nlohmann::json reply = failure.empty() ? nlohmann::json{{"peaks", mine}} : nlohmann::json{{"error", failure}};

  // 3. Rank 0 gathers the peaks (or every failure) and tells every rank the outcome.
  const std::vector<std::string> gathered = world.gather_bytes(reply.dump(), 0);
  std::string outcome;
  if (world.rank() == 0) {
    std::string errors;
    for (const std::string& part : gathered) {
      const nlohmann::json parsed = nlohmann::json::parse(part);
      if (parsed.contains("error")) {
        errors += (errors.empty() ? "" : "; ") + parsed.at("error").get<std::string>();
        continue;
      }
      for (const auto& [key, bytes] : parsed.at("peaks").items()) measurements.insert(key, bytes.get<double>());
    }
    outcome = errors;
  }
  world.broadcast_bytes(outcome, 0);
  PARTRAIN_CHECK(outcome.empty(), "capslog trimmed profiling failed: " << outcome);
  if (world.rank() == 0 && progress) progress(1.0);
}

}  // namespace partrain::app
