#include "profile/memory_model.h"

#include <algorithm>

namespace partrain::profile {

double sharded_state_factor(const MemoryPolicy& policy) {
  return policy.optimizer_state_copies + (policy.mixed_precision ? 1.0 : 0.0);
}

double model_state_factor(const MemoryPolicy& policy) {
  // fp32 weights and gradients, fp32 optimizer state; mixed precision adds a bf16 working copy of
  // the weights and keeps bf16 gradients before they are accumulated into fp32 (half + half).
  // ZeRO-1 keeps 1 / shards of the optimizer state (and of the fp32 masters in mixed precision).
  const double sharded = sharded_state_factor(policy);
  const double whole = 2.0 + (policy.mixed_precision ? 1.0 : 0.0) + policy.optimizer_state_copies - sharded;
  return whole + sharded / std::max(1, policy.optimizer_shards);
}

double stage_memory_bytes(const Measurement& m, const MemoryPolicy& policy) {
  const double model_state = m.parameter_bytes * model_state_factor(policy);
  const int in_flight = std::max(1, policy.microbatches_in_flight);
  // Working memory beyond the stored activations of one microbatch (temporaries of forward/backward).
  const double transient = std::max(0.0, m.peak_bytes - m.activation_bytes);
  double stored;
  if (policy.segmented) {
    stored = in_flight * policy.checkpoint_bytes + policy.recomputed_peak_bytes;
  } else if (policy.recompute) {
    // Each microbatch in flight keeps what its recomputation starts from (its received inputs) and,
    // when only part of the stage is recomputed (Merak §6.2), the saved tensors of the kept part; one
    // at a time holds all its saved tensors again. (A bound: the recomputed microbatch's input counts
    // twice when its backward reads it, as a transformer layer's first LayerNorm does.)
    const double kept = std::clamp(policy.kept_activation_bytes, 0.0, m.activation_bytes);
    stored = in_flight * (m.boundary_input_bytes + kept) + (m.activation_bytes - kept);
  } else {
    stored = in_flight * m.activation_bytes;
  }
  return model_state + stored + transient + policy.communication_buffer_bytes;
}

}  // namespace partrain::profile
