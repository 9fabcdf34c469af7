#include "plan/plan.h"

#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <map>
#include <sstream>

#include "core/error.h"
#include "graph/activation_checkpointing.h"
#include "graph/layer_names.h"
#include "graph/subgraph.h"
#include "graph/tensor_parallel.h"
#include "io/json_file.h"
#include <nlohmann/json.hpp>

namespace partrain {

// ---------------- names ----------------

const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::Fp32: return "fp32";
    case Precision::Bf16: return "bf16";
    case Precision::Fp16: return "fp16";
  }
  return "?";
}

DType compute_dtype_of(Precision precision) {
  switch (precision) {
    case Precision::Fp32: return DType::F32;
    case Precision::Bf16: return DType::BF16;
    case Precision::Fp16: return DType::F16;
  }
  return DType::F32;
}

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::Fp32;
  if (name == "bf16") return Precision::Bf16;
  if (name == "fp16") return Precision::Fp16;
  PARTRAIN_FAIL("unknown precision '" << name << "' (expected fp32, bf16 or fp16)");
}

int state_copies_of_optimizer(const std::string& optimizer) {
  if (optimizer == "adamw") return 2;
  if (optimizer == "sgd") return 1;
  PARTRAIN_FAIL("optimizer '" << optimizer << "' is unknown (adamw, sgd)");
}

const char* schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::GPipe: return "gpipe";
    case ScheduleKind::OneForwardOneBackward: return "1f1b";
    case ScheduleKind::ShiftedCriticalPath: return "scp";
    case ScheduleKind::Interleaved: return "interleaved";
    case ScheduleKind::ZeroBubbleH1: return "zb_h1";
    case ScheduleKind::ZeroBubbleV: return "zb_v";
  }
  return "?";
}

ScheduleKind parse_schedule(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::GPipe;
  if (name == "1f1b") return ScheduleKind::OneForwardOneBackward;
  if (name == "scp") return ScheduleKind::ShiftedCriticalPath;
  if (name == "interleaved") return ScheduleKind::Interleaved;
  if (name == "zb_h1") return ScheduleKind::ZeroBubbleH1;
  if (name == "zb_v") return ScheduleKind::ZeroBubbleV;
  PARTRAIN_FAIL("unknown schedule '" << name << "' (expected gpipe, 1f1b, scp, interleaved, zb_h1 or zb_v)");
}

bool schedule_has_chunks(ScheduleKind kind) { return kind == ScheduleKind::Interleaved || kind == ScheduleKind::ZeroBubbleV; }

bool schedule_splits_backward(ScheduleKind kind) {
  return kind == ScheduleKind::ZeroBubbleH1 || kind == ScheduleKind::ZeroBubbleV;
}

const char* recompute_name(RecomputePolicy policy) {
  switch (policy) {
    case RecomputePolicy::None: return "none";
    case RecomputePolicy::StageBoundaries: return "boundaries";
    case RecomputePolicy::StageAware: return "stage_aware";
    case RecomputePolicy::Layers: return "layers";
    case RecomputePolicy::Selective: return "selective";
  }
  return "?";
}

RecomputePolicy parse_recompute(const std::string& name) {
  if (name == "none") return RecomputePolicy::None;
  if (name == "boundaries") return RecomputePolicy::StageBoundaries;
  if (name == "stage_aware") return RecomputePolicy::StageAware;
  if (name == "layers") return RecomputePolicy::Layers;
  if (name == "selective") return RecomputePolicy::Selective;
  PARTRAIN_FAIL("unknown recompute policy '" << name
                                             << "' (expected none, boundaries, stage_aware, layers or selective)");
}

std::vector<std::vector<int>> recomputed_segments(const Graph& graph, const PlanStage& stage) {
  if (stage.recompute == RecomputePolicy::Layers) return layer_checkpoint_blocks(graph, stage.tasks, stage.recompute_layers);
  if (stage.recompute == RecomputePolicy::Selective) return attention_core_segments(graph, stage.tasks);
  return {};
}

