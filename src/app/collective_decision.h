#pragma once
// Decisions one rank makes for all: rank 0 looks (at files, directories, a plan) and every rank gets
// its answer, or the same error, so no rank waits in a collective for one that stopped.
#include <functional>
#include <string>

#include "comm/communicator.h"

namespace partrain::app {

/// Runs `decide` on rank 0 only and gives its result to every rank. A partrain::Error on rank 0
/// becomes the same error (its message) on every rank, so all ranks stop cleanly instead of waiting
/// in a collective. Collective over `world`.
std::string decide_on_rank0(comm::Communicator& world, const std::function<std::string()>& decide);

}  // namespace partrain::app
