#pragma once
// Measured communication costs (docs/planning.md §Cost models): before
// planning, the ranks time point-to-point transfers (two ranks of one node, and of two nodes when
// the run spans several) and all-reduces over groups of 2, 4, 8, ... ranks on the real
// Communicator (MPI on CPUs, NCCL on GPUs), each fit as latency + bytes / bandwidth from two
// message sizes. Cached in the ProfileDB; the profiled cost model uses it instead of the config's
// link_bandwidth / network_bandwidth, which stay the fallback for hardware that is not present.
#include <map>
#include <string>

#include <nlohmann/json_fwd.hpp>  // declarations only: the full header costs ~3 s per translation unit

#include "comm/communicator.h"
#include "core/backend.h"

namespace partrain::profile {

/// seconds(bytes) = latency_seconds + bytes / bytes_per_second.
struct LinkFit {
  double latency_seconds = 0;
  double bytes_per_second = 0;  // 0: not measured

  bool measured() const { return bytes_per_second > 0; }
  /// Seconds to move `bytes`; throws partrain::Error when not measured.
  double seconds(double bytes) const;
  /// The fit through two timings (small, large: bytes and seconds). Bandwidth from the slope, the
  /// latency from the intercept (never below 0); an equal or falling timing gives the large size's
  /// throughput and no latency.
  static LinkFit through(double small_bytes, double small_seconds, double large_bytes, double large_seconds);
};

struct CommunicationProfile {
  LinkFit within_node;              // point-to-point between two ranks of one node
  LinkFit across_nodes;             // point-to-point between two nodes (unmeasured on one node)
  std::map<int, LinkFit> allreduce; // whole all-reduce of `bytes` per rank, by group size (ranks)
  std::string communicator;         // "mpi" or "nccl"

  bool empty() const { return !within_node.measured() && !across_nodes.measured() && allreduce.empty(); }
  /// All-reduce seconds of `bytes` per rank over `ranks` ranks: the fit of the nearest measured group
  /// size, scaled by the ring algorithm's 2(n − 1)/n traffic per rank; 0 for one rank. Throws
  /// partrain::Error when no group size was measured.
  double allreduce_seconds(double bytes, int ranks) const;

  nlohmann::json to_json() const;
  /// Parses to_json()'s form; throws partrain::Error naming `source_name`.
  static CommunicationProfile from_json(const nlohmann::json& document, const std::string& source_name);
};

/// Measures `world` (collective: every rank calls it with the same arguments). Point-to-point by
/// ping-pong between rank 0 and the next rank of its node (and the first rank of another node);
/// all-reduce over ranks [0, n) for n = 2, 4, ... up to the world size (and the world size itself).
/// `repeats` timed rounds per size after one warm-up. The result is complete on every rank; a world
/// of one rank gives an empty profile.
CommunicationProfile measure_communication(comm::Communicator& world, Backend& backend, int repeats = 5);

}  // namespace partrain::profile