std::vector<int> recomputed_tasks(const Graph& graph, const PlanStage& stage) {
  std::vector<int> tasks;
  switch (stage.recompute) {
    case RecomputePolicy::None: break;
    case RecomputePolicy::StageBoundaries: tasks = stage.tasks; break;
    case RecomputePolicy::StageAware:
      for (int task : stage.tasks)
        if (task < stage.recompute_until_task) tasks.push_back(task);
      break;
    case RecomputePolicy::Layers:
    case RecomputePolicy::Selective:
      for (const std::vector<int>& segment : recomputed_segments(graph, stage)) tasks.insert(tasks.end(), segment.begin(), segment.end());
      std::sort(tasks.begin(), tasks.end());
      break;
  }
  return tasks;
}

bool recomputes_before_backward(RecomputePolicy policy) {
  return policy == RecomputePolicy::StageBoundaries || policy == RecomputePolicy::StageAware;
}

// ---------------- derived quantities ----------------

int Plan::devices_per_pipeline_replica() const {
  int devices = 0;
  const int depth = pipeline_stages();
  for (int s = 0; s < depth; ++s) devices += stages[s].replicas;  // chunk s is pipeline stage s's first
  return devices * tensor_parallel;
}

int Plan::pipeline_stages() const {
  const int chunks = static_cast<int>(stages.size());
  return virtual_stages > 1 ? chunks / virtual_stages : chunks;
}

int stage_of_chunk(ScheduleKind kind, int chunk, int depth) {
  if (kind == ScheduleKind::ZeroBubbleV && chunk >= depth) return 2 * depth - 1 - chunk;
  return chunk % depth;
}

int Plan::stage_of_chunk(int chunk) const { return partrain::stage_of_chunk(schedule, chunk, pipeline_stages()); }

int Plan::local_chunk_index(int chunk) const {
  const int depth = pipeline_stages();
  if (schedule == ScheduleKind::ZeroBubbleV) return chunk >= depth ? 1 : 0;
  return chunk / depth;
}

std::vector<int> Plan::chunks_of_stage(int stage) const {
  std::vector<int> chunks;
  const int depth = pipeline_stages();
  if (schedule == ScheduleKind::ZeroBubbleV && virtual_stages == 2) return {stage, 2 * depth - 1 - stage};
  for (int c = stage; depth > 0 && c < static_cast<int>(stages.size()); c += depth) chunks.push_back(c);
  return chunks;
}

double Plan::rank_memory_bytes(int stage) const {
  if (stage >= 0 && static_cast<std::size_t>(stage) < rank_peak_bytes.size()) return rank_peak_bytes[stage];
  double held = 0, working = 0;
  for (int chunk : chunks_of_stage(stage)) {
    held += stages[chunk].memory_bytes - stages[chunk].working_bytes;
    working = std::max(working, stages[chunk].working_bytes);
  }
  return held + working;
}

std::int64_t Plan::microbatch_size() const {
  const std::int64_t divisor = static_cast<std::int64_t>(pipeline_replicas) * microbatches;
  return divisor > 0 ? global_batch / divisor : 0;
}

double Plan::predicted_samples_per_second() const {
  return predicted_step_seconds > 0 ? static_cast<double>(global_batch) / predicted_step_seconds : 0.0;
}

int Plan::rank_of(const Placement& placement) const {
  PARTRAIN_CHECK(placement.pipeline_replica >= 0 && placement.pipeline_replica < pipeline_replicas && placement.stage >= 0 &&
                     placement.stage < pipeline_stages() && placement.replica >= 0 &&
                     placement.replica < stages[placement.stage].replicas,
                 "plan: no rank for pipeline replica " << placement.pipeline_replica << ", stage " << placement.stage << ", replica "
                                           << placement.replica);
  PARTRAIN_CHECK(placement.tensor_rank >= 0 && placement.tensor_rank < tensor_parallel,
                 "plan: no tensor-parallel rank " << placement.tensor_rank << " in a group of " << tensor_parallel);
  int replicas_before = 0;
  for (int s = 0; s < placement.stage; ++s) replicas_before += stages[s].replicas;
  return placement.pipeline_replica * devices_per_pipeline_replica() + (replicas_before + placement.replica) * tensor_parallel +
         placement.tensor_rank;
}

Placement Plan::placement_of(int rank) const {
  const int devices = devices_per_pipeline_replica();
  PARTRAIN_CHECK(devices > 0 && rank >= 0 && rank < pipeline_replicas * devices,
                 "plan: rank " << rank << " is outside the plan's " << pipeline_replicas * devices << " ranks");
  Placement placement;
  placement.pipeline_replica = rank / devices;
  placement.tensor_rank = rank % devices % tensor_parallel;
  int offset = rank % devices / tensor_parallel;
  while (offset >= stages[placement.stage].replicas) offset -= stages[placement.stage++].replicas;
  placement.replica = offset;
  return placement;
}

