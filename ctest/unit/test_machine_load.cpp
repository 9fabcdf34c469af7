// The other load a profile records (profile/machine_load.h): a child process spinning on a core
// shows as at least half a core of other load over the window in which it spins (other tests running
// beside can only add to it), the node's busy time includes this process's own (which the meter
// subtracts), and the comparison of two figures tells load from noise.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <thread>

#include "profile/machine_load.h"

namespace partrain::profile {
namespace {

void spin_for(double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  volatile unsigned long counter = 0;
  while (std::chrono::steady_clock::now() < end) counter = counter + 1;
}

TEST(MachineLoad, ASpinningChildProcessIsOtherLoad) {
  if (node_busy_cpu_seconds() < 0) GTEST_SKIP() << "/proc/stat cannot be read here (not Linux)";
  OtherLoadMeter meter;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    spin_for(0.6);
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(child, &status, 0);  // the parent sleeps in waitpid: its own CPU time stays near 0
  const std::optional<double> share = meter.share_of_other_load(1);
  ASSERT_TRUE(share.has_value());
  EXPECT_GE(*share, 0.5);
}

// The node's busy time (/proc/stat's busy columns) includes this process's compute, which the meter
// subtracts: a parser reading the idle column, or the ticks in other units, fails here.
TEST(MachineLoad, TheNodesBusyTimeIncludesThisProcess) {
  if (node_busy_cpu_seconds() < 0) GTEST_SKIP() << "/proc/stat cannot be read here (not Linux)";
  const auto start = std::chrono::steady_clock::now();
  const double node_before = node_busy_cpu_seconds(), own_before = process_cpu_seconds();
  // Until this process has computed 0.3 s (however busy the machine is), at most 10 s.
  while (process_cpu_seconds() - own_before < 0.3 && std::chrono::steady_clock::now() - start < std::chrono::seconds(10))
    spin_for(0.01);
  const double own = process_cpu_seconds() - own_before, node = node_busy_cpu_seconds() - node_before;
  const double window = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(own, 0.3);
  // Clock ticks of 10 ms on each core at either end.
  const double ticks = 0.02 * std::thread::hardware_concurrency();
  EXPECT_GE(node, own - ticks);
  EXPECT_LE(node, window * std::thread::hardware_concurrency() + ticks);
}

TEST(MachineLoad, LoadDiffersFromHalfACoreWhenBothAreKnown) {
  EXPECT_FALSE(other_load_differs(0.0, 0.3));
  EXPECT_TRUE(other_load_differs(0.0, 0.6));
  EXPECT_TRUE(other_load_differs(1.8, 0.2));
  EXPECT_FALSE(other_load_differs(-1.0, 1.8));  // not recorded: cannot tell
  EXPECT_FALSE(other_load_differs(1.8, -1.0));
}

}  // namespace
}  // namespace partrain::profile
