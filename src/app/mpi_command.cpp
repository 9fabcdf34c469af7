#include "app/mpi_command.h"

#include <cstdio>
#include <exception>
#include <memory>

#include "comm/mpi_communicator.h"
#include "core/collective_error.h"
#include "core/error.h"

namespace partrain::app {

int run_on_every_rank(const RankCommand& command) {
  comm::MpiSession session;
  std::unique_ptr<comm::Communicator> world = comm::MpiCommunicator::world();
  bool diverged = false;
  try {
    return command(*world, diverged);
  } catch (const CollectiveError& error) {
    // Every rank has this error (agreed collectively): one line, and every rank ends normally.
    if (world->rank() == 0) std::fprintf(stderr, "partrain: error: %s\n", error.message().c_str());
    return 1;
  } catch (const Error& error) {
    if (diverged && world->size() > 1) {
      // Past setup an error may be one rank's alone (a damaged file, a full disk) while the others
      // wait in a collective: say which rank and end them all.
      std::fprintf(stderr, "partrain: error on rank %d: %s\n", world->rank(), error.message().c_str());
      std::fflush(stderr);
      comm::MpiSession::abort(1);
    }
    // Errors every rank meets alike (config, data, plan) are printed once; errors of one rank abort all.
    if (world->rank() == 0) std::fprintf(stderr, "partrain: error: %s\n", error.message().c_str());
    return 1;
  } catch (const std::exception& error) {
    // A bug (an exception that is not a partrain::Error) on one rank: name it and end every rank
    // rather than leave the others waiting in a collective.
    std::fprintf(stderr, "partrain: internal error on rank %d: %s\n", world->rank(), error.what());
    std::fflush(stderr);
    if (world->size() > 1) comm::MpiSession::abort(1);
    return 1;
  }
}

}  // namespace partrain::app
