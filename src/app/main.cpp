// partrain: the command-line program.
//   partrain train CONFIG.toml [--set section.key=value ...] [--plan FILE] [--resume latest|auto|PATH]
//   partrain eval CONFIG.toml --resume latest|PATH [--data FILE.h5] [--batches N] [--plan FILE] [--set ...] [--save-batches FILE.h5]
//   partrain plan CONFIG.toml [--world-size N] [--device-memory 80GiB] [--planner P] [--profile-db FILE] [--save PLAN.json]
//                             [--planner ip [--time-limit S] [--gap G]]
//   partrain plan --workload GRAPH.json --planner ideals|dpl [--accelerators K] [--cpus L] [--device-memory SIZE]
//   partrain plan --workload GRAPH.json --planner ip [--contiguous] [--objective throughput|latency] [--time-limit S] [--gap G]
//   partrain inspect CONFIG.toml | CHECKPOINT.h5
//   partrain simulate PLAN.json [--trace-out FILE] [--step N]
// User mistakes end with one "partrain: error: ..." line and exit code 1, never a backtrace. A
// training run that SIGUSR1/SIGTERM stopped after writing a checkpoint exits with 3 (app/stop_signals.h).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "app/commands.h"
#include "core/error.h"
#include "kernels/cpu/cpu_backend.h"
#if defined(PARTRAIN_WITH_CUDA)
#include "kernels/cuda/cuda_backend.cuh"
#endif

namespace {

// A CLI11 check that an integer option is at least `minimum` ("--world-size: must be a positive
// integer, not -1"), so that no count silently falls back to a default.
CLI::Validator at_least(long minimum) {
  const std::string kind = minimum > 0 ? "a positive integer" : "a non-negative integer";
  return CLI::Validator(
      [minimum, kind](std::string& text) -> std::string {
        char* end = nullptr;
        const long value = std::strtol(text.c_str(), &end, 10);
        if (text.empty() || *end != '\0' || value < minimum) return "must be " + kind + ", not " + text;
        return {};
      },
      minimum > 0 ? "POSITIVE" : "NONNEGATIVE");
}

}  // namespace

