#pragma once
// Running a subcommand on every rank of MPI_COMM_WORLD with partrain's error convention: one
// "partrain: error: ..." line, exit code 1, no rank left waiting. Shared by `train` and `eval`.
#include <functional>

#include "comm/communicator.h"

namespace partrain::app {

/// What a command runs on each rank: returns the exit code. It sets `diverged` once ranks may fail
/// alone (past setup: one rank's damaged file or full disk while the others wait in a collective).
using RankCommand = std::function<int(comm::Communicator& world, bool& diverged)>;

/// Initialises MPI, runs `command` on this rank, finalises. A partrain::CollectiveError (every rank
/// has it), or a partrain::Error before `diverged` (config, data, plan: every rank meets it alike),
/// is printed once by rank 0 as "partrain: error: MESSAGE" and returns 1. A partrain::Error after
/// `diverged` on a multi-rank run is printed by its rank ("partrain: error on rank R: ...") and
/// aborts every rank (MPI_Abort, exit code 1).
int run_on_every_rank(const RankCommand& command);

}  // namespace partrain::app