std::pair<std::int64_t, std::int64_t> Plan::replica_samples(int stage, int replica) const {
  PARTRAIN_CHECK(stage >= 0 && stage < static_cast<int>(stages.size()) && replica >= 0 &&
                     replica < stages[stage].replicas,
                 "plan: stage " << stage << " has no replica " << replica);
  const std::int64_t size = microbatch_size();
  const std::int64_t parts = stages[stage].replicas;
  const std::int64_t base = size / parts, extra = size % parts;
  const std::int64_t begin = replica * base + std::min<std::int64_t>(replica, extra);
  return {begin, begin + base + (replica < extra ? 1 : 0)};
}

int Plan::bottleneck_stage() const {
  int best = 0;
  for (int s = 1; s < static_cast<int>(stages.size()); ++s) {
    if (stages[s].forward_seconds + stages[s].backward_seconds >
        stages[best].forward_seconds + stages[best].backward_seconds)
      best = s;
  }
  return best;
}

// ---------------- validation ----------------

void Plan::validate_interleaving() const {
  PARTRAIN_CHECK(virtual_stages >= 1, "plan (" << planner << "): virtual_stages must be at least 1, got " << virtual_stages);
  PARTRAIN_CHECK(virtual_stages == 1 || schedule_has_chunks(schedule),
                 "plan (" << planner << "): virtual_stages = " << virtual_stages
                          << " needs the interleaved or zb_v schedule, not " << schedule_name(schedule));
  if (schedule == ScheduleKind::ZeroBubbleV) {
    PARTRAIN_CHECK(virtual_stages == 2 && stages.size() % 2 == 0,
                   "plan (" << planner << "): the zb_v schedule needs virtual_stages = 2 (two model chunks per rank in "
                            << "a V) and an even number of chunks, not " << virtual_stages << " and " << stages.size());
    const int depth = pipeline_stages();
    for (int c = depth; c < static_cast<int>(stages.size()); ++c)
      PARTRAIN_CHECK(stages[c].replicas == stages[stage_of_chunk(c)].replicas,
                     "plan (" << planner << "): model chunk " << c << " has " << stages[c].replicas
                              << " replicas but runs on pipeline stage " << stage_of_chunk(c) << " with chunk "
                              << stage_of_chunk(c) << "'s " << stages[stage_of_chunk(c)].replicas);
    return;
  }
  if (schedule != ScheduleKind::Interleaved) return;
  const int chunks = static_cast<int>(stages.size());
  PARTRAIN_CHECK(chunks % virtual_stages == 0,
                 "plan (" << planner << "): " << chunks << " model chunks do not divide into " << virtual_stages
                          << " virtual stages per pipeline rank");
  const int depth = pipeline_stages();
  PARTRAIN_CHECK(depth >= 2 || virtual_stages == 1,
                 "plan (" << planner << "): the interleaved schedule with virtual_stages = " << virtual_stages
                          << " needs at least 2 pipeline stages (a rank does not send to itself), got " << depth);
  for (int c = depth; c < chunks; ++c)
    PARTRAIN_CHECK(stages[c].replicas == stages[c % depth].replicas,
                   "plan (" << planner << "): model chunk " << c << " has " << stages[c].replicas
                            << " replicas but runs on pipeline stage " << c % depth << " with chunk " << c % depth
                            << "'s " << stages[c % depth].replicas);
  PARTRAIN_CHECK(microbatches % depth == 0,
                 "plan (" << planner << "): the interleaved schedule needs the microbatches (" << microbatches
                          << ") to be a multiple of the pipeline depth (" << depth << "), as in Megatron-LM");
}

