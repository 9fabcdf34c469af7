#pragma once
// Memory of one device holding a pipeline stage (docs/planning.md §Memory): parameters + gradients
// + optimizer state (+ fp32 master weights in mixed precision) + the activations of the microbatches
// in flight under the schedule + working memory + communication buffers. Sizes in bytes.
#include "profile/profile_db.h"

namespace partrain::profile {

/// What besides the measurement decides a stage's memory.
struct MemoryPolicy {
  int optimizer_state_copies = 2;      // fp32 copies per parameter: AdamW 2 (exp_avg, exp_avg_sq), SGD 1
  bool mixed_precision = false;        // bf16 working weights next to fp32 master weights
  bool recompute = false;              // activation recomputation: keep only the boundary inputs
  /// Stage-aware recomputation (Merak §6.2): bytes per microbatch of the activations of the stage's
  /// tasks that are not recomputed, kept with the boundary inputs; 0 recomputes the whole stage.
  double kept_activation_bytes = 0.0;
  /// Per-layer or selective recomputation (graph/activation_checkpointing.h: segments recomputed
  /// inside the backward, one at a time): each microbatch in flight keeps `checkpoint_bytes` (the
  /// segments' checkpoints and the saved tensors of the tasks outside them) instead of the measured
  /// activation bytes, and during a backward the largest segment's recomputed saved tensors,
  /// `recomputed_peak_bytes`, are alive besides. Excludes `recompute`.
  bool segmented = false;
  double checkpoint_bytes = 0.0;
  double recomputed_peak_bytes = 0.0;
  int microbatches_in_flight = 1;      // forward passes stored before their backward (1F1B: S - s; GPipe: M)
  double communication_buffer_bytes = 0.0;
  /// ZeRO-1 (Rajbhandari et al. 2020): ranks of the stage's data-parallel group that the optimizer
  /// state is sharded over; 1: not sharded.
  int optimizer_shards = 1;
  /// Of the stage's parameter bytes, those ZeRO-1 leaves whole: parameters tied to another stage
  /// (reduced over the stages that share them, runtime/executor.h).
  double unsharded_parameter_bytes = 0.0;
};

/// A stage's memory by how long it lives (bytes): the model state throughout the step, each microbatch
/// in flight's stored activations from its forward to its backward, and the working memory that
/// exists only while the stage computes (forward and backward temporaries, a recomputed microbatch).
struct StageMemory {
  double model_state = 0;
  double per_microbatch = 0;
  int in_flight = 1;  // MemoryPolicy::microbatches_in_flight
  double working = 0;
  /// The stage's peak: model_state + in_flight · per_microbatch + working.
  double total() const { return model_state + in_flight * per_microbatch + working; }
};

/// stage_memory_bytes in its parts.
StageMemory stage_memory(const Measurement& m, const MemoryPolicy& policy);

/// Peak bytes on one device for a stage with measurement `m` (at the per-replica microbatch size).
/// m.activation_bytes is what one microbatch keeps from its forward to its backward (the saved
/// tensors of graph/saved_tensors.h; Korthikanti et al. 2022 §4). Without recompute every in-flight
/// microbatch keeps that; with recompute each in-flight microbatch keeps its boundary inputs (and
/// the saved tensors of the kept layers of a partly recomputed stage), and one microbatch at a time
/// holds its saved tensors again; with segmented recomputation each keeps its checkpoints and one
/// segment at a time its recomputed saved tensors.
double stage_memory_bytes(const Measurement& m, const MemoryPolicy& policy);

/// Of stage_memory_bytes(m, policy), the bytes alive only while the stage computes: the forward's
/// and backward's working memory (m.peak_bytes − m.activation_bytes) and what a recomputation
/// holds for the one microbatch it recomputes. A rank holding several model chunks needs the largest
/// of its chunks' working bytes, not their sum (Plan::rank_memory_bytes).
double working_memory_bytes(const Measurement& m, const MemoryPolicy& policy);

/// Bytes of model state per (fp32) parameter byte: weights + gradients + optimizer state (+ bf16
/// copies). With ZeRO-1 over policy.optimizer_shards > 1 ranks: unsharded_state_factor plus
/// sharded_state_factor / optimizer_shards.
double model_state_factor(const MemoryPolicy& policy);

/// The model state every rank of a ZeRO-1 group keeps whole, per parameter byte: the fp32
/// gradients (the flat gradient buffer, which the parameter all-gather reuses) and the weights the
/// forward reads: fp32 (1), or in mixed precision the bf16 working copy (0.5).
double unsharded_state_factor(const MemoryPolicy& policy);

/// What ZeRO-1 divides over its group of D > 1 ranks, per parameter byte before dividing: the
/// optimizer state copies, the rank's reduced gradient part (the reduce-scatter's output) and in
/// mixed precision the fp32 master weights (Rajbhandari et al. 2020 §5.1; Megatron-LM's
/// distributed optimizer). A group of one keeps the optimizer state whole and needs no reduced part.
double sharded_state_factor(const MemoryPolicy& policy);

/// Per parameter byte, the model state a stage holds without ZeRO-1 that ZeRO-1 takes off each rank
/// (before adding back sharded_state_factor / D): the optimizer state copies, and in mixed precision
/// the fp32 master weights.
double zero_removed_state_factor(const MemoryPolicy& policy);

/// A stage's memory under ZeRO-1 over a data-parallel group of `group` ranks, from its memory
/// `unsharded_bytes` without ZeRO (stage_memory_bytes with optimizer_shards = 1) and its
/// `parameter_bytes`: zero_removed_state_factor replaced by sharded_state_factor / group when group > 1.
double zero_stage_memory_bytes(double unsharded_bytes, double parameter_bytes, const MemoryPolicy& policy, double group);

}  // namespace partrain::profile
