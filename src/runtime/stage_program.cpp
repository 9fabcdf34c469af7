#include "runtime/stage_program.h"

#include <algorithm>
#include <map>
#include <set>

#include "core/error.h"
#include "graph/activation_checkpointing.h"

namespace partrain::runtime {

namespace {
// Per-layer or selective recomputation of `program`'s stage (plan/plan.h recomputed_segments): the
// backward's steps of each segment, what the forward keeps (the segments' checkpoints and the saved
// tensors of the other tasks) and what each recomputation keeps (its own saved tensors besides).
void add_recomputed_segments(const Graph& graph, StageProgram& program, const std::vector<std::vector<int>>& segments) {
  std::map<int, std::size_t> step_of;  // task -> its step in the backward program
  for (std::size_t i = 0; i < program.backward.steps.size(); ++i) step_of[program.backward.steps[i].task] = i;
  std::set<int> kept, segment_tasks;
  for (const std::vector<int>& tasks : segments) {
    RecomputedSegment segment;
    segment.first_step = program.backward.steps.size();
    std::size_t steps = 0;
    for (int task : tasks) {
      segment_tasks.insert(task);
      if (auto found = step_of.find(task); found != step_of.end()) {
        segment.first_step = std::min(segment.first_step, found->second);
        segment.end_step = std::max(segment.end_step, found->second + 1);
        ++steps;
      }
    }
    if (steps == 0) continue;  // no gradient reaches it: nothing of it is needed again
    PARTRAIN_CHECK(segment.end_step - segment.first_step == steps,
                   "stage " << program.stage << ": a recomputed segment's backward steps are not consecutive");
    segment.forward = extract_subgraph(graph, tasks);
    for (int value : segment_checkpoints(graph, tasks)) kept.insert(value);
    BackwardProgram own;  // the segment's steps, for their saved tensors
    own.steps.assign(program.backward.steps.begin() + static_cast<std::ptrdiff_t>(segment.first_step),
                     program.backward.steps.begin() + static_cast<std::ptrdiff_t>(segment.end_step));
    for (int value : saved_for_backward(graph, own)) segment.keep.insert(value);
    program.segments.push_back(std::move(segment));
  }
  BackwardProgram outside;  // the steps of tasks in no segment
  for (const BackwardStep& step : program.backward.steps)
    if (!segment_tasks.count(step.task)) outside.steps.push_back(step);
  for (int value : saved_for_backward(graph, outside)) kept.insert(value);
  program.saved.assign(kept.begin(), kept.end());
  for (RecomputedSegment& segment : program.segments) {
    segment.keep.insert(kept.begin(), kept.end());
    if (program.loss >= 0) segment.keep.insert(program.loss);
  }
  std::sort(program.segments.begin(), program.segments.end(),
            [](const RecomputedSegment& a, const RecomputedSegment& b) { return a.first_step < b.first_step; });
}

// The zero-bubble split of the stage's backward (StageProgram::split).
void add_split_backward(const Graph& graph, StageProgram& program) {
  auto in_segment = [&](std::size_t step) {
    return std::any_of(program.segments.begin(), program.segments.end(), [&](const RecomputedSegment& segment) {
      return step >= segment.first_step && step < segment.end_step;
    });
  };
  program.split = split_backward(graph, program.backward, [&](std::size_t step) { return !in_segment(step); });
  const std::vector<int> position = step_positions(program.backward, program.split.input);
  for (RecomputedSegment segment : program.segments) {  // every step of a segment runs in the input half
    PARTRAIN_CHECK(segment.end_step > segment.first_step && position[segment.first_step] >= 0 &&
                       position[segment.end_step - 1] >= 0,
                   "stage " << program.stage << ": a recomputed segment's steps are not in the input-gradient half");
    segment.first_step = static_cast<std::size_t>(position[segment.first_step]);
    segment.end_step = static_cast<std::size_t>(position[segment.end_step - 1]) + 1;
    program.input_segments.push_back(std::move(segment));
  }
  program.weight_saved = saved_for_backward(graph, program.split.weight);
}
}  // namespace

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
    for (int output : graph.outputs())
      if (std::binary_search(program.subgraph.outputs.begin(), program.subgraph.outputs.end(), output))
        program.loss = output;
    if (const std::vector<std::vector<int>> segments = recomputed_segments(graph, plan.stages[s]); !segments.empty())
      add_recomputed_segments(graph, program, segments);
    if (schedule_splits_backward(plan.schedule)) add_split_backward(graph, program);
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

namespace partrain::runtime {

bool can_sub_pipeline(const Graph& graph, std::span<const StageProgram> programs) {
  for (const StageProgram& program : programs)
    for (const std::vector<int>* values : {&program.received, &program.sent, &program.data_inputs})
      for (int value : *values)
        if (!has_batch_dim(graph.value(value).type.shape)) return false;
  return true;
}

}  // namespace partrain::runtime