std::vector<UnbatchedCrossing> unbatched_crossings(const Graph& graph, const std::vector<PlanStage>& stages) {
  std::vector<int> stage_of(graph.tasks().size(), -1);
  for (int s = 0; s < static_cast<int>(stages.size()); ++s)
    for (int task : stages[s].tasks)
      if (task >= 0 && task < static_cast<int>(stage_of.size()) && !graph.task(task).constant) stage_of[task] = s;
  std::vector<UnbatchedCrossing> result;
  for (const Value& value : graph.values()) {
    if (value.kind != ValueKind::Activation || value.producer < 0 || has_batch_dim(value.type.shape)) continue;
    const Task& producer = graph.task(value.producer);
    if (producer.constant || stage_of[producer.id] < 0) continue;
    UnbatchedCrossing crossing{value.id, stage_of[producer.id], stage_of[producer.id]};
    for (int consumer : value.consumers)
      if (!graph.task(consumer).constant) crossing.to_stage = std::max(crossing.to_stage, stage_of[consumer]);
    if (crossing.to_stage > crossing.from_stage) result.push_back(crossing);
  }
  return result;
}

void Plan::validate(const Graph& graph) const {
  PARTRAIN_CHECK(!stages.empty(), "plan (" << planner << "): it has no stages");
  validate_interleaving();
  PARTRAIN_CHECK(graph_hash == 0 || graph_hash == graph.hash(),
                 "plan (" << planner << "): it was made for another model (graph hash differs)");
  // (Planners validate their plans of tensor-parallel groups before recording t: only then must it match.)
  PARTRAIN_CHECK(tensor_parallel == 1 || sequence_parallel == is_sequence_parallel(graph),
                 "plan (" << planner << "): sequence_parallel is " << (sequence_parallel ? "true" : "false")
                          << " but the graph was made " << (sequence_parallel ? "without" : "with") << " it");
  const int task_count = static_cast<int>(graph.tasks().size());
  std::vector<int> stage_of(task_count, -1);
  std::vector<std::vector<int>> constant_stages(task_count);
  for (int s = 0; s < static_cast<int>(stages.size()); ++s) {
    const PlanStage& stage = stages[s];
    PARTRAIN_CHECK(!stage.tasks.empty(), "plan (" << planner << "): stage " << s << " is empty");
    PARTRAIN_CHECK(stage.replicas > 0, "plan (" << planner << "): stage " << s << " has " << stage.replicas << " replicas");
    PARTRAIN_CHECK(std::is_sorted(stage.tasks.begin(), stage.tasks.end()) &&
                       std::adjacent_find(stage.tasks.begin(), stage.tasks.end()) == stage.tasks.end(),
                   "plan (" << planner << "): stage " << s << "'s task ids are not ascending and distinct");
    // Stage-aware recomputation recomputes a proper, non-empty prefix of the stage's tasks.
    PARTRAIN_CHECK((stage.recompute == RecomputePolicy::StageAware) ==
                           (stage.recompute_until_task > stage.tasks.front() && stage.recompute_until_task <= stage.tasks.back()),
                   "plan (" << planner << "): stage " << s << " recomputes the tasks below " << stage.recompute_until_task
                            << " under policy " << recompute_name(stage.recompute) << " (stage_aware needs an id in ("
                            << stage.tasks.front() << ", " << stage.tasks.back() << "], the others none)");
    PARTRAIN_CHECK(stage.recompute_layers >= 1, "plan (" << planner << "): stage " << s << " checkpoints every "
                                                         << stage.recompute_layers << " layers (recompute_layers must be ≥ 1)");
    std::vector<int> non_constant;
    for (int task : stage.tasks) {
      PARTRAIN_CHECK(task >= 0 && task < task_count, "plan (" << planner << "): stage " << s << " names task "
                                                              << task << ", but the graph has " << task_count);
      if (graph.task(task).constant) {
        constant_stages[task].push_back(s);
        continue;
      }
      PARTRAIN_CHECK(stage_of[task] < 0, "plan (" << planner << "): task " << graph.task(task).name
                                                  << " is in stages " << stage_of[task] << " and " << s);
      stage_of[task] = s;
      non_constant.push_back(task);
    }
    PARTRAIN_CHECK(!non_constant.empty() || stages.size() == 1,
                   "plan (" << planner << "): stage " << s << " holds only constant tasks");
  }
  for (const Task& task : graph.tasks()) {
    if (task.constant) {
      PARTRAIN_CHECK(!constant_stages[task.id].empty(),
                     "plan (" << planner << "): constant task " << task.name << " is in no stage");
    } else {
      PARTRAIN_CHECK(stage_of[task.id] >= 0, "plan (" << planner << "): task " << task.name << " is in no stage");
    }
  }
  for (int s = 0; s < static_cast<int>(stages.size()); ++s) {
    std::vector<int> non_constant;
    for (int task : stages[s].tasks)
      if (!graph.task(task).constant) non_constant.push_back(task);
    if (!non_constant.empty())
      PARTRAIN_CHECK(is_convex(graph, non_constant), "plan (" << planner << "): stage " << s << " is not convex");
  }
  for (const Task& task : graph.tasks()) {
    if (task.constant) continue;
    for (int output : task.outputs) {
      for (int consumer : graph.value(output).consumers) {
        if (graph.task(consumer).constant) continue;
        PARTRAIN_CHECK(stage_of[consumer] >= stage_of[task.id],
                       "plan (" << planner << "): stages are out of pipeline order: task " << task.name << " (stage "
                                << stage_of[task.id] << ") feeds " << graph.task(consumer).name << " (stage "
                                << stage_of[consumer] << ")");
      }
    }
  }
  // A loss piece (or any unbatched activation) is exchanged whole between replicas with the same
  // samples: the stages it crosses must split every microbatch alike.
  for (const UnbatchedCrossing& crossing : unbatched_crossings(graph, stages))
    for (int s = crossing.from_stage + 1; s <= crossing.to_stage; ++s)
      PARTRAIN_CHECK(stages[s].replicas == stages[crossing.from_stage].replicas,
                     "plan (" << planner << "): " << graph.value(crossing.value).name
                              << " has no batch dimension (a reduction over a replica's samples) and crosses from stage "
                              << crossing.from_stage << " (" << stages[crossing.from_stage].replicas
                              << " replicas) to stage " << s << " (" << stages[s].replicas
                              << " replicas); it can only cross between stages with equal replicas");
  // A cloned constant task must feed something in each stage that holds it.
  for (const Task& task : graph.tasks()) {
    for (int s : constant_stages[task.id]) {
      bool used = graph.is_output(task.outputs.front());
      for (int output : task.outputs)
        for (int consumer : graph.value(output).consumers) {
          const std::vector<int>& tasks = stages[s].tasks;
          used = used || std::binary_search(tasks.begin(), tasks.end(), consumer);
        }
      PARTRAIN_CHECK(used, "plan (" << planner << "): constant task " << task.name << " is in stage " << s
                                    << ", which does not use it");
    }
  }
  PARTRAIN_CHECK((optimizer == "adamw" || optimizer == "sgd") && optimizer_state_copies == state_copies_of_optimizer(optimizer),
                 "plan (" << planner << "): optimizer '" << optimizer << "' with " << optimizer_state_copies
                          << " state copies (expected adamw with 2 or sgd with 1)");
  PARTRAIN_CHECK(pipeline_replicas > 0 && microbatches > 0,
                 "plan (" << planner << "): pipeline replicas and microbatches must be positive");
  PARTRAIN_CHECK(tensor_parallel >= 1, "plan (" << planner << "): tensor_parallel must be at least 1, got " << tensor_parallel);
  PARTRAIN_CHECK(zero == 0 || zero == 1, "plan (" << planner << "): zero must be 0 or 1, got " << zero);
  PARTRAIN_CHECK(!sequence_parallel || tensor_parallel > 1,
                 "plan (" << planner << "): sequence_parallel needs tensor_parallel > 1, got " << tensor_parallel);
  PARTRAIN_CHECK(world_size == pipeline_replicas * devices_per_pipeline_replica(),
                 "plan (" << planner << "): the world size " << world_size << " is not " << pipeline_replicas
                          << " pipeline replicas x " << devices_per_pipeline_replica() << " devices per pipeline replica");
  PARTRAIN_CHECK(global_batch % (static_cast<std::int64_t>(pipeline_replicas) * microbatches) == 0,
                 "plan (" << planner << "): the global batch " << global_batch << " does not divide into "
                          << pipeline_replicas << " pipeline replicas x " << microbatches << " microbatches");
  for (int s = 0; s < static_cast<int>(stages.size()); ++s)
    PARTRAIN_CHECK(microbatch_size() >= stages[s].replicas,
                   "plan (" << planner << "): a microbatch of " << microbatch_size() << " samples cannot feed the "
                            << stages[s].replicas << " replicas of stage " << s);
}

