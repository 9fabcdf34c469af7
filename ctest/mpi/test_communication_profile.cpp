// MPI tests of profile::measure_communication (run under mpiexec with 2, 3 and 4 ranks; see
// ctest/CMakeLists.txt) and of the fits it stores. Every rank makes the same collective calls.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/error.h"
#include "kernels/cpu/cpu_backend.h"
#include "profile/communication_profile.h"
#include "support/mpi_test_main.h"
#include <nlohmann/json.hpp>

namespace partrain::profile {
namespace {

comm::Communicator& world() { return testing::mpi_world(); }

TEST(CommunicationProfile, LinkFitThroughTwoTimings) {
  const LinkFit fit = LinkFit::through(1000, 11e-6, 101000, 111e-6);  // 10 us + 1 GB/s
  EXPECT_NEAR(fit.bytes_per_second, 1e9, 1e-3);
  EXPECT_NEAR(fit.latency_seconds, 10e-6, 1e-12);
  EXPECT_NEAR(fit.seconds(1e6), 10e-6 + 1e-3, 1e-12);
  const LinkFit flat = LinkFit::through(1000, 5e-6, 2000, 4e-6);  // noise: the large one was faster
  EXPECT_DOUBLE_EQ(flat.latency_seconds, 0.0);
  EXPECT_NEAR(flat.bytes_per_second, 2000 / 4e-6, 1e-3);
  EXPECT_THROW(LinkFit{}.seconds(1.0), Error);
}

TEST(CommunicationProfile, AllReduceScalesByTheRingTrafficOfTheNearestGroup) {
  CommunicationProfile profile;
  profile.allreduce[2] = {1e-6, 1e9};
  profile.allreduce[8] = {7e-6, 1e9};
  EXPECT_DOUBLE_EQ(profile.allreduce_seconds(1e9, 1), 0.0);
  EXPECT_NEAR(profile.allreduce_seconds(1e9, 2), 1e-6 + 1.0, 1e-12);
  // 16 ranks from the 8-rank fit: latency x 15/7, traffic (2 · 15/16) / (2 · 7/8).
  EXPECT_NEAR(profile.allreduce_seconds(1e9, 16), 7e-6 * 15 / 7 + (30.0 / 16) / (14.0 / 8), 1e-9);
  const CommunicationProfile copy = CommunicationProfile::from_json(profile.to_json(), "test");
  EXPECT_EQ(copy.to_json(), profile.to_json());
  EXPECT_THROW(CommunicationProfile::from_json(nlohmann::json{{"within_node", 1}}, "x.json"), Error);
  EXPECT_THROW(CommunicationProfile{}.allreduce_seconds(1.0, 4), Error);
}

TEST(CommunicationProfile, MeasuredOnTheWorldTheSameOnEveryRank) {
  const CommunicationProfile profile = measure_communication(world(), cpu_backend(), 3);
  EXPECT_EQ(profile.communicator, "mpi");
  EXPECT_TRUE(profile.within_node.measured());   // mpiexec starts every rank on this machine
  EXPECT_FALSE(profile.across_nodes.measured());
  // Group sizes 2, 4, ... and the world size itself.
  EXPECT_EQ(profile.allreduce.count(2), 1u);
  EXPECT_EQ(profile.allreduce.rbegin()->first, world().size());
  for (const auto& [ranks, fit] : profile.allreduce) {
    EXPECT_GT(fit.bytes_per_second, 0.0) << ranks;
    EXPECT_GE(fit.latency_seconds, 0.0) << ranks;
  }
  // A 4 MiB message costs more than a 4 KiB one on any real link.
  EXPECT_GT(profile.within_node.seconds(4 << 20), profile.within_node.seconds(4096));
  const std::vector<std::string> all = world().all_gather_bytes(profile.to_json().dump());
  for (const std::string& other : all) EXPECT_EQ(other, all.front());
}

}  // namespace
}  // namespace partrain::profile
