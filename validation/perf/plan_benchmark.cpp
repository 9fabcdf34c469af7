// Planning benchmark (docs/validation.md §Benchmarks). Not a test: it prints wall times and
// ratios against a peer measured in the same run.
//   1. The dnn-partitioning workloads (Tarnawski et al., NeurIPS 2020; ctest/data/dnn-partitioning):
//      the ideal DP (partition_ideals) and DPL (partition_linearised) with each file's own device
//      counts; ratio DPL time / DP time.
//   2. Model graphs with the analytic cost model: BERT-Large on 16 devices and RaNNC's enlarged BERT
//      (256 layers, hidden 2048) on 32 devices = 4 nodes × 8: every planner through make_plan, plus
//      the steps of rannc (atomic components, task costs, blocks, stage DP) timed separately; the
//      plans' shapes and predicted step times; ratios against rannc.
//      With --reference-dp BINARY (a binary built, outside the project, from throughput-dp/dp.cpp of
//      msr-fiddle/dnn-partitioning, the authors' released DP): that binary's wall time on each file,
//      its ideal count (its "N ideals" line) and its max load, against ours (file read + DP).
// Usage: plan_benchmark [--data DIR] [--quick] [--workloads-only] [--limit SECONDS] [--skip PLANNER]...
//                       [--reference-dp BINARY] [--reference-limit SECONDS]
// Each model-graph measurement runs in a forked child so that one exceeding --limit can be stopped.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <iostream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "graph/graph.h"
#include "io/config.h"
#include "models/model.h"
#include "partition/rannc/atomic.h"
#include "partition/rannc/blocks.h"
#include "partition/common/cost_model.h"
#include "partition/tarnawski/dpl.h"
#include "partition/tarnawski/ideals_dp.h"
#include "plan/plan.h"
#include "partition/common/plan_builder.h"
#include "partition/planner.h"
#include "partition/rannc/stage_dp.h"
#include "partition/tarnawski/workload.h"
#include "profile/memory_model.h"

#ifndef PARTRAIN_BENCHMARK_DATA
#define PARTRAIN_BENCHMARK_DATA "ctest/data"
#endif

namespace {

using partrain::Error;
using partrain::Graph;
using partrain::Plan;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;
namespace part = partrain::partition;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

/// 3 significant digits.
std::string sig3(double value) {
  if (!std::isfinite(value)) return "-";
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.3g", value);
  return buffer;
}

/// 2 decimals, as Table 1 prints max loads.
std::string two_decimals(double value) {
  if (!std::isfinite(value)) return "-";
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.2f", value);
  return buffer;
}

std::string ratio(double value, double peer) {
  if (!(peer > 0) || !std::isfinite(value)) return "-";
  return sig3(value / peer);
}

/// Set by any unexpected failure (not a partrain::Error of a planner, nor a timeout): exit code 1.
bool unexpected_failure = false;

// ---------------------------------------------------------------------------------------------
// 1. dnn-partitioning workloads

/// Mean wall time of `run`: once, repeated while the total stays under 0.2 s (at most 50 runs),
/// so sub-millisecond runs are not measured from a single sample.
template <typename Run>
double mean_seconds(Run&& run) {
  double total = 0;
  int runs = 0;
  do {
    const Clock::time_point start = Clock::now();
    run();
    total += seconds_since(start);
    ++runs;
  } while (total < 0.2 && runs < 50);
  return total / runs;
}

/// One run of the released DP on a file: wall seconds (process start to exit), its ideal count and
/// max load, or why it gave none.
struct ReferenceRun {
  double seconds = NAN;
  long ideals = -1;
  double max_load_ms = NAN;
  std::string error;  // empty when it finished with a result
};

std::string read_text(const std::string& path) {
  std::string text;
  FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) return text;
  char buffer[65536];
  std::size_t n;
  while ((n = std::fread(buffer, 1, sizeof buffer, file)) > 0) text.append(buffer, n);
  std::fclose(file);
  return text;
}