// ---------------- JSON ----------------

namespace {
std::string hash_hex(std::uint64_t hash) {
  std::ostringstream text;
  text << std::hex << std::setw(16) << std::setfill('0') << hash;
  return text.str();
}
}  // namespace

nlohmann::json Plan::to_json() const {
  nlohmann::json stage_list = nlohmann::json::array();
  for (const PlanStage& stage : stages) {
    stage_list.push_back({{"summary", stage.summary}, {"replicas", stage.replicas},
                          {"recompute", recompute_name(stage.recompute)}, {"forward_seconds", stage.forward_seconds},
                          {"backward_seconds", stage.backward_seconds}, {"memory_bytes", stage.memory_bytes},
                          {"working_bytes", stage.working_bytes},
                          {"allreduce_seconds", stage.allreduce_seconds},
                          {"allreduce_hidden_seconds", stage.allreduce_hidden_seconds},
                          {"optimizer_seconds", stage.optimizer_seconds},
                          {"tasks", stage.tasks}});
    if (stage.recompute == RecomputePolicy::StageAware) stage_list.back()["recompute_until_task"] = stage.recompute_until_task;
    if (stage.recompute == RecomputePolicy::Layers) stage_list.back()["recompute_layers"] = stage.recompute_layers;
    if (stage.recompute_seconds > 0) stage_list.back()["recompute_seconds"] = stage.recompute_seconds;
    if (stage.weight_gradient_seconds > 0) stage_list.back()["weight_gradient_seconds"] = stage.weight_gradient_seconds;
    if (stage.tied_allreduce_seconds > 0) stage_list.back()["tied_allreduce_seconds"] = stage.tied_allreduce_seconds;
  }
  nlohmann::json document = {{"format", "partrain-plan"},
                    {"version", 2},
                    {"planner", planner},
                    {"graph_hash", hash_hex(graph_hash)},
                    {"world_size", world_size},
                    {"pipeline_replicas", pipeline_replicas},
                    {"tensor_parallel", tensor_parallel},
                    {"zero", zero},
                    {"sub_pipelined_tmp", sub_pipelined_tmp},
                    {"sequence_parallel", sequence_parallel},
                    {"global_batch", global_batch},
                    {"microbatches", microbatches},
                    {"schedule", schedule_name(schedule)},
                    {"virtual_stages", virtual_stages},
                    {"precision", precision_name(precision)},
                    {"optimizer", optimizer},
                    {"optimizer_state_copies", optimizer_state_copies},
                    {"device_memory_bytes", device_memory_bytes},
                    {"predicted_step_seconds", predicted_step_seconds},
                    {"predicted_bubble_fraction", predicted_bubble_fraction},
                    {"cost_model", cost_model},
                    {"stages", stage_list}};
  if (!rank_peak_bytes.empty()) document["rank_peak_bytes"] = rank_peak_bytes;
  if (ranks_per_node > 0) {
    document["ranks_per_node"] = ranks_per_node;
    document["concurrent_ranks_per_node"] = concurrent_ranks_per_node;
  }
  return document;
}

