// The main of every MPI test (library partrain_mpi_test_main): MPI_Init through comm::MpiSession,
// rank 0 prints the usual report, other ranks only their failures, and every rank exits with the
// worst result across ranks — or with 77 (ctest's SKIP_RETURN_CODE) when nothing failed and no test
// ran on any rank but some skipped (e.g. the GPU tests without a GPU): a skip, never a pass.
#include <gtest/gtest.h>
#include <mpi.h>

#include <iostream>
#include <memory>

#include "support/mpi_test_main.h"

namespace partrain::testing {
namespace {

comm::MpiCommunicator* g_world = nullptr;

/// On ranks other than 0: prints only failures, prefixed with the rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::cout << "[rank " << rank_ << "] " << (result.file_name() ? result.file_name() : "?") << ":"
              << result.line_number() << ": Failure\n" << result.message() << std::endl;
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed())
      std::cout << "[rank " << rank_ << "] FAILED " << info.test_suite_name() << "." << info.name() << std::endl;
  }

 private:
  int rank_;
};

}  // namespace

comm::MpiCommunicator& mpi_world() { return *g_world; }

}  // namespace partrain::testing

int main(int argc, char** argv) {
  partrain::comm::MpiSession session(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new partrain::testing::RankFailurePrinter(rank));
  }
  int result = 0;
  {
    std::unique_ptr<partrain::comm::MpiCommunicator> world = partrain::comm::MpiCommunicator::world();
    partrain::testing::g_world = world.get();
    result = RUN_ALL_TESTS();
    partrain::testing::g_world = nullptr;
  }
  // Every rank exits with the worst result, so a failure on any rank fails the test.
  const int own = result;
  MPI_Allreduce(MPI_IN_PLACE, &result, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && result != own) std::cout << "[rank 0] tests FAILED on another rank (see [rank N] lines)" << std::endl;
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  int counts[2] = {unit.successful_test_count(), unit.skipped_test_count()};
  MPI_Allreduce(MPI_IN_PLACE, counts, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  constexpr int kSkipped = 77;
  if (result == 0 && counts[0] == 0 && counts[1] > 0) return kSkipped;
  return result;
}
