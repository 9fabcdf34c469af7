#include "profile/memory_model.h"

#include <algorithm>

namespace partrain::profile {

double sharded_state_factor(const MemoryPolicy& policy) {
  // The optimizer state copies, the rank's reduced gradient part (the reduce-scatter's output) and
  // in mixed precision the f32 master weights (ZeRO §5.1 counts them as optimizer state; the
  // runtime keeps the rank's shard of them, as Megatron-LM's distributed optimizer does).
  return policy.optimizer_state_copies + 1.0 + (policy.mixed_precision ? 1.0 : 0.0);
}

double unsharded_state_factor(const MemoryPolicy& policy) {
  // fp32 gradients (the flat gradient buffer, which the parameter all-gather reuses) and the weights
  // the forward reads: fp32, or in mixed precision the bf16 working copy (half). Its bf16 gradients
  // live one parameter at a time, until they are accumulated into the fp32 gradients
  // (graph/interpreter.cpp hands each over when complete): working memory the profiler measures, not
  // model state (measured on gpt-tiny's LM-head stage: 4.5 × its fp32 parameter bytes held between
  // steps with AdamW, validation/perf/README.md).
  return policy.mixed_precision ? 1.5 : 2.0;
}

double model_state_factor(const MemoryPolicy& policy) {
  // Without ZeRO-1: fp32 weights and gradients, the optimizer state and in mixed precision the bf16
  // working copy.
  if (policy.optimizer_shards <= 1) return 2.0 + (policy.mixed_precision ? 0.5 : 0.0) + policy.optimizer_state_copies;
  return unsharded_state_factor(policy) + sharded_state_factor(policy) / policy.optimizer_shards;
}

double zero_removed_state_factor(const MemoryPolicy& policy) {
  MemoryPolicy whole = policy;
  whole.optimizer_shards = 1;
  return model_state_factor(whole) - unsharded_state_factor(policy);
}

double zero_stage_memory_bytes(double unsharded_bytes, double parameter_bytes, const MemoryPolicy& policy, double group) {
  if (group <= 1) return unsharded_bytes;
  return unsharded_bytes + parameter_bytes * (sharded_state_factor(policy) / group - zero_removed_state_factor(policy));
}

StageMemory stage_memory(const Measurement& m, const MemoryPolicy& policy) {
  MemoryPolicy whole = policy;
  whole.optimizer_shards = 1;
  const double unsharded = std::clamp(policy.unsharded_parameter_bytes, 0.0, m.parameter_bytes);
  StageMemory bytes;
  bytes.model_state = (m.parameter_bytes - unsharded) * model_state_factor(policy) + unsharded * model_state_factor(whole);
  bytes.in_flight = std::max(1, policy.microbatches_in_flight);
  // Working memory beyond the stored activations of one microbatch (temporaries of forward/backward).
  bytes.working = std::max(0.0, m.peak_bytes - m.activation_bytes) + policy.communication_buffer_bytes;
  if (policy.segmented) {
    bytes.per_microbatch = policy.checkpoint_bytes;
    bytes.working += policy.recomputed_peak_bytes;
  } else if (policy.recompute) {
    // Each microbatch in flight keeps what its recomputation starts from (its received inputs) and,
    // when only part of the stage is recomputed (Merak §6.2), the saved tensors of the kept part; one
    // at a time holds all its saved tensors again. (A bound: the recomputed microbatch's input counts
    // twice when its backward reads it, as a transformer layer's first LayerNorm does.)
    const double kept = std::clamp(policy.kept_activation_bytes, 0.0, m.activation_bytes);
    bytes.per_microbatch = m.boundary_input_bytes + kept;
    bytes.working += m.activation_bytes - kept;
  } else {
    bytes.per_microbatch = m.activation_bytes;
  }
  return bytes;
}

double stage_memory_bytes(const Measurement& m, const MemoryPolicy& policy) { return stage_memory(m, policy).total(); }

double working_memory_bytes(const Measurement& m, const MemoryPolicy& policy) { return stage_memory(m, policy).working; }

}  // namespace partrain::profile