Plan Plan::from_json(const nlohmann::json& document, const std::string& source_name) {
  try {
    PARTRAIN_CHECK(document.is_object() && document.value("format", "") == "partrain-plan",
                   source_name << ": not a partrain plan (key 'format' is not \"partrain-plan\")");
    PARTRAIN_CHECK(document.at("version").get<int>() != 1,
                   source_name << ": a plan of format version 1, which does not record the precision and optimizer "
                                  "it was made for; make it again with partrain plan --save");
    PARTRAIN_CHECK(document.at("version").get<int>() == 2,
                   source_name << ": plan version " << document.at("version") << " is not supported");
    Plan plan;
    plan.planner = document.at("planner").get<std::string>();
    plan.graph_hash = std::stoull(document.at("graph_hash").get<std::string>(), nullptr, 16);
    plan.world_size = document.at("world_size").get<int>();
    // Plans saved before the rename call the pipeline replicas "pipeline_copies".
    plan.pipeline_replicas = document.at(document.contains("pipeline_replicas") ? "pipeline_replicas" : "pipeline_copies").get<int>();
    plan.tensor_parallel = document.value("tensor_parallel", 1);  // plans made before tensor parallelism: 1
    plan.zero = document.value("zero", 0);
    plan.sub_pipelined_tmp = document.value("sub_pipelined_tmp", false);
    plan.sequence_parallel = document.value("sequence_parallel", false);  // plans made before sequence parallelism
    plan.global_batch = document.at("global_batch").get<std::int64_t>();
    plan.microbatches = document.at("microbatches").get<int>();
    plan.schedule = parse_schedule(document.at("schedule").get<std::string>());
    plan.virtual_stages = document.value("virtual_stages", 1);  // plans made before interleaving: 1
    plan.precision = parse_precision(document.at("precision").get<std::string>());
    plan.optimizer = document.at("optimizer").get<std::string>();
    plan.optimizer_state_copies = document.at("optimizer_state_copies").get<int>();
    plan.device_memory_bytes = document.value("device_memory_bytes", 0.0);
    plan.predicted_step_seconds = document.value("predicted_step_seconds", 0.0);
    plan.predicted_bubble_fraction = document.value("predicted_bubble_fraction", 0.0);
    plan.cost_model = document.value("cost_model", std::string());
    plan.rank_peak_bytes = document.value("rank_peak_bytes", std::vector<double>{});
    plan.ranks_per_node = document.value("ranks_per_node", 0);  // plans of ranks with cores of their own: 0
    plan.concurrent_ranks_per_node = document.value("concurrent_ranks_per_node", 0.0);
    PARTRAIN_CHECK(plan.ranks_per_node >= 0 && plan.concurrent_ranks_per_node >= 0,
                   source_name << ": ranks_per_node and concurrent_ranks_per_node must be non-negative");
    for (const nlohmann::json& entry : document.at("stages")) {
      PlanStage stage;
      stage.summary = entry.value("summary", std::string());
      stage.replicas = entry.at("replicas").get<int>();
      stage.recompute = parse_recompute(entry.value("recompute", std::string("none")));
      stage.recompute_until_task = entry.value("recompute_until_task", -1);
      stage.recompute_layers = entry.value("recompute_layers", 1);
      stage.recompute_seconds = entry.value("recompute_seconds", 0.0);
      stage.weight_gradient_seconds = entry.value("weight_gradient_seconds", 0.0);
      stage.forward_seconds = entry.value("forward_seconds", 0.0);
      stage.backward_seconds = entry.value("backward_seconds", 0.0);
      stage.memory_bytes = entry.value("memory_bytes", 0.0);
      stage.working_bytes = entry.value("working_bytes", 0.0);
      stage.allreduce_seconds = entry.value("allreduce_seconds", 0.0);
      stage.allreduce_hidden_seconds = entry.value("allreduce_hidden_seconds", 0.0);
      stage.optimizer_seconds = entry.value("optimizer_seconds", 0.0);
      stage.tied_allreduce_seconds = entry.value("tied_allreduce_seconds", 0.0);
      stage.tasks = entry.at("tasks").get<std::vector<int>>();
      plan.stages.push_back(std::move(stage));
    }
    return plan;
  } catch (const nlohmann::json::exception& error) {
    PARTRAIN_FAIL(source_name << ": malformed plan: " << error.what());
  } catch (const std::logic_error& error) {  // stoull
    PARTRAIN_FAIL(source_name << ": malformed plan graph_hash: " << error.what());
  }
}

