#pragma once
// The Plan: what every planner returns and what the runtime executes (docs/planning.md,
// docs/architecture.md §Runtime). Ordered pipeline stages (their forward task ids and a readable
// summary), replicas per stage, pipeline replicas, microbatch count and size, schedule, recompute policy
// per stage, the rank map, and the predicted time and memory of each stage. Saved as JSON; validated
// against its graph. Partitioners and the runtime meet only through Graph, ProfileDB and this Plan.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>  // declarations only: the full header costs ~3 s per translation unit

#include "graph/graph.h"

namespace partrain {

/// Pipeline schedules: GPipe (fill-drain), 1F1B (PipeDream-flush), Merak's shifted critical path,
/// Megatron's interleaved 1F1B (Narayanan et al. SC'21 §2.2: v model chunks per rank), and the
/// zero-bubble ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024 §2.1: each backward
/// split into its input-gradient and weight-gradient halves, the latter deferred into the bubbles),
/// and ZB-V (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory": two model chunks per
/// rank in a V, chunk c on stage c for c < S and on stage 2S − 1 − c after).
enum class ScheduleKind { GPipe, OneForwardOneBackward, ShiftedCriticalPath, Interleaved, ZeroBubbleH1, ZeroBubbleV };
/// Activation recomputation of a stage (docs/parallelism.md §Activation recomputation): none; the
/// whole stage from its inputs (RaNNC's stage boundaries: only the inputs are kept per microbatch);
/// Merak's stage-aware policy (a prefix of the stage recomputed); per-layer checkpointing (Chen et
/// al. 2016, Megatron-LM's --recompute-method uniform: the input of every n-th layer kept, one block
/// of n layers recomputed at a time inside the backward); or selective recomputation (Korthikanti
/// et al. 2022 §5: only the attention cores, QKᵀ to ×V, recomputed inside the backward).
enum class RecomputePolicy { None, StageBoundaries, StageAware, Layers, Selective };

struct PlanStage;
/// The segments `stage` recomputes inside its backward (graph/activation_checkpointing.h): its
/// blocks of recompute_layers layers under Layers, its attention cores under Selective, none under
/// the other policies (which recompute before the backward or not at all). `stage.tasks` index `graph`.
std::vector<std::vector<int>> recomputed_segments(const Graph& graph, const PlanStage& stage);
/// Every task of `stage` whose forward its recompute policy repeats once per microbatch, ascending:
/// all under boundaries, the prefix under stage_aware, the segments' under layers and selective.
std::vector<int> recomputed_tasks(const Graph& graph, const PlanStage& stage);

/// Numeric precision a plan is made for: fp32, or bf16 or fp16 mixed precision (16-bit working
/// parameters and activations; fp32 master weights, gradients and optimizer state; fp16 with
/// dynamic loss scaling, runtime/loss_scaler.h).
enum class Precision { Fp32, Bf16, Fp16 };

const char* precision_name(Precision precision);         // "fp32", "bf16", "fp16"
/// The dtype forward and backward compute f32 values in: F32, BF16 or F16.
DType compute_dtype_of(Precision precision);
Precision parse_precision(const std::string& name);      // throws partrain::Error on an unknown name
/// fp32 state tensors per parameter `optimizer` keeps: "adamw" 2 (exp_avg, exp_avg_sq), "sgd" 1
/// (momentum buffer). Throws partrain::Error for another name.
int state_copies_of_optimizer(const std::string& optimizer);
const char* schedule_name(ScheduleKind kind);            // "gpipe", "1f1b", "scp", "interleaved", "zb_h1", "zb_v"
/// The pipeline stage (of `depth`) running model chunk `chunk` under `kind`: chunk mod depth, or for
/// zb_v's V 2·depth − 1 − chunk from chunk depth on.
int stage_of_chunk(ScheduleKind kind, int chunk, int depth);
/// Whether `kind` runs several model chunks per rank (Plan::virtual_stages): interleaved and zb_v.
bool schedule_has_chunks(ScheduleKind kind);
/// Whether `kind` splits each backward into BackwardInput and BackwardWeight: zb_h1 and zb_v.
bool schedule_splits_backward(ScheduleKind kind);
ScheduleKind parse_schedule(const std::string& name);    // throws partrain::Error on an unknown name
/// "none", "boundaries", "stage_aware", "layers", "selective".
const char* recompute_name(RecomputePolicy policy);
/// Inverse of recompute_name; throws partrain::Error naming the valid names for another.
RecomputePolicy parse_recompute(const std::string& name);
/// Whether the stage's forward is repeated as a whole before its backward (a Recompute action of the
/// schedule: boundaries, stage_aware). Per-layer and selective recomputation run inside the backward.
bool recomputes_before_backward(RecomputePolicy policy);

/// One entry of Plan::stages: a pipeline stage, or under the interleaved schedule one model chunk
/// (a "virtual stage").
struct PlanStage {
  std::vector<int> tasks;       // forward task ids, ascending (a constant task may be cloned into
                                // every stage that consumes it)
  std::string summary;          // readable: the layers (or ops) the stage holds
  int replicas = 1;             // devices holding this stage in each pipeline replica (data parallel)
  RecomputePolicy recompute = RecomputePolicy::None;
  /// StageAware (Merak §6.2's fraction α of a stage's layers kept): the stage's tasks with an id
  /// below this one are recomputed from the stage's inputs, the others keep their activations
  /// (ids ascend in topological order, so these tasks are a convex prefix of the stage). −1 with
  /// the other policies.
  int recompute_until_task = -1;
  /// Layers: transformer layers per checkpointed block (Megatron's --recompute-num-layers), ≥ 1.
  int recompute_layers = 1;
  double forward_seconds = 0;   // predicted: one microbatch on one replica
  double backward_seconds = 0;  // predicted: one microbatch on one replica (incl. recomputation)
  double recompute_seconds = 0; // predicted: the part of backward_seconds that repeats forward work
  /// Predicted: the part of backward_seconds that computes parameter gradients (the weight-gradient
  /// half a zero-bubble schedule defers; stage_weight_gradient_share).
  double weight_gradient_seconds = 0;
  double memory_bytes = 0;      // predicted peak bytes per device
  /// Predicted: of memory_bytes, what exists only while this chunk computes (its forward's and
  /// backward's working memory, a recomputed microbatch): a rank holding several chunks
  /// (interleaved) runs one at a time and needs only the largest (Plan::rank_memory_bytes).
  double working_bytes = 0;
  double allreduce_seconds = 0; // predicted: the stage's gradient all-reduce over its data-parallel group
  /// Predicted: the part of allreduce_seconds that runs during the stage's last backward (the
  /// bucketed all-reduce starting each bucket as its gradients complete); 0 when it follows the backward.
  double allreduce_hidden_seconds = 0;
  double optimizer_seconds = 0; // predicted: the optimizer step over the stage's parameters
  /// Predicted: the all-reduce, at the start of the optimizer step, of the parameters this stage
  /// shares with other pipeline stages (GPT's tied embedding and LM head), over every rank of the
  /// stages sharing them (runtime/executor.cpp, optimizer_step); those parameters are not in
  /// allreduce_seconds. 0 when the stage shares none.
  double tied_allreduce_seconds = 0;
};

/// Where a rank sits in the plan.
struct Placement {
  int pipeline_replica = 0;  // which of the R data-parallel pipeline replicas
  int stage = 0;    // pipeline stage (rank position in the pipeline), [0, Plan::pipeline_stages())
  int replica = 0;  // among the stage's replicas in this copy
  int tensor_rank = 0;  // position in the replica's tensor-parallel group, [0, tensor_parallel)
};

struct Plan {
  std::string planner;                 // which planner made it
  std::uint64_t graph_hash = 0;        // Graph::hash() of the model it was made for
  int world_size = 1;                  // ranks = pipeline_replicas × devices_per_pipeline_replica()
  int pipeline_replicas = 1;             // R
  /// Ranks of each stage replica's tensor-parallel group (Megatron-LM's t). With t > 1 the stages'
  /// task ids index tensor_parallel_graph(model, t) (graph/tensor_parallel.h), whose hash graph_hash is.
  int tensor_parallel = 1;
  /// ZeRO stage (Rajbhandari et al. 2020): 0, or 1 — each stage's data-parallel group shards the
  /// optimizer state (reduce-scatter of the gradients, update of the rank's part, all-gather of the
  /// parameters).
  int zero = 0;
  /// Merak's sub-pipelined TMP (§6.3): with tensor_parallel > 1, each stage splits its part of every
  /// microbatch into two sub-microbatches whose tensor-parallel all-reduces overlap the other's
  /// computation (each half is then its own loss piece).
  bool sub_pipelined_tmp = false;
  /// Sequence parallelism (Korthikanti et al. 2022 §4.2.2, Megatron-LM's --sequence-parallel): with
  /// tensor_parallel > 1 the stages' task ids index tensor_parallel_graph(model, t, true), in which
  /// LayerNorm, dropout and the residual stream hold 1/t of the sequence on each rank.
  bool sequence_parallel = false;
  std::int64_t global_batch = 1;       // samples per optimizer step
  int microbatches = 1;                // per step and pipeline replica
  ScheduleKind schedule = ScheduleKind::OneForwardOneBackward;
  /// Model chunks per pipeline rank (Megatron's virtual pipeline size v; Narayanan et al. SC'21 §2.2).
  /// With v > 1 (schedule interleaved) `stages` lists the S·v model chunks in model order and chunk c
  /// runs on pipeline stage c mod S (S = pipeline_stages()): rank s holds chunks s, s + S, ..., the
  /// chunks of one pipeline stage have equal replica counts. Schedule zb_v: v = 2 and the chunks go
  /// down and back up the pipeline (a V): rank s holds chunks s and 2S − 1 − s.
  int virtual_stages = 1;
  double device_memory_bytes = 0;      // memory per device it was planned for
  // What the plan's memory was predicted for; the executor runs exactly this.
  Precision precision = Precision::Fp32;
  std::string optimizer = "adamw";     // "adamw" or "sgd"
  int optimizer_state_copies = 2;      // fp32 state tensors per parameter (AdamW 2, SGD 1)
  std::vector<PlanStage> stages;
  double predicted_step_seconds = 0;   // one optimizer step: the schedule simulated with the stage costs
  /// Predicted peak bytes of one rank of each pipeline stage where the planner walked the schedule
  /// (interleaved: which chunks' microbatches are in flight together); empty: rank_memory_bytes
  /// adds up the chunks.
  std::vector<double> rank_peak_bytes;
  double predicted_bubble_fraction = 0;  // idle share of the pipeline phase in that simulation
  /// Where the costs were measured on ranks sharing their node's cores (CostModel::core_share):
  /// ranks per node (consecutive ranks) and how many compute at full speed at once; the stage costs
  /// are then seconds on cores of a rank's own, and the simulator shares the cores
  /// (TimelineCosts::concurrent_ranks_per_node). 0, 0: every rank has cores of its own.
  int ranks_per_node = 0;
  double concurrent_ranks_per_node = 0;
  std::string cost_model;              // description of the cost model used

