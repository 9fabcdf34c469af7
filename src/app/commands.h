#pragma once
// The partrain subcommands. main.cpp parses the command line with CLI11 and calls one of these;
// each returns the process exit code and throws partrain::Error on a user mistake.
#include <string>
#include <vector>

namespace partrain::app {

struct TrainArguments {
  std::string config;                  // experiment file (TOML)
  std::vector<std::string> overrides;  // "section.key=value"
  std::string plan_file;               // saved plan (JSON) instead of planning; empty: plan
  std::string resume;                  // "latest", a checkpoint path, or empty
};

struct PlanArguments {
  std::string config;                  // experiment file (TOML); empty in workload mode
  std::vector<std::string> overrides;
  std::string workload;                // dnn-partitioning JSON graph (workload mode)
  std::string planner;                 // rannc, ideals, dpl, ip, capslog, merak, uniform, manual; empty: config's
  std::string device_memory;           // e.g. "80GiB"; empty: config's (or the workload's)
  std::string profile_db;              // saved ProfileDB; empty: analytic cost model
  long world_size = 0;                 // 0: config's
  long accelerators = -1;              // workload mode: accelerator count; -1: the workload's
  long cpus = -1;                      // workload mode: CPU count; -1: the workload's
  long max_ideals = 0;                 // ideals planner: cap on enumerated ideals; 0: default / config
  // ip planner (Tarnawski et al.'s integer programs, partition/tarnawski/integer_program.h)
  bool contiguous = false;             // §5.1.3 contiguous splits instead of §5.2 non-contiguous ones
  std::string contiguity;              // with contiguous: "pipeline" (default) or "reachability" (the paper's (16))
  std::string objective;               // "throughput" (default) or "latency" (§4, inference workloads)
  double time_limit = -1;              // seconds for the MIP search; negative: default / config
  double gap = -1;                     // relative gap to stop at; negative: default / config
  long threads = 0;                    // CBC threads; 0: default (1)
  long subgraphs_per_device = 1;       // latency: contiguous subgraphs per device (q)
  bool cold = false;                   // no warm start from the DP's split
  bool solver_log = false;             // CBC's own log on stdout
  std::string write_lp;                // write the integer program (LP format) here; empty: do not
  std::string save;                    // write the plan JSON here; empty: do not save
};

struct InspectArguments {
  std::string file;                    // experiment file (.toml) or checkpoint (.h5)
  std::vector<std::string> overrides;
};

struct SimulateArguments {
  std::string plan_file;               // saved plan (JSON)
  std::string trace_out;               // write the predicted step as a Chrome trace here; empty: do not
  long step = 0;                       // args.step of the trace's events
};

struct EvalArguments {
  std::string config;                  // experiment file (TOML): the model the checkpoint holds
  std::vector<std::string> overrides;  // "section.key=value"
  std::string resume;                  // "latest" or a checkpoint path
  std::string plan_file;               // saved plan (JSON) instead of planning; empty: plan
  std::string data;                    // batch file or prepared data set; empty: the config's held-out split
  long batches = 0;                    // global batches to evaluate; 0: every whole batch of the data
  std::string save_batches;            // write the evaluated samples as a batch file here; empty: do not
};

int run_train(const TrainArguments& arguments);
/// `partrain eval`: a checkpoint's loss (and perplexity or accuracy) on held-out data, any world size.
int run_eval(const EvalArguments& arguments);
int run_plan(const PlanArguments& arguments);
int run_inspect(const InspectArguments& arguments);
int run_simulate(const SimulateArguments& arguments);

}  // namespace partrain::app
