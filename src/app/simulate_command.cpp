// partrain simulate PLAN.json [--trace-out FILE] [--step N]: the timeline simulator on a saved plan.
// Generates the plan's schedule (generate_schedule), runs it with the plan's predicted stage costs
// (TimelineCosts::from_plan, exactly what the planners do), prints the simulated step time and
// bubble, and optionally writes the predicted step as a Chrome trace in the executor's format (one
// complete event per action per rank, same names and categories, ts/dur in microseconds from the
// step's start, args.step = N), so validation/plot_run.py can draw it beside the measured step.
#include <cstdio>
#include <string>
#include <vector>

#include "app/commands.h"
#include "core/error.h"
#include "io/chrome_trace.h"
#include "plan/plan.h"
#include "plan/schedule.h"
#include "plan/schedule_simulator.h"

namespace partrain::app {

int run_simulate(const SimulateArguments& arguments) {
  PARTRAIN_CHECK(arguments.step >= 0, "--step must be non-negative, got " << arguments.step);
  const Plan plan = Plan::load(arguments.plan_file);
  const Schedule schedule = generate_schedule(plan);
  const TimelinePrediction prediction = simulate_schedule(plan, schedule, TimelineCosts::from_plan(plan));

  std::size_t actions = 0;
  std::vector<std::vector<io::TraceEvent>> events(schedule.size());
  for (std::size_t rank = 0; rank < schedule.size(); ++rank) {
    for (std::size_t index = 0; index < schedule[rank].size(); ++index) {
      const Action& action = schedule[rank][index];
      const ActionTiming& timing = prediction.timing[rank][index];
      // The executor's naming (runtime/executor.cpp): "Forward mb 3", "AllReduce", "Step".
      std::string name = action_kind_name(action.kind);
      if (action.microbatch >= 0) name += " mb " + std::to_string(action.microbatch);
      if (plan.virtual_stages > 1 && action.microbatch >= 0) name += " chunk " + std::to_string(action.chunk);
      const char* category = action.is_compute() ? "compute"
                             : action.kind == ActionKind::Step ? "optimizer" : "communication";
      events[rank].push_back({name, category, timing.start * 1e6, (timing.end - timing.start) * 1e6, arguments.step});
      ++actions;
    }
  }
  std::printf("plan: %s (%s, %d ranks, %d stages x %d model chunks, %d microbatches, schedule %s)\n",
              arguments.plan_file.c_str(), plan.planner.c_str(), plan.world_size, plan.pipeline_stages(),
              plan.virtual_stages, plan.microbatches, schedule_name(plan.schedule));
  std::printf("simulated: %.3f ms per step, bubble %.1f%%, %zu actions (plan.json predicted %.3f ms)\n",
              prediction.step_seconds * 1e3, 100.0 * prediction.bubble_fraction, actions,
              plan.predicted_step_seconds * 1e3);
  if (!arguments.trace_out.empty()) {
    io::write_chrome_trace(arguments.trace_out, events);
    std::printf("trace written: %s (%zu events)\n", arguments.trace_out.c_str(), actions);
  }
  return 0;
}

}  // namespace partrain::app