  /// Σ replicas over the pipeline stages × tensor_parallel (devices of one pipeline replica).
  int devices_per_pipeline_replica() const;
  /// Pipeline depth S: stages.size() / virtual_stages (the ranks of one pipeline replica's replica path).
  int pipeline_stages() const;
  /// The pipeline stage running model chunk (stages entry) `chunk`: chunk mod S (zb_v: chunk for
  /// chunk < S, 2S − 1 − chunk after).
  int stage_of_chunk(int chunk) const;
  /// The model chunks pipeline stage `stage` holds, ascending: stage, stage + S, ... (v of them; zb_v:
  /// stage, 2S − 1 − stage). Action::chunk indexes this list.
  std::vector<int> chunks_of_stage(int stage) const;
  /// The index of model chunk `chunk` in chunks_of_stage(stage_of_chunk(chunk)).
  int local_chunk_index(int chunk) const;
  /// Predicted peak bytes of a rank of pipeline stage `stage`: rank_peak_bytes[stage] when recorded,
  /// else its chunks' memory_bytes added up, each chunk's working_bytes replaced by the largest of
  /// them (the rank computes one chunk at a time).
  double rank_memory_bytes(int stage) const;
  /// Samples of one microbatch of one pipeline replica: global_batch / (pipeline_replicas · microbatches).
  std::int64_t microbatch_size() const;
  /// Samples per second predicted from predicted_step_seconds (0 when not predicted).
  double predicted_samples_per_second() const;
  /// Rank map: pipeline-replica-major, then stage, then replica, then tensor rank — a tensor-parallel group is t
  /// consecutive ranks (inside a node: Megatron's layout), the replicas of a stage follow each other.
  int rank_of(const Placement& placement) const;
  /// (placement.stage is a pipeline stage, not a model chunk.)
  /// Inverse of rank_of; throws partrain::Error for a rank outside [0, world_size).
  Placement placement_of(int rank) const;
  /// Samples [begin, end) of a microbatch that replica `replica` of `stage` (a stages entry: a pipeline
  /// stage or a model chunk) handles: the microbatch
  /// is split into `replicas` near-equal consecutive ranges, the first (size % replicas) one larger.
  std::pair<std::int64_t, std::int64_t> replica_samples(int stage, int replica) const;
  /// Index of the stage with the largest predicted forward + backward time.
  int bottleneck_stage() const;