void Plan::save(const std::string& path) const { io::write_json_file(path, to_json(), "the plan"); }

Plan Plan::load(const std::string& path) { return from_json(io::read_json_file(path, "the plan"), path); }

// ---------------- summaries and the table ----------------

namespace {
// "encoder.layer.12" -> {"encoder.layer.", 12}; names without a trailing number -> {name, -1}.
std::pair<std::string, long> split_index(const std::string& name) {
  std::size_t digits = name.size();
  while (digits > 0 && std::isdigit(static_cast<unsigned char>(name[digits - 1]))) --digits;
  if (digits == name.size() || digits == 0) return {name, -1};
  return {name.substr(0, digits), std::stol(name.substr(digits))};
}
}  // namespace

std::string summarize_tasks(const Graph& graph, const std::vector<int>& tasks) {
  // Layers in order of first appearance, with how many of their non-constant tasks are present.
  std::vector<std::string> layers;
  std::map<std::string, int> present;
  for (int task : tasks) {
    if (graph.task(task).constant) continue;
    const std::string layer = layer_of(graph.task(task).name);
    if (present[layer]++ == 0) layers.push_back(layer);
  }
  if (layers.empty()) return "(constants)";
  if (layers.size() == 1) {
    int total = 0;
    for (const Task& task : graph.tasks()) total += !task.constant && layer_of(task.name) == layers.front();
    if (present[layers.front()] < total)
      return layers.front() + " (" + std::to_string(present[layers.front()]) + " of " + std::to_string(total) + " ops)";
    return layers.front();
  }
  std::ostringstream text;
  for (std::size_t i = 0; i < layers.size();) {
    auto [prefix, first] = split_index(layers[i]);
    std::size_t j = i;
    long last = first;
    while (first >= 0 && j + 1 < layers.size()) {
      auto [next_prefix, next_index] = split_index(layers[j + 1]);
      if (next_prefix != prefix || next_index != last + 1) break;
      last = next_index;
      ++j;
    }
    if (i > 0) text << ", ";
    text << layers[i];
    if (j > i) text << "-" << last;
    i = j + 1;
  }
  return text.str();
}

