#pragma once
// The MPI backend of Communicator: host tensors only (Open MPI here is not CUDA-aware; GPU tensors
// go through the NCCL backend or are staged through host memory by the caller).
//
// Notes:
//  - Every MPI call is checked; a failure is a partrain::Error naming the call, the rank and the
//    MPI error string (the communicators use MPI_ERRORS_RETURN).
//  - bf16 and f16 all-reduces convert to fp32, reduce in fp32 and round back once (round-to-nearest-even),
//    which is more accurate than a user MPI_Op accumulating in 16 bits.
//  - Message sizes are limited to INT_MAX elements (MPI's int counts); larger tensors are an error.
//  - world() duplicates MPI_COMM_WORLD, so partrain's messages never match anyone else's.
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace partrain::comm {

/// The environment variable through which MpiSession asks Open MPI's non-blocking all-reduce for its
/// ring algorithm ("1") unless the user chose one (the in-place, < 4-rank default is a binomial
/// tree, 2.4x slower for the gradient buckets).
inline constexpr const char* kNonblockingAllReduceAlgorithmVariable = "OMPI_MCA_coll_libnbc_iallreduce_algorithm";

/// RAII owner of MPI's lifetime: the constructor calls MPI_Init_thread unless MPI is already
/// initialised; the destructor calls MPI_Finalize if this session initialised MPI (and it is not
/// finalised yet). Create one at the top of main (or a test main) and destroy every communicator
/// before it.
class MpiSession {
 public:
  /// `argc`/`argv` may be null. `required_thread_level` is an MPI_THREAD_* level; a lower provided
  /// level is an error.
  explicit MpiSession(int* argc = nullptr, char*** argv = nullptr,
                      int required_thread_level = MPI_THREAD_FUNNELED);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  /// True if this session called MPI_Init_thread (and so will finalise).
  bool owns_mpi() const { return owns_; }
  /// The thread level MPI provides.
  int thread_level() const { return thread_level_; }

  /// MPI_Initialized && !MPI_Finalized.
  static bool active();
  /// MPI_Abort on MPI_COMM_WORLD: ends every rank (use after an unrecoverable error on one rank).
  [[noreturn]] static void abort(int exit_code);

 private:
  bool owns_ = false;
  int thread_level_ = MPI_THREAD_SINGLE;
};

class MpiCommunicator final : public Communicator {
 public:
  /// A communicator over every process (a duplicate of MPI_COMM_WORLD). Collective; needs an active
  /// MPI (an MpiSession).
  static std::unique_ptr<MpiCommunicator> world();
  /// This process's rank among the processes of its node (MPI_Comm_split_type SHARED on
  /// MPI_COMM_WORLD): which GPU of the node it uses. Collective over MPI_COMM_WORLD.
  static int node_local_rank();
  /// Number of ranks of MPI_COMM_WORLD on this node (they share its cores or GPUs).
  static int node_local_size();
  /// CPUs the ranks of this node may run on: the union of their affinity masks (sched_getaffinity),
  /// the cores they share. Collective over MPI_COMM_WORLD.
  static int node_cpu_count();
  /// Whether this process's MPI waits (requests, and the blocking collectives, then run
  /// non-blocking) test and sleep instead of spinning in MPI. world() turns it on when the node
  /// holds more ranks times OpenMP threads than CPUs (node_cpu_count): a waiting rank then leaves
  /// its core to the computing ones.
  static void set_sleeping_waits(bool sleep);
  static bool sleeping_waits_enabled();
  /// Takes ownership of `communicator` (freed by the destructor): sets MPI_ERRORS_RETURN on it and
  /// computes its global ranks.
  explicit MpiCommunicator(MPI_Comm communicator);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::span<const int> global_ranks() const override { return global_ranks_; }
  const char* backend_name() const override { return "mpi"; }

  Request send(const Tensor& tensor, int destination, int tag) override;
  Request receive(const Tensor& tensor, int source, int tag) override;
  Request exchange(std::span<const SendSpec> sends, std::span<const ReceiveSpec> receives) override;
  int max_tag() const override { return max_tag_; }

  void all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::Sum) override;
  Request all_reduce_async(const Tensor& tensor, ReduceOp op = ReduceOp::Sum) override;
  void reduce_scatter(const Tensor& input, const Tensor& output) override;
  Request reduce_scatter_async(const Tensor& input, const Tensor& output) override;
  void all_gather(const Tensor& input, const Tensor& output) override;
  double all_reduce_scalar(double value, ReduceOp op = ReduceOp::Sum) override;
  void broadcast(const Tensor& tensor, int root) override;
  void broadcast_bytes(std::string& bytes, int root) override;
  std::vector<std::string> gather_bytes(const std::string& bytes, int root) override;
  std::vector<std::string> all_gather_bytes(const std::string& bytes) override;
  void barrier() override;
  std::unique_ptr<Communicator> group(std::span<const int> ranks) override;

  /// The underlying MPI communicator (e.g. for parallel HDF5); owned by this object.
  MPI_Comm native() const { return communicator_; }

 private:
  MPI_Comm communicator_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 0;
  int max_tag_ = 32767;
  std::vector<int> global_ranks_;

  // Byte counts and displacements of a gather of variable-length byte strings (MPI_Gatherv).
  struct GatheredLayout {
    std::vector<int> lengths, offsets;
    std::int64_t total = 0;
  };
  /// Collective: every rank's `length` and the displacements; throws on every rank when the total
  /// exceeds MPI's int count limit.
  GatheredLayout gathered_layout(int length, const char* operation) const;
};

}  // namespace partrain::comm
