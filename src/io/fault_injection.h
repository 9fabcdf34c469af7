#pragma once
// The test hook PARTRAIN_FAULT_INJECT=<fault>:RANK[:STEP] (docs/checkpoints.md): a test makes one rank
// meet a fault that a real run meets rarely, to check that every rank handles it alike. The faults:
// checkpoint_write and checkpoint_write_abandon (io/checkpoint.h), gradient_overflow (an inf put
// into RANK's gradients at optimizer step STEP, runtime/executor.h: the fp16 loss scaler must skip
// that step on every rank).
#include <cstdint>
#include <string>

namespace partrain::io {

inline constexpr const char* kFaultInjectVariable = "PARTRAIN_FAULT_INJECT";

/// The rank on which PARTRAIN_FAULT_INJECT injects `fault` at `step` (every step when STEP is left
/// out); -1 when the variable is unset or names another fault or step. Throws partrain::Error for a
/// value that is not <fault>:RANK[:STEP].
int injected_fault_rank(const std::string& fault, std::int64_t step);

}  // namespace partrain::io