std::string format_plan_table(const Plan& plan) {
  std::ostringstream out;
  const int bottleneck = plan.bottleneck_stage();
  char line[512];
  out << "plan: " << plan.planner << ", " << plan.pipeline_stages() << " stages x " << plan.pipeline_replicas
      << " pipeline replicas";
  if (plan.virtual_stages > 1 && plan.schedule == ScheduleKind::ZeroBubbleV)
    out << " (V: 2 model chunks per stage, rows are chunks; chunk c on stage c, from chunk " << plan.pipeline_stages()
        << " on stage " << 2 * plan.pipeline_stages() - 1 << " - c)";
  else if (plan.virtual_stages > 1)
    out << " (interleaved: " << plan.virtual_stages << " model chunks per stage, rows are chunks on stage chunk mod "
        << plan.pipeline_stages() << ")";
  if (plan.tensor_parallel > 1)
    out << " x tensor parallel " << plan.tensor_parallel << (plan.sequence_parallel ? " + sequence parallel" : "")
        << (plan.sub_pipelined_tmp ? " (sub-pipelined)" : "");
  if (plan.zero > 0) out << ", ZeRO-" << plan.zero;
  out << " on " << plan.world_size << " devices, " << plan.microbatches << " microbatches of "
      << plan.microbatch_size() << " samples, schedule " << schedule_name(plan.schedule) << "\n";
  if (!plan.cost_model.empty()) out << "costs: " << plan.cost_model << "\n";
  std::snprintf(line, sizeof line, "%-5s %-6s %-8s %-10s %10s %10s %10s %-11s %s\n", "stage", "tasks", "replicas",
                "mb/replica", "fwd_ms", "bwd_ms", "mem_GiB", "recompute", "layers");
  out << line;
  for (int s = 0; s < static_cast<int>(plan.stages.size()); ++s) {
    const PlanStage& stage = plan.stages[s];
    auto [begin, end] = plan.replica_samples(s, 0);
    std::string recompute = recompute_name(stage.recompute);  // "layers/2": checkpoints every 2 layers
    if (stage.recompute == RecomputePolicy::Layers && stage.recompute_layers > 1)
      recompute += "/" + std::to_string(stage.recompute_layers);
    std::snprintf(line, sizeof line, "%-5d %-6zu %-8d %-10lld %10.3f %10.3f %10.3f %-11s %s%s\n", s,
                  stage.tasks.size(), stage.replicas, static_cast<long long>(end - begin),
                  stage.forward_seconds * 1e3, stage.backward_seconds * 1e3, stage.memory_bytes / (1ull << 30),
                  recompute.c_str(), stage.summary.c_str(),
                  s == bottleneck && plan.stages.size() > 1 ? "  <- bottleneck" : "");
    out << line;
  }
  if (plan.predicted_step_seconds > 0) {
    std::snprintf(line, sizeof line, "predicted: %.3f ms per step, %.1f samples/s, bubble %.1f%% (%s simulated)\n",
                  plan.predicted_step_seconds * 1e3, plan.predicted_samples_per_second(),
                  plan.predicted_bubble_fraction * 100, schedule_name(plan.schedule));
    out << line;
  }
  return out.str();
}

}  // namespace partrain
