#pragma once
// What the executor needs besides the Plan. The Plan fixes everything the run was planned for
// (stages, replicas, schedule, microbatches, recomputation, precision, optimizer kind); these
// settings only tune the run and change no memory or time prediction.
#include <cstdint>

#include "runtime/loss_scaler.h"
#include "runtime/lr_schedule.h"
#include "runtime/optimizer.h"

namespace partrain::runtime {

struct RuntimeOptions {
  std::uint64_t seed = 1234;     // dropout masks, keyed by (seed, step, microbatch, sample)
  OptimizerSettings optimizer;   // hyper-parameters of the plan's optimizer
  LearningRateSchedule lr_schedule{1e-3, 0.0, 0, 1, LearningRateSchedule::Decay::Constant};
  double grad_clip = 1.0;        // global-norm clipping threshold; 0: off
  LossScalerSettings loss_scaling;  // fp16 plans only: dynamic loss scaling
  // Size limit of a gradient bucket of the data-parallel all-reduce ([parallel] bucket_mb, in MiB
  // as PyTorch DDP's bucket_cap_mb): each bucket's all-reduce starts during the last backward.
  double bucket_bytes = 25.0 * (1 << 20);
  // Post each run of sends with the receives that follow it as one grouped exchange (Megatron-LM's
  // batched send/receive of neighbouring stages). On whenever the communicator's sends wait for
  // their receive (NCCL), where sending before receiving on both sides of a link would deadlock;
  // true forces it on any communicator (tests).
  bool group_transfers = false;
};

}  // namespace partrain::runtime
