#pragma once
// The world communicator of the MPI tests, set up by mpi_test_main.cpp's main.
#include "comm/mpi_communicator.h"

namespace partrain::testing {

/// MPI_COMM_WORLD as a communicator; valid while the tests run.
comm::MpiCommunicator& mpi_world();

}  // namespace partrain::testing