/// Runs `binary` < input once (the released dp.cpp reads JSON on stdin, prints the split as JSON on
/// stdout and "N ideals" on stderr), killed after `limit_seconds` (0: none).
ReferenceRun run_reference_once(const std::string& binary, const fs::path& input, double limit_seconds) {
  ReferenceRun run;
  char out_name[] = "/tmp/plan_benchmark_outXXXXXX";
  char err_name[] = "/tmp/plan_benchmark_errXXXXXX";
  const int out_fd = mkstemp(out_name);
  const int err_fd = mkstemp(err_name);
  const int in_fd = open(input.c_str(), O_RDONLY);
  if (out_fd < 0 || err_fd < 0 || in_fd < 0) {
    run.error = std::string("cannot open files: ") + std::strerror(errno);
  } else {
    std::fflush(stdout);
    const Clock::time_point start = Clock::now();
    const pid_t child = fork();
    if (child == 0) {
      dup2(in_fd, 0);
      dup2(out_fd, 1);
      dup2(err_fd, 2);
      execl(binary.c_str(), binary.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    int status = 0;
    bool timed_out = false;
    for (;;) {  // poll every 0.5 ms: the resolution of the short runs
      const pid_t done = waitpid(child, &status, WNOHANG);
      if (done == child || (done < 0 && errno != EINTR)) break;
      if (limit_seconds > 0 && seconds_since(start) > limit_seconds) {
        kill(child, SIGKILL);
        waitpid(child, &status, 0);
        timed_out = true;
        break;
      }
      usleep(500);
    }
    run.seconds = seconds_since(start);
    const std::string out = read_text(out_name), err = read_text(err_name);
    std::istringstream lines(err);
    for (std::string line; std::getline(lines, line);) {
      const std::size_t at = line.find(" ideals");
      if (at != std::string::npos && at > 0 && at + 7 == line.size() && line.find_first_not_of("0123456789") == at)
        run.ideals = std::stol(line.substr(0, at));
    }
    if (timed_out) {
      run.error = "stopped after " + sig3(run.seconds) + " s (--reference-limit)";
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      const std::size_t fail = out.find("FAIL: ");
      run.error = fail != std::string::npos ? out.substr(fail, out.find('\n', fail) - fail)
                                            : "exit status " + std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    } else {
      try {
        run.max_load_ms = nlohmann::json::parse(out).at("maxLoad").get<double>();
      } catch (const std::exception& error) {
        run.error = std::string("no maxLoad in its output: ") + error.what();
      }
    }
  }
  for (int fd : {out_fd, err_fd, in_fd})
    if (fd >= 0) close(fd);
  unlink(out_name);
  unlink(err_name);
  return run;
}

/// Like mean_seconds: runs repeated while the total stays under 0.2 s (at most 50); the mean time.
ReferenceRun run_reference(const std::string& binary, const fs::path& input, double limit_seconds) {
  ReferenceRun first = run_reference_once(binary, input, limit_seconds);
  if (!first.error.empty()) return first;
  double total = first.seconds;
  int runs = 1;
  while (total < 0.2 && runs < 50) {
    const ReferenceRun again = run_reference_once(binary, input, limit_seconds);
    if (!again.error.empty()) return again;
    total += again.seconds;
    ++runs;
  }
  first.seconds = total / runs;
  return first;
}

void benchmark_workloads(const fs::path& data_dir, const std::string& reference_dp, double reference_limit) {
  const fs::path root = data_dir / "dnn-partitioning" / "throughput-inputs";
  std::printf("== 1. dnn-partitioning workloads (%s)\n", root.string().c_str());
  std::vector<fs::path> files;
  std::error_code error_code;
  for (fs::recursive_directory_iterator it(root, error_code), end; !error_code && it != end; it.increment(error_code))
    if (it->is_regular_file() && it->path().extension() == ".json") files.push_back(it->path());
  if (error_code || files.empty()) {
    std::printf("  no workload files under %s (%s)\n\n", root.string().c_str(),
                error_code ? error_code.message().c_str() : "none found");
    unexpected_failure = true;
    return;
  }
  std::sort(files.begin(), files.end());
  std::printf("  %-44s %5s %2s %2s %7s %8s | %9s %10s | %9s %10s | %9s %9s\n", "file", "nodes", "k", "l", "classes",
              "ideals", "DP s", "DP ms", "DPL s", "DPL ms", "DPL/DP t", "DPL/DP ms");
  for (const fs::path& file : files) {
    const std::string name = file.lexically_relative(root).string();
    try {
      const part::Workload workload = part::read_workload(file.string());
      const part::PartitionOptions options;  // the file's own k, l and memory
      part::PartitionResult dp, dpl;
      std::string dp_error;
      double dp_seconds = NAN;
      try {
        dp_seconds = mean_seconds([&] { dp = part::partition_ideals(workload, options); });
      } catch (const Error& error) {
        dp_error = error.message();
      }
      const double dpl_seconds = mean_seconds([&] { dpl = part::partition_linearised(workload, options); });
      const std::size_t classes = dpl.class_count;
      if (!dp_error.empty()) {
        std::printf("  %-44s %5zu %2d %2d %7zu %8s | %9s %10s | %9s %10.2f | %9s %9s\n", name.c_str(),
                    workload.nodes.size(), workload.accelerators, workload.cpus, classes, "-", "failed", "-",
                    sig3(dpl_seconds).c_str(), dpl.max_load_ms, "-", "-");
        std::printf("    DP: %s\n", dp_error.c_str());
        unexpected_failure = true;
        continue;
      }
      std::printf("  %-44s %5zu %2d %2d %7zu %8zu | %9s %10.2f | %9s %10.2f | %9s %9s\n", name.c_str(),
                  workload.nodes.size(), workload.accelerators, workload.cpus, classes, dp.ideal_count,
                  sig3(dp_seconds).c_str(), dp.max_load_ms, sig3(dpl_seconds).c_str(), dpl.max_load_ms,
                  ratio(dpl_seconds, dp_seconds).c_str(), ratio(dpl.max_load_ms, dp.max_load_ms).c_str());
    } catch (const std::exception& error) {
      std::printf("  %-44s failed: %s\n", name.c_str(), error.what());
      unexpected_failure = true;
    }
  }
  std::printf("  (DP s includes the DPL run it uses as its pruning bound; times are means of repeated runs\n"
              "   when one run takes under 0.2 s)\n\n");
  if (reference_dp.empty()) return;

  // Against the released DP: both from the file to the optimum, on the same files, one after another.
  std::printf("== 1b. released dp.cpp (%s) against ours, from the file to the split\n", reference_dp.c_str());
  std::printf("  %-44s | %8s %10s %10s | %8s %10s %10s | %10s\n", "file", "ideals", "max ms", "ours s", "ideals",
              "max ms", "released s", "released/ours");
  for (const fs::path& file : files) {
    const std::string name = file.lexically_relative(root).string();
    part::PartitionResult dp;
    std::string dp_error;
    double our_seconds = NAN;
    try {
      our_seconds = mean_seconds([&] { dp = part::partition_ideals(part::read_workload(file.string()), {}); });
    } catch (const Error& error) {
      dp_error = error.message();
    }
    const ReferenceRun reference = run_reference(reference_dp, file, reference_limit);
    std::printf("  %-44s | %8s %10s %10s | %8s %10s %10s | %10s\n", name.c_str(),
                dp_error.empty() ? std::to_string(dp.ideal_count).c_str() : "-",
                dp_error.empty() ? two_decimals(dp.max_load_ms).c_str() : "-", sig3(our_seconds).c_str(),
                reference.ideals >= 0 ? std::to_string(reference.ideals).c_str() : "-", two_decimals(reference.max_load_ms).c_str(),
                sig3(reference.seconds).c_str(), reference.error.empty() ? ratio(reference.seconds, our_seconds).c_str() : "-");
    if (!dp_error.empty()) std::printf("    ours: %s\n", dp_error.c_str());
    if (!reference.error.empty()) std::printf("    released: %s\n", reference.error.c_str());
  }
  std::printf("  (wall times; runs under 0.2 s repeated and averaged; the released binary's time includes its\n"
              "   process start and JSON parsing, ours the file read)\n\n");
}

// ---------------------------------------------------------------------------------------------
// 2. model graphs

/// Runs `work` in a forked child with a wall-clock limit; the child sends back a JSON object.
/// Returns the object, or {"status": "timeout"} / {"status": "crashed", "error": ...}.
nlohmann::json run_limited(const std::function<nlohmann::json()>& work, double limit_seconds) {
  std::fflush(stdout);
  std::cout.flush();
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return {{"status", "crashed"}, {"error", std::string("pipe: ") + std::strerror(errno)}};
  const pid_t child = fork();
  if (child < 0) {
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    return {{"status", "crashed"}, {"error", std::string("fork: ") + std::strerror(errno)}};
  }
  if (child == 0) {
    close(pipe_fds[0]);
    nlohmann::json result;
    try {
      result = work();
    } catch (const Error& error) {
      result = {{"status", "error"}, {"error", error.message()}};
    } catch (const std::exception& error) {
      result = {{"status", "crashed"}, {"error", error.what()}};
    }
    const std::string text = result.dump();
    std::size_t written = 0;
    while (written < text.size()) {
      const ssize_t n = write(pipe_fds[1], text.data() + written, text.size() - written);
      if (n <= 0) break;
      written += static_cast<std::size_t>(n);
    }
    close(pipe_fds[1]);
    _exit(0);
  }
  close(pipe_fds[1]);
  const Clock::time_point start = Clock::now();
  std::string text;
  bool timed_out = false;
  for (;;) {
    int wait_ms = -1;
    if (limit_seconds > 0) {
      const double left = limit_seconds - seconds_since(start);
      if (left <= 0) {
        timed_out = true;
        break;
      }
      wait_ms = static_cast<int>(std::ceil(left * 1000));
    }
    pollfd descriptor{pipe_fds[0], POLLIN, 0};
    const int ready = poll(&descriptor, 1, wait_ms);
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) continue;  // the loop head notices the limit
    char buffer[4096];
    const ssize_t n = read(pipe_fds[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: the child is done
    text.append(buffer, static_cast<std::size_t>(n));
  }
  close(pipe_fds[0]);
  if (timed_out) kill(child, SIGKILL);
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) return {{"status", "timeout"}, {"seconds", seconds_since(start)}};
  if (WIFSIGNALED(status))
    return {{"status", "crashed"}, {"error", std::string("killed by signal ") + strsignal(WTERMSIG(status))}};
  try {
    return nlohmann::json::parse(text);
  } catch (const std::exception&) {
    return {{"status", "crashed"}, {"error", "no result from the child process"}};
  }
}

/// "2*8,4*2": run-length replicas per stage (value*count).
std::string replicas_text(const Plan& plan) {
  std::ostringstream out;
  std::size_t i = 0;
  while (i < plan.stages.size()) {
    std::size_t j = i;
    while (j < plan.stages.size() && plan.stages[j].replicas == plan.stages[i].replicas) ++j;
    if (i > 0) out << ',';
    out << plan.stages[i].replicas;
    if (j - i > 1) out << '*' << (j - i);
    i = j;
  }
  return out.str();
}

nlohmann::json plan_json(const Plan& plan, double seconds) {
  return {{"status", "ok"},
          {"seconds", seconds},
          {"stages", plan.stages.size()},
          {"copies", plan.pipeline_replicas},
          {"replicas", replicas_text(plan)},
          {"microbatches", plan.microbatches},
          {"step", plan.predicted_step_seconds}};
}

struct ModelCase {
  std::string title;
  partrain::ModelConfig model;
  part::DeviceSpec device;
  part::PlannerOptions options;
};

void print_row(const std::string& label, const nlohmann::json& result, double rannc_seconds, double rannc_step) {
  const std::string status = result.value("status", "crashed");
  if (status == "ok") {
    const double seconds = result.at("seconds").get<double>();
    const bool is_plan = result.contains("step");
    if (!is_plan) {
      std::printf("  %-34s %9s %10s | %s\n", label.c_str(), sig3(seconds).c_str(), ratio(seconds, rannc_seconds).c_str(),
                  result.value("note", std::string()).c_str());
      return;
    }
    const double step = result.at("step").get<double>();
    std::printf("  %-34s %9s %10s | %6d %6d %-16s %5d %10s %10s\n", label.c_str(), sig3(seconds).c_str(),
                ratio(seconds, rannc_seconds).c_str(), result.at("stages").get<int>(), result.at("copies").get<int>(),
                result.at("replicas").get<std::string>().c_str(), result.at("microbatches").get<int>(),
                sig3(step).c_str(), ratio(step, rannc_step).c_str());
  } else if (status == "timeout") {
    std::printf("  %-34s %9s %10s | stopped after %s s (--limit)\n", label.c_str(),
                (">" + sig3(result.at("seconds").get<double>())).c_str(), "-",
                sig3(result.at("seconds").get<double>()).c_str());
  } else if (status == "skipped") {
    std::printf("  %-34s %9s %10s | skipped (--skip)\n", label.c_str(), "-", "-");
  } else {
    std::string message = result.value("error", std::string("unknown failure"));
    if (status == "error" && message.find("more than") != std::string::npos && message.find("ideals") != std::string::npos)
      message = "too many ideals (" + message + ")";
    std::printf("  %-34s %9s %10s | %s: %s\n", label.c_str(), "-", "-", status == "error" ? "no plan" : "FAILED",
                message.c_str());
    if (status != "error") unexpected_failure = true;
  }
}

void benchmark_model(const ModelCase& model_case, const std::set<std::string>& skip, double limit_seconds) {
  std::printf("== 2. %s\n", model_case.title.c_str());
  Graph graph;
  std::unique_ptr<part::CostModel> cost;
  try {
    const Clock::time_point start = Clock::now();
    graph = partrain::build_model(model_case.model);
    const double build_seconds = seconds_since(start);
    const Clock::time_point cost_start = Clock::now();
    cost = part::make_analytic_cost_model(graph, model_case.device);
    const double cost_seconds = seconds_since(cost_start);
    std::size_t non_constant = 0;
    for (const partrain::Task& task : graph.tasks()) non_constant += !task.constant;
    std::printf("  graph: %zu tasks (%zu non-constant), %.3g G parameters; build_model %s s, cost model %s s\n",
                graph.tasks().size(), non_constant, graph.parameter_count() / 1e9, sig3(build_seconds).c_str(),
                sig3(cost_seconds).c_str());
    const part::PlannerOptions& o = model_case.options;
    std::printf("  devices: %d (%d per node), %.3g GiB each (margin %.2g), %.3g TFLOP/s; global batch %lld, k = %d\n",
                o.world_size, model_case.device.devices_per_node, model_case.device.memory_bytes / (1ull << 30),
                o.memory_margin, model_case.device.flops_per_second / 1e12, static_cast<long long>(o.global_batch),
                o.blocks);
  } catch (const std::exception& error) {
    std::printf("  cannot build the model: %s\n\n", error.what());
    unexpected_failure = true;
    return;
  }

  std::printf("  %-34s %9s %10s | %6s %6s %-16s %5s %10s %10s\n", "planner / step", "plan s", "t/rannc", "stages",
              "copies", "replicas/stage", "M", "step s", "step/rannc");
  const std::vector<std::string> planners = {"rannc", "dpl", "ideals", "capslog", "merak", "uniform"};
  std::vector<std::pair<std::string, nlohmann::json>> results;
  for (const std::string& planner : planners) {
    if (skip.count(planner)) {
      results.emplace_back(planner, nlohmann::json{{"status", "skipped"}});
      continue;
    }
    part::PlannerOptions options = model_case.options;
    options.planner = planner;
    nlohmann::json result = run_limited(
        [&]() -> nlohmann::json {
          const Clock::time_point start = Clock::now();
          const Plan plan = part::make_plan(graph, *cost, options);
          return plan_json(plan, seconds_since(start));
        },
        limit_seconds);
    results.emplace_back(planner, std::move(result));
  }
  double rannc_seconds = NAN, rannc_step = NAN;
  if (results.front().second.value("status", "") == "ok") {
    rannc_seconds = results.front().second.at("seconds").get<double>();
    rannc_step = results.front().second.at("step").get<double>();
  }
  for (const auto& [planner, result] : results) print_row(planner, result, rannc_seconds, rannc_step);

  // The steps of rannc, timed one by one (as planner.cpp's plan_rannc runs them).
  if (!skip.count("rannc")) {
    const part::PlannerOptions options = model_case.options;
    const nlohmann::json breakdown = run_limited(
        [&]() -> nlohmann::json {
          nlohmann::json steps = nlohmann::json::array();
          Clock::time_point start = Clock::now();
          const std::vector<part::AtomicComponent> components = part::atomic_components(graph);
          steps.push_back({{"status", "ok"}, {"label", "rannc: atomic_components"}, {"seconds", seconds_since(start)},
                           {"note", std::to_string(components.size()) + " components"}});

          start = Clock::now();
          const std::int64_t batch = std::max<std::int64_t>(1, options.global_batch / options.world_size);
          const partrain::profile::MemoryPolicy policy = part::stage_memory_policy(options, 0, 1, 1);
          part::BlockOptions block_options;
          block_options.blocks = options.blocks;
          block_options.batch = batch;
          block_options.task_seconds.assign(graph.tasks().size(), 0.0);
          block_options.task_memory_bytes.assign(graph.tasks().size(), 0.0);
          for (const partrain::Task& task : graph.tasks()) {
            const int id = task.id;
            const partrain::profile::Measurement m = cost->measure(std::span<const int>(&id, 1), batch);
            block_options.task_seconds[id] = m.forward_seconds + m.backward_seconds;
            block_options.task_memory_bytes[id] =
                m.parameter_bytes * partrain::profile::model_state_factor(policy) + m.activation_bytes;
          }
          block_options.memory_limit_bytes = options.usable_memory_bytes(cost->device());
          block_options.bandwidth_bytes_per_second = cost->device().link_bandwidth;
          steps.push_back({{"status", "ok"}, {"label", "rannc: task costs"}, {"seconds", seconds_since(start)},
                           {"note", std::to_string(graph.tasks().size()) + " measure() calls"}});

          start = Clock::now();
          const part::BlockPartition partition = part::partition_blocks_detailed(graph, components, block_options);
          std::ostringstream note;
          note << partition.blocks.size() << " blocks; " << partition.coarsening_levels << " coarsening levels, "
               << partition.uncoarsening_moves << " uncoarsening moves";
          steps.push_back({{"status", "ok"}, {"label", "rannc: partition_blocks (k=" + std::to_string(options.blocks) + ")"},
                           {"seconds", seconds_since(start)}, {"note", note.str()}});

          std::vector<std::vector<int>> block_tasks;
          for (const part::Block& block : partition.blocks) block_tasks.push_back(block.tasks);
          start = Clock::now();
          try {
            const Plan plan = part::plan_stages_rannc(graph, block_tasks, *cost, options);
            nlohmann::json row = plan_json(plan, seconds_since(start));
            row["label"] = "rannc: plan_stages_rannc";
            steps.push_back(row);
          } catch (const Error& error) {
            steps.push_back({{"status", "error"}, {"label", "rannc: plan_stages_rannc"}, {"error", error.message()}});
          }
          return {{"status", "ok"}, {"steps", steps}};
        },
        limit_seconds);
    if (breakdown.value("status", "") == "ok") {
      for (const nlohmann::json& step : breakdown.at("steps"))
        print_row(step.at("label").get<std::string>(), step, rannc_seconds, rannc_step);
    } else {
      print_row("rannc: breakdown", breakdown, rannc_seconds, rannc_step);
    }
  }
  std::printf("\n");
}

void usage() {
  std::printf(
      "usage: plan_benchmark [--data DIR] [--quick] [--workloads-only] [--limit SECONDS] [--skip PLANNER]...\n"
      "                      [--reference-dp BINARY] [--reference-limit SECONDS]\n"
      "  --data DIR       test data (default %s); workloads under DIR/dnn-partitioning/throughput-inputs\n"
      "  --quick          skip the 256-layer enlarged BERT\n"
      "  --limit SECONDS  stop a model-graph measurement after this wall time (default 120; 0: none)\n"
      "  --skip PLANNER   do not run this planner on the model graphs (repeatable)\n"
      "  --workloads-only only the dnn-partitioning workloads (section 1)\n"
      "  --reference-dp BINARY    also run this binary, built from the released throughput-dp/dp.cpp of\n"
      "                   msr-fiddle/dnn-partitioning, on every workload file and compare (section 1b)\n"
      "  --reference-limit SECONDS  stop one run of it after this wall time (default 600; 0: none)\n",
      PARTRAIN_BENCHMARK_DATA);
}

}  // namespace

/// Section 2: the model graphs (BERT-Large; the 256-layer enlarged BERT unless quick).
void benchmark_models(const std::set<std::string>& skip, double limit_seconds, bool quick);

int main(int argc, char** argv) {
  std::string data_dir = PARTRAIN_BENCHMARK_DATA;
  bool quick = false;
  double limit_seconds = 120;
  std::set<std::string> skip;
  bool workloads_only = false;
  std::string reference_dp;
  double reference_limit = 600;
  for (int i = 1; i < argc; ++i) {
    const std::string argument = argv[i];
    const bool has_value = i + 1 < argc;
    if (argument == "--data" && has_value) {
      data_dir = argv[++i];
    } else if (argument == "--quick") {
      quick = true;
    } else if (argument == "--limit" && has_value) {
      try {
        limit_seconds = std::stod(argv[++i]);
      } catch (const std::exception&) {
        std::fprintf(stderr, "plan_benchmark: --limit needs a number of seconds, not '%s'\n", argv[i]);
        return 2;
      }
    } else if (argument == "--workloads-only") {
      workloads_only = true;
    } else if (argument == "--reference-dp" && has_value) {
      reference_dp = argv[++i];
      if (access(reference_dp.c_str(), X_OK) != 0) {
        std::fprintf(stderr, "plan_benchmark: --reference-dp '%s' is not an executable file\n", reference_dp.c_str());
        return 2;
      }
    } else if (argument == "--reference-limit" && has_value) {
      try {
        reference_limit = std::stod(argv[++i]);
      } catch (const std::exception&) {
        std::fprintf(stderr, "plan_benchmark: --reference-limit needs a number of seconds, not '%s'\n", argv[i]);
        return 2;
      }
    } else if (argument == "--skip" && has_value) {
      skip.insert(argv[++i]);
    } else if (argument == "--help" || argument == "-h") {
      usage();
      return 0;
    } else {
      std::fprintf(stderr, "plan_benchmark: unknown or incomplete argument '%s'\n", argument.c_str());
      usage();
      return 2;
    }
  }

  try {
    std::printf("plan_benchmark: seconds are wall time (3 significant digits); ratios are against the peer named\n"
                "in the column header, measured in this run\n\n");
    benchmark_workloads(data_dir, reference_dp, reference_limit);
    if (!workloads_only) benchmark_models(skip, limit_seconds, quick);
  } catch (const std::exception& error) {
    std::printf("plan_benchmark: unexpected failure: %s\n", error.what());
    return 1;
  }
  if (unexpected_failure) {
    std::printf("plan_benchmark: some measurements failed unexpectedly (see above)\n");
    return 1;
  }
  return 0;
}

void benchmark_models(const std::set<std::string>& skip, double limit_seconds, bool quick) {
  {
    ModelCase bert_large;
    bert_large.title = "BERT-Large (24 layers, hidden 1024, heads 16, seq 512) on 16 devices, analytic cost model";
    bert_large.model.type = "bert";
    bert_large.model.layers = 24;
    bert_large.model.hidden = 1024;
    bert_large.model.heads = 16;
    bert_large.model.seq_len = 512;
    bert_large.model.max_position = 512;
    bert_large.options.world_size = 16;
    bert_large.options.global_batch = 256;
    benchmark_model(bert_large, skip, limit_seconds);

    if (!quick) {
      ModelCase enlarged;
      enlarged.title =
          "RaNNC enlarged BERT (256 layers, hidden 2048, heads 16, seq 512) on 32 devices = 4 nodes x 8, "
          "analytic cost model";
      enlarged.model.type = "bert";
      enlarged.model.layers = 256;
      enlarged.model.hidden = 2048;
      enlarged.model.heads = 16;
      enlarged.model.seq_len = 512;
      enlarged.model.max_position = 512;
      enlarged.device.memory_bytes = 32.0 * (1ull << 30);
      enlarged.device.devices_per_node = 8;
      enlarged.options.world_size = 32;
      enlarged.options.global_batch = 256;
      benchmark_model(enlarged, skip, limit_seconds);
    } else {
      std::printf("== 2. RaNNC enlarged BERT (256 layers): skipped (--quick)\n\n");
    }
  }
}
