#include "runtime/stage_program.h"

#include <algorithm>
#include <set>

#include "core/error.h"

namespace partrain::runtime {

std::vector<StageProgram> build_stage_programs(const Graph& graph, const Plan& plan) {
  const int stage_count = static_cast<int>(plan.stages.size());
  std::vector<int> stage_of(graph.tasks().size(), -1);
  for (int s = 0; s < stage_count; ++s)
    for (int task : plan.stages[s].tasks)
      if (!graph.task(task).constant) stage_of[task] = s;

  std::vector<StageProgram> programs(stage_count);
  std::vector<std::set<int>> crossing(stage_count);  // crossing[s]: activations sent from s to s + 1
  for (const Value& value : graph.values()) {
    if (value.kind != ValueKind::Activation || value.producer < 0 || graph.task(value.producer).constant) continue;
    const int producer_stage = stage_of[value.producer];
    int last_stage = producer_stage;
    for (int consumer : value.consumers)
      if (!graph.task(consumer).constant) last_stage = std::max(last_stage, stage_of[consumer]);
    PARTRAIN_CHECK(!graph.is_output(value.id) || producer_stage == stage_count - 1,
                   "stage programs: graph output " << value.name << " is computed in stage " << producer_stage
                                                   << ", not in the last stage");
    for (int s = producer_stage; s < last_stage; ++s) crossing[s].insert(value.id);
  }

  for (int s = 0; s < stage_count; ++s) {
    StageProgram& program = programs[s];
    program.stage = s;
    program.subgraph = extract_subgraph(graph, plan.stages[s].tasks);
    program.backward = build_backward(graph, program.subgraph);
    program.saved = saved_for_backward(graph, program.backward);
    if (plan.stages[s].recompute == RecomputePolicy::StageAware) {
      std::vector<int> prefix;
      for (int task : plan.stages[s].tasks) {
        if (task < plan.stages[s].recompute_until_task) {
          prefix.push_back(task);
        } else {
          for (int value : graph.task(task).outputs) program.kept_values.push_back(value);
        }
      }
      program.recomputed = extract_subgraph(graph, prefix);  // a prefix of a topological order: convex
      std::sort(program.kept_values.begin(), program.kept_values.end());
    }
    for (int value : program.subgraph.inputs) {
      switch (graph.value(value).kind) {
        case ValueKind::Param: program.parameters.push_back(value); break;
        case ValueKind::Buffer: program.buffers.push_back(value); break;
        case ValueKind::Input:
        case ValueKind::Label: program.data_inputs.push_back(value); break;
        default: break;
      }
    }
    if (s > 0) program.received.assign(crossing[s - 1].begin(), crossing[s - 1].end());
    program.sent.assign(crossing[s].begin(), crossing[s].end());
    for (int output : graph.outputs())
      if (std::binary_search(program.subgraph.outputs.begin(), program.subgraph.outputs.end(), output))
        program.loss = output;
  }
  // Gradients, from the last stage back: a received value sends a gradient back when this stage's
  // backward produces one for it or when it relays one that came from the next stage.
  for (int s = stage_count - 1; s >= 0; --s) {
    StageProgram& program = programs[s];
    if (s + 1 < stage_count) program.gradients_received = programs[s + 1].gradients_sent;
    for (int value : program.received) {
      const bool own = std::find(program.backward.input_grads.begin(), program.backward.input_grads.end(), value) !=
                       program.backward.input_grads.end();
      const bool relayed = std::binary_search(program.gradients_received.begin(), program.gradients_received.end(), value);
      if (own || relayed) program.gradients_sent.push_back(value);
    }
  }
  return programs;
}

}  // namespace partrain::runtime
