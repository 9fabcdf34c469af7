#include "profile/communication_profile.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/statistics.h"
#include <nlohmann/json.hpp>

namespace partrain::profile {

double LinkFit::seconds(double bytes) const {
  PARTRAIN_CHECK(measured(), "communication profile: this link was not measured");
  return latency_seconds + bytes / bytes_per_second;
}

LinkFit LinkFit::through(double small_bytes, double small_seconds, double large_bytes, double large_seconds) {
  LinkFit fit;
  if (large_seconds > small_seconds && large_bytes > small_bytes) {
    fit.bytes_per_second = (large_bytes - small_bytes) / (large_seconds - small_seconds);
    fit.latency_seconds = std::max(0.0, small_seconds - small_bytes / fit.bytes_per_second);
  } else {
    fit.bytes_per_second = large_bytes / std::max(large_seconds, 1e-9);
  }
  return fit;
}

double CommunicationProfile::allreduce_seconds(double bytes, int ranks) const {
  if (ranks <= 1) return 0.0;
  PARTRAIN_CHECK(!allreduce.empty(), "communication profile: no all-reduce was measured");
  auto nearest = allreduce.begin();
  for (auto it = allreduce.begin(); it != allreduce.end(); ++it)
    if (std::abs(std::log2(static_cast<double>(it->first) / ranks)) <
        std::abs(std::log2(static_cast<double>(nearest->first) / ranks)))
      nearest = it;
  // A ring all-reduce moves 2(n − 1)/n of the message per rank: rescale from the measured size.
  const auto traffic = [](int n) { return 2.0 * (n - 1) / n; };
  const LinkFit& fit = nearest->second;
  return fit.latency_seconds * (ranks - 1) / std::max(1, nearest->first - 1) +
         bytes / fit.bytes_per_second * traffic(ranks) / traffic(nearest->first);
}

nlohmann::json CommunicationProfile::to_json() const {
  auto link = [](const LinkFit& fit) {
    return nlohmann::json{{"latency_seconds", fit.latency_seconds}, {"bytes_per_second", fit.bytes_per_second}};
  };
  nlohmann::json groups = nlohmann::json::object();
  for (const auto& [ranks, fit] : allreduce) groups[std::to_string(ranks)] = link(fit);
  return {{"communicator", communicator},
          {"within_node", link(within_node)},
          {"across_nodes", link(across_nodes)},
          {"allreduce", groups}};
}

CommunicationProfile CommunicationProfile::from_json(const nlohmann::json& document, const std::string& source_name) {
  try {
    auto link = [&](const nlohmann::json& entry) {
      const LinkFit fit{entry.at("latency_seconds").get<double>(), entry.at("bytes_per_second").get<double>()};
      // A negative latency or bandwidth would price communication below free (bandwidth 0: not measured).
      PARTRAIN_CHECK(fit.latency_seconds >= 0 && fit.bytes_per_second >= 0,
                     source_name << ": communication profile link " << entry.dump()
                                 << ": latency_seconds and bytes_per_second must be non-negative");
      return fit;
    };
    CommunicationProfile profile;
    profile.communicator = document.value("communicator", std::string());
    profile.within_node = link(document.at("within_node"));
    profile.across_nodes = link(document.at("across_nodes"));
    for (const auto& [ranks, entry] : document.at("allreduce").items()) profile.allreduce[std::stoi(ranks)] = link(entry);
    return profile;
  } catch (const nlohmann::json::exception& error) {
    PARTRAIN_FAIL(source_name << ": malformed communication profile: " << error.what());
  } catch (const std::logic_error& error) {
    PARTRAIN_FAIL(source_name << ": malformed communication profile group size: " << error.what());
  }
}

namespace {

constexpr double kSmallBytes = 4096, kLargeBytes = 4 << 20;
constexpr int kTag = 7;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median seconds of one ping-pong leg between `first` and `second` for a message of `bytes`
// (every rank calls it; only the pair communicates, the result is broadcast from `first`).
double ping_pong_seconds(comm::Communicator& world, Backend& backend, int first, int second, double bytes, int repeats) {
  const int me = world.rank();
  double result = 0;
  if (me == first || me == second) {
    const Tensor buffer = backend.zeros({static_cast<std::int64_t>(bytes / 4)});
    const int peer = me == first ? second : first;
    std::vector<double> samples;
    for (int round = 0; round <= repeats; ++round) {
      const double start = now_seconds();
      if (me == first) {
        world.send(buffer, peer, kTag).wait();
        world.receive(buffer, peer, kTag).wait();
      } else {
        world.receive(buffer, peer, kTag).wait();
        world.send(buffer, peer, kTag).wait();
      }
      // NCCL's wait() only orders the device's stream after the transfer: the host waits here.
      backend.synchronise();
      if (round > 0) samples.push_back((now_seconds() - start) / 2);  // round 0 warms up
    }
    result = median(samples);
  }
  // `first`'s value to every rank, exactly (text kept six decimals: 1 µs, 10 % of a link's latency).
  return world.all_reduce_scalar(me == first ? result : 0.0);
}

LinkFit ping_pong_fit(comm::Communicator& world, Backend& backend, int first, int second, int repeats) {
  const double small = ping_pong_seconds(world, backend, first, second, kSmallBytes, repeats);
  const double large = ping_pong_seconds(world, backend, first, second, kLargeBytes, repeats);
  return LinkFit::through(kSmallBytes, small, kLargeBytes, large);
}

// Median seconds of an all-reduce of `bytes` per rank over `group` (its members call it).
double allreduce_seconds(comm::Communicator& group, Backend& backend, double bytes, int repeats) {
  const Tensor buffer = backend.zeros({static_cast<std::int64_t>(bytes / 4)});
  std::vector<double> samples;
  for (int round = 0; round <= repeats; ++round) {
    group.barrier();
    const double start = now_seconds();
    group.all_reduce(buffer);
    backend.synchronise();
    // The slowest member's time is the collective's.
    const double seconds = group.all_reduce_scalar(now_seconds() - start, comm::ReduceOp::Max);
    if (round > 0) samples.push_back(seconds);
  }
  return median(samples);
}

}  // namespace

CommunicationProfile measure_communication(comm::Communicator& world, Backend& backend, int repeats) {
  CommunicationProfile profile;
  profile.communicator = world.backend_name();
  if (world.size() < 2) return profile;
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::vector<std::string> hosts = world.all_gather_bytes(host);
  int same_node = -1, other_node = -1;
  for (int rank = 1; rank < world.size(); ++rank) {
    if (hosts[rank] == hosts[0] && same_node < 0) same_node = rank;
    if (hosts[rank] != hosts[0] && other_node < 0) other_node = rank;
  }
  if (same_node > 0) profile.within_node = ping_pong_fit(world, backend, 0, same_node, repeats);
  if (other_node > 0) profile.across_nodes = ping_pong_fit(world, backend, 0, other_node, repeats);
  std::vector<int> sizes;
  for (int n = 2; n <= world.size(); n *= 2) sizes.push_back(n);
  if (sizes.back() != world.size()) sizes.push_back(world.size());
  for (int n : sizes) {
    std::vector<int> members;
    for (int rank = 0; rank < n; ++rank) members.push_back(world.global_ranks()[rank]);
    const std::unique_ptr<comm::Communicator> group = world.group(members);  // collective over the world
    double small = 0, large = 0;
    if (group) {
      small = allreduce_seconds(*group, backend, kSmallBytes, repeats);
      large = allreduce_seconds(*group, backend, kLargeBytes, repeats);
    }
    // Rank 0 (a member of every group) gives its figures to every rank, exactly.
    small = world.all_reduce_scalar(world.rank() == 0 ? small : 0.0);
    large = world.all_reduce_scalar(world.rank() == 0 ? large : 0.0);
    profile.allreduce[n] = LinkFit::through(kSmallBytes, small, kLargeBytes, large);
  }
  return profile;
}

}  // namespace partrain::profile
