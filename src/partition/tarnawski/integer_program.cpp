// The entry points of the Tarnawski et al. integer programs shared by both objectives: the
// objective's name and the dispatch. The
// programs themselves are in throughput_ip.cpp (§5.1.3, §5.2) and latency_ip.cpp (§4).
#include "partition/tarnawski/integer_program.h"

#include "core/error.h"

namespace partrain::partition {

IpObjective parse_ip_objective(const std::string& text, const std::string& flag) {
  if (text == "throughput") return IpObjective::throughput;
  if (text == "latency") return IpObjective::latency;
  PARTRAIN_FAIL(flag << ": expected throughput or latency, not '" << text << "'");
}

IntegerProgramResult solve_integer_program(const Workload& workload, const IntegerProgramOptions& options) {
  return options.objective == IpObjective::latency ? solve_latency_ip(workload, options)
                                                   : solve_throughput_ip(workload, options);
}

}  // namespace partrain::partition