  /// Throws partrain::Error naming the first problem: no stages, an empty stage, a non-constant task
  /// in no stage or in two, a constant task in a stage without a consumer of it, a stage that is not
  /// convex, stages out of pipeline order (an edge from a later stage to an earlier one), replica
  /// counts not positive, world_size ≠ pipeline replicas × devices, a batch that does not divide into
  /// pipeline replicas × microbatches, a microbatch smaller than a stage's replica count, a graph hash mismatch,
  /// an unbatched activation (a loss piece) crossing between stages of different replica counts;
  /// interleaved: virtual_stages < 1, v > 1 with another schedule, a stage count not a multiple of v,
  /// fewer than 2 pipeline stages, chunks of one pipeline stage with different replica counts,
  /// microbatches not a multiple of the pipeline depth (Megatron's requirement).
  void validate(const Graph& graph) const;
  /// The interleaving part of validate() (no graph needed): virtual_stages against the schedule,
  /// the stage count, pipeline depth, replica counts of co-located chunks and microbatches.
  void validate_interleaving() const;

  nlohmann::json to_json() const;
  /// Parses to_json()'s form (format version 2); `source_name` names the file in errors. A version 1
  /// plan (which did not record precision and optimizer) is an error asking to plan again.
  static Plan from_json(const nlohmann::json& document, const std::string& source_name);
  /// Writes JSON through a temporary file and a rename.
  void save(const std::string& path) const;
  static Plan load(const std::string& path);
};

/// An activation without a batch dimension (a loss, or another reduction over a replica's samples)
/// that stage `from_stage` computes and a later stage up to `to_stage` reads. Such a value cannot be
/// split by samples: replicas exchange it whole, so it may only cross between stages whose replicas
/// hold the same samples (equal replica counts from `from_stage` to `to_stage`).
struct UnbatchedCrossing {
  int value = -1;
  int from_stage = 0;
  int to_stage = 0;
};

/// Every unbatched activation that crosses a stage boundary of `stages` (non-constant tasks each in
/// one stage; tasks in no stage are ignored), in value id order.
std::vector<UnbatchedCrossing> unbatched_crossings(const Graph& graph, const std::vector<PlanStage>& stages);

/// A readable summary of a task set: consecutive layers as ranges ("embeddings, encoder.layer.0-5")
/// using the task names' layer (graph/layer_names.h layer_of); op names when the set holds part of
/// one layer.
std::string summarize_tasks(const Graph& graph, const std::vector<int>& tasks);

/// The plan table: one row per stage (tasks, layers/ops, replicas, microbatch size per replica,
/// predicted forward/backward ms, memory GiB, the bottleneck marked), then the predicted step time
/// and samples/s.
std::string format_plan_table(const Plan& plan);

}  // namespace partrain
