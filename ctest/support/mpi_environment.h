#pragma once
// MPI for a whole single-rank GoogleTest program (singleton init, as a one-rank run), shared by the
// unit tests that need a real communicator.
#include <gtest/gtest.h>

#include <memory>

#include "comm/mpi_communicator.h"

namespace partrain::testing {

/// A GoogleTest environment that starts MPI before the first test and ends it after the last.
/// Register it once per test program:
///   ::testing::AddGlobalTestEnvironment(new partrain::testing::MpiEnvironment);
/// world() is valid between the two (one rank unless the program runs under mpiexec).
class MpiEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    session_ = std::make_unique<comm::MpiSession>();
    world_ = comm::MpiCommunicator::world();
  }
  void TearDown() override {
    world_.reset();
    session_.reset();
  }
  static comm::MpiCommunicator& world() { return *world_; }

 private:
  std::unique_ptr<comm::MpiSession> session_;
  static inline std::unique_ptr<comm::MpiCommunicator> world_;
};

}  // namespace partrain::testing