int main(int argc, char** argv) {
  using namespace partrain::app;
  partrain::cpu::install();
#if defined(PARTRAIN_WITH_CUDA)
  partrain::cuda::install();  // [train] device = "auto" | "cuda" can then pick the GPU and NCCL
#endif
  CLI::App app{"partrain: automatic hybrid pipeline + data parallel training of BERT, GPT and ResNet"};
  app.set_version_flag("--version", "partrain 0.1");
  app.require_subcommand(1);

  TrainArguments train_arguments;
  CLI::App* train = app.add_subcommand("train", "profile, plan and train a model from a TOML experiment file");
  train->add_option("config", train_arguments.config, "experiment file (TOML)")->required()->check(CLI::ExistingFile);
  train->add_option("--set", train_arguments.overrides, "override one setting: section.key=value (repeatable)");
  train->add_option("--plan", train_arguments.plan_file, "use a saved plan (JSON) instead of planning");
  train->add_option("--resume", train_arguments.resume, "resume from a checkpoint: latest, a path, or auto (latest if there is one)");

  EvalArguments eval_arguments;
  CLI::App* eval = app.add_subcommand(
      "eval", "evaluate a checkpoint on held-out data (any world size and plan): eval_loss, perplexity or accuracy");
  eval->add_option("config", eval_arguments.config, "experiment file (TOML) of the checkpoint's model")
      ->required()
      ->check(CLI::ExistingFile);
  eval->add_option("--resume", eval_arguments.resume, "the checkpoint: latest (of the config's run) or a path")
      ->required();
  eval->add_option("--data", eval_arguments.data,
                   "a batch file (/batch/<input>) or a data/prepare.sh file (its held-out split); default: the "
                   "held-out split of [data] path");
  eval->add_option("--batches", eval_arguments.batches, "global batches to evaluate (default: all the data holds)")
      ->check(at_least(1));
  eval->add_option("--plan", eval_arguments.plan_file, "use a saved plan (JSON) instead of planning");
  eval->add_option("--set", eval_arguments.overrides, "override one setting: section.key=value (repeatable)");
  eval->add_option("--save-batches", eval_arguments.save_batches,
                   "write the evaluated samples as a batch file (for other implementations of the model)");

  PlanArguments plan_arguments;
  CLI::App* plan = app.add_subcommand("plan", "plan a run (stages, replicas, microbatches) without training");
  plan->add_option("config", plan_arguments.config, "experiment file (TOML)")->check(CLI::ExistingFile);
  plan->add_option("--set", plan_arguments.overrides, "override one setting: section.key=value (repeatable)");
  plan->add_option("--workload", plan_arguments.workload, "plan an external graph (dnn-partitioning JSON)")
      ->check(CLI::ExistingFile);
  plan->add_option("--planner", plan_arguments.planner, "rannc, ideals, dpl, ip, capslog, merak, uniform or manual");
  plan->add_option("--world-size", plan_arguments.world_size, "number of devices to plan for")->check(at_least(1));
  plan->add_option("--device-memory", plan_arguments.device_memory, "memory per device, e.g. 80GiB");
  plan->add_option("--profile-db", plan_arguments.profile_db, "saved ProfileDB to plan with (default: analytic costs)");
  plan->add_option("--accelerators", plan_arguments.accelerators, "workload mode: number of accelerators")
      ->check(at_least(0));
  plan->add_option("--cpus", plan_arguments.cpus, "workload mode: number of CPUs")->check(at_least(0));
  plan->add_option("--max-ideals", plan_arguments.max_ideals,
                   "ideals planner: stop with an error (suggesting dpl) beyond this many ideals")
      ->check(at_least(1));
  plan->add_option("--save", plan_arguments.save, "write the plan as JSON (for train --plan)");
  plan->add_flag("--contiguous", plan_arguments.contiguous,
                 "ip planner: contiguous splits (Tarnawski §5.1.3); default on a workload: non-contiguous (§5.2)");
  plan->add_option("--contiguity", plan_arguments.contiguity,
                   "ip planner with --contiguous: pipeline (devices in pipeline order, the DP's space; default) or "
                   "reachability (the paper's per-device constraints (16))")
      ->check(CLI::IsMember({"pipeline", "reachability"}));
  plan->add_option("--objective", plan_arguments.objective,
                   "ip planner on a workload: throughput (max-load, §5) or latency (single-stream inference, §4)")
      ->check(CLI::IsMember({"throughput", "latency"}));
  plan->add_option("--time-limit", plan_arguments.time_limit, "ip planner: seconds of MIP search (default 60)")
      ->check(CLI::PositiveNumber);
  plan->add_option("--gap", plan_arguments.gap, "ip planner: stop at this relative optimality gap (default 1e-4)")
      ->check(CLI::NonNegativeNumber);
  plan->add_option("--threads", plan_arguments.threads, "ip planner: CBC threads (default 1)")->check(at_least(1));
  plan->add_option("--subgraphs-per-device", plan_arguments.subgraphs_per_device,
                   "ip planner, latency: contiguous subgraphs each device may run (q, §4; default 1)")
      ->check(at_least(1));
  plan->add_flag("--cold", plan_arguments.cold, "ip planner: no warm start from the ideal DP's split");
  plan->add_flag("--solver-log", plan_arguments.solver_log, "ip planner: print CBC's progress log");
  plan->add_option("--write-lp", plan_arguments.write_lp,
                   "ip planner on a workload: also write the integer program in LP format (for other solvers)");

  InspectArguments inspect_arguments;
  CLI::App* inspect = app.add_subcommand("inspect", "summarise a model (TOML) or a checkpoint (HDF5)");
  inspect->add_option("file", inspect_arguments.file, "experiment file or checkpoint")->required()->check(CLI::ExistingFile);
  inspect->add_option("--set", inspect_arguments.overrides, "override one setting: section.key=value (repeatable)");

  SimulateArguments simulate_arguments;
  CLI::App* simulate = app.add_subcommand(
      "simulate", "simulate a saved plan's schedule with its predicted costs; optionally write the predicted step as a Chrome trace");
  simulate->add_option("plan", simulate_arguments.plan_file, "saved plan (JSON)")->required()->check(CLI::ExistingFile);
  simulate->add_option("--trace-out", simulate_arguments.trace_out,
                       "write the predicted step as a Chrome trace (the executor's event names)");
  simulate->add_option("--step", simulate_arguments.step, "args.step of the trace's events (default 0)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  }
  try {
    if (*train) return run_train(train_arguments);
    if (*eval) return run_eval(eval_arguments);
    if (*plan) {
      if (plan_arguments.config.empty() == plan_arguments.workload.empty())
        throw CLI::ValidationError("plan", "give either a CONFIG.toml or --workload GRAPH.json");
      return run_plan(plan_arguments);
    }
    if (*inspect) return run_inspect(inspect_arguments);
    if (*simulate) return run_simulate(simulate_arguments);
  } catch (const CLI::ValidationError& error) {
    std::fprintf(stderr, "partrain: error: %s\n", error.what());
    return 1;
  } catch (const partrain::Error& error) {  // the message alone: the source location is for developers
    std::fprintf(stderr, "partrain: error: %s\n", error.message().c_str());
    return 1;
  } catch (const std::exception& error) {  // partrain::Error and library errors (toml++, HDF5 wrappers)
    std::fprintf(stderr, "partrain: error: %s\n", error.what());
    return 1;
  }
  return 0;
}
