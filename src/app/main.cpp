// partrain: the command-line program.
//   partrain train CONFIG.toml [--set section.key=value ...] [--plan FILE] [--resume latest|PATH]
//   partrain plan CONFIG.toml [--world-size N] [--device-memory 80GiB]
//   partrain inspect CONFIG.toml | CHECKPOINT.h5
// User mistakes end with one "partrain: error: ..." line and exit code 1, never a backtrace.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"

namespace {

int not_implemented_yet(const char* command, const char* issue) {
  std::fprintf(stderr, "partrain %s: not implemented yet (%s)\n", command, issue);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"partrain: automatic hybrid pipeline + data parallel training of BERT, GPT and ResNet"};
  app.set_version_flag("--version", "partrain 0.1");
  app.require_subcommand(1);

  std::string config;
  std::vector<std::string> overrides;
  std::string plan_file, resume;
  CLI::App* train = app.add_subcommand("train", "profile, plan and train a model from a TOML experiment file");
  train->add_option("config", config, "experiment file (TOML)")->required()->check(CLI::ExistingFile);
  train->add_option("--set", overrides, "override one setting: section.key=value (repeatable)");
  train->add_option("--plan", plan_file, "use a saved plan (JSON) instead of planning");
  train->add_option("--resume", resume, "resume from a checkpoint: latest or a path");

  long world_size = 0;
  std::string device_memory;
  CLI::App* plan = app.add_subcommand("plan", "plan a run (stages, replicas, microbatches) without training");
  plan->add_option("config", config, "experiment file (TOML)")->required()->check(CLI::ExistingFile);
  plan->add_option("--set", overrides, "override one setting: section.key=value (repeatable)");
  plan->add_option("--world-size", world_size, "number of devices to plan for");
  plan->add_option("--device-memory", device_memory, "memory per device, e.g. 80GiB");

  std::string target;
  CLI::App* inspect = app.add_subcommand("inspect", "summarise a model (TOML) or a checkpoint (HDF5)");
  inspect->add_option("file", target, "experiment file or checkpoint")->required()->check(CLI::ExistingFile);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  }
  try {
    if (*train) return not_implemented_yet("train", "the main-job issue builds profiling, planning and training");
    if (*plan) return not_implemented_yet("plan", "the partitioners issue builds the planners");
    if (*inspect) return not_implemented_yet("inspect", "the models and checkpoint issues build it");
  } catch (const partrain::Error& error) {
    std::fprintf(stderr, "partrain: error: %s\n", error.what());
    return 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "partrain: error: %s\n", error.what());
    return 1;
  }
  return 0;
}
