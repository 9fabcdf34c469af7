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
  /// state (and, in mixed precision, the fp32 master weights) is sharded over; 1: not sharded.
  int optimizer_shards = 1;
};

/// Peak bytes on one device for a stage with measurement `m` (at the per-replica microbatch size).
/// m.activation_bytes is what one microbatch keeps from its forward to its backward (the saved
/// tensors of graph/saved_tensors.h; Korthikanti et al. 2022 §4). Without recompute every in-flight
/// microbatch keeps that; with recompute each in-flight microbatch keeps its boundary inputs (and
/// the saved tensors of the kept layers of a partly recomputed stage), and one microbatch at a time
/// holds its saved tensors again; with segmented recomputation each keeps its checkpoints and one
/// segment at a time its recomputed saved tensors.
double stage_memory_bytes(const Measurement& m, const MemoryPolicy& policy);

/// Bytes of model state per (fp32) parameter byte: weights + gradients + optimizer state (+ bf16
/// copy), the ZeRO-1 part (sharded_state_factor) divided by policy.optimizer_shards.
double model_state_factor(const MemoryPolicy& policy);

/// The part of model_state_factor that ZeRO-1 shards over the data-parallel group, per parameter
/// byte before dividing: the optimizer state copies, plus the fp32 master weights in mixed precision
/// (in fp32 the weights are the ones the forward pass reads, so every rank keeps them whole).
double sharded_state_factor(const MemoryPolicy& policy);

}  // namespace partrain::profile
