#include "app/checkpoint_resume.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "app/collective_decision.h"
#include "core/error.h"
#include "io/checkpoint.h"
#include "runtime/checkpointing.h"

namespace partrain::app {

std::string output_directory(const ExperimentConfig& config) {
  if (!config.log.dir.empty()) return config.log.dir;
  return "runs/" + std::filesystem::path(config.path).stem().string();
}

std::string checkpoint_directory(const ExperimentConfig& config) {
  return config.checkpoint.dir.empty() ? output_directory(config) + "/checkpoints" : config.checkpoint.dir;
}

bool readable_file(const std::string& path) {
  std::error_code error;
  return std::filesystem::is_regular_file(path, error) && std::ifstream(path).good();
}

std::string resume_path(const std::string& resume, const std::string& directory, comm::Communicator& world) {
  return decide_on_rank0(world, [&] {
    if (resume != "latest") return resume;
    std::vector<std::string> skipped;
    std::string chosen = io::latest_valid_checkpoint(directory, &skipped);
    for (const std::string& reason : skipped) std::printf("resume: skipping %s\n", reason.c_str());
    return chosen;
  });
}

std::int64_t resume_from(const std::string& path, const Graph& graph, runtime::PipelineExecutor& executor,
                         comm::Communicator& world, RestoreScope scope) {
  const bool model_only = scope == RestoreScope::Model;
  const io::Checkpoint checkpoint = io::read_checkpoint(path, runtime::required_model_tensors(graph),
                                                        model_only ? std::vector<std::string>{"model/"}
                                                                   : std::vector<std::string>{});
  bool optimizer_state = false;
  for (const auto& [name, tensor] : checkpoint.tensors) optimizer_state = optimizer_state || name.starts_with("optim/");
  if (optimizer_state && !model_only)  // every rank reads the whole file: the same error everywhere
    for (const std::string& name : runtime::required_checkpoint_tensors(graph, executor.optimizer().state_names()))
      PARTRAIN_CHECK(checkpoint.tensors.count(name), path << ": dataset /" << name << " is missing (the file has "
                                                          << "optimizer state, but not for every parameter)");
  runtime::restore_checkpoint(checkpoint, graph, executor, optimizer_state && !model_only);
  // fp16: the loss scaler goes on where it was; a checkpoint of an fp32/bf16 run has no scale, and
  // the scaler then starts from [train] initial_loss_scale.
  if (runtime::LossScaler* scaler = executor.loss_scaler(); scaler && !model_only && checkpoint.info.loss_scale > 0)
    scaler->restore(checkpoint.info.loss_scale, checkpoint.info.loss_scale_good_steps);
  if (world.rank() == 0) {
    std::printf("resume: %s (step %lld)\n", path.c_str(), static_cast<long long>(checkpoint.info.step));
    if (!optimizer_state && !model_only)
      std::printf("resume: %s holds no optimizer state (no /optim): the model's parameters are restored and the "
                  "%s state starts fresh\n",
                  path.c_str(), executor.optimizer().name());
    std::fflush(stdout);
  }
  return checkpoint.info.step;
}

}  // namespace partrain::app
