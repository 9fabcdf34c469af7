#pragma once
// How the CUDA backend orders its work (docs/gpus.md, "Ordering"): `overlap` (the default) queues
// every op without waiting, checks indices on the device and reports them once a step, and runs
// NCCL collectives on a communication stream ordered by CUDA events, so that gradient and
// tensor-parallel all-reduces overlap compute; `plain` runs everything on one stream and waits
// after every op and collective, so that a failure shows at the op that caused it. `plain` exists
// to tell an ordering bug from a kernel bug: a run that fails under overlap only points at the
// ordering.
#include <string_view>

namespace partrain {

enum class CudaOrdering { Plain, Overlap };

/// "plain" or "overlap".
const char* cuda_ordering_name(CudaOrdering ordering);

/// Parses "plain" or "overlap"; throws partrain::Error naming `source` (the setting it came from,
/// e.g. "PARTRAIN_CUDA_ORDERING" or "[train] cuda_ordering") and the value otherwise.
CudaOrdering parse_cuda_ordering(std::string_view value, std::string_view source);

/// The ordering chosen by the environment variable PARTRAIN_CUDA_ORDERING (plain|overlap; unset
/// or empty: overlap), read once per process. Throws partrain::Error for any other value.
CudaOrdering cuda_ordering_from_environment();

}  // namespace partrain
