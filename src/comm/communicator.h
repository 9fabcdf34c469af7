#pragma once
// Communicator: a process group and the messages the runtime needs between its ranks — tagged
// point-to-point transfers of tensors (activations, gradients, redistributed sample ranges), grouped
// point-to-point exchanges, in-place collectives (gradient all-reduce, parameter broadcast), and byte
// strings for control data (plan JSON, config text, profiling results).
//
// Backends: MpiCommunicator (comm/mpi_communicator.h; host tensors) and, later, an NCCL backend (GPU
// tensors). The interface is written so that NCCL fits:
//  - Non-blocking operations return a Request; for NCCL it would wrap a CUDA event recorded on the
//    communicator's stream, and wait() would synchronise with it.
//  - exchange() is ncclGroupStart/ncclGroupEnd: all sends and receives are started together, so
//    their order inside one call cannot deadlock.
//  - NCCL has no tags: it matches the messages between two ranks by their order. Code that must run
//    on both backends posts the messages between a pair of ranks in the same order on both sides;
//    the MPI backend additionally matches by tag.
//  - Collective calls (all_reduce*, broadcast*, gather_bytes, barrier, group) must be made by every
//    rank of the communicator in the same order, non-blocking ones included.
//
// Tensors are handles (core/tensor.h): an operation writes into the storage of the Tensor it is
// given, so a receive may target a view such as `tensor.slice_rows(a, b)`. A pending Request keeps
// the storage of its tensors alive until it completes.
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace partrain::comm {

enum class ReduceOp { Sum, Max, Min };

/// "sum", "max", "min".
const char* reduce_op_name(ReduceOp op);

/// A handle of a non-blocking operation. A default-constructed Request is already complete.
/// Movable, not copyable. Destroying (or move-assigning over) an unfinished request waits for it;
/// if that wait fails the error is printed to stderr (a destructor cannot throw). While an exception
/// is propagating the destructor does not wait (the peer may be gone): the operation is abandoned and
/// its buffers are leaked so that no transfer can write into freed memory — the process is expected
/// to abort. Call wait() explicitly to see errors as partrain::Error.
class Request {
 public:
  /// What a backend implements. wait()/test() are called at most until one of them reports
  /// completion; afterwards the Request drops the Impl.
  class Impl {
   public:
    virtual ~Impl() = default;
    /// Blocks until the operation completes; throws partrain::Error on failure.
    virtual void wait() = 0;
    /// True if the operation has completed (then it is finished as by wait()); throws on failure.
    virtual bool test() = 0;
  };

  Request() = default;
  explicit Request(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
  Request(Request&& other) noexcept = default;
  Request& operator=(Request&& other) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request();

  /// Blocks until the operation completes (received data is then in place). No-op when done.
  void wait();
  /// Polls: true if complete. Never blocks.
  bool test();
  /// True once wait() or test() has seen the operation complete (or for a default Request).
  bool done() const { return impl_ == nullptr; }

 private:
  void finish_quietly() noexcept;
  std::unique_ptr<Impl> impl_;
};

/// Waits for every request in order; the first failure is rethrown after all others were waited on.
void wait_all(std::span<Request> requests);

/// One send of a grouped exchange: the whole of `tensor` goes to rank `peer` with `tag`.
struct SendSpec {
  Tensor tensor;
  int peer = 0;
  int tag = 0;
};

/// One receive of a grouped exchange: `tensor` (preallocated, shape and dtype of the message) is
/// filled from rank `peer` with `tag`.
struct ReceiveSpec {
  Tensor tensor;
  int peer = 0;
  int tag = 0;
};

/// A process group: an ordered list of global (MPI_COMM_WORLD) ranks; rank() is the position of this
/// process in that list.
class Communicator {
 public:
  virtual ~Communicator();

  /// This process's rank in the group, in [0, size()).
  virtual int rank() const = 0;
  /// Number of ranks in the group.
  virtual int size() const = 0;
  /// The global rank of each group rank (global_ranks()[rank()] is this process's global rank).
  virtual std::span<const int> global_ranks() const = 0;
  /// "mpi" or "nccl".
  virtual const char* backend_name() const = 0;
  /// True when operations on device tensors are ordered after the device work queued before the
  /// call, and later device work sees their result, without the host waiting (NCCL on the CUDA
  /// backend's streams). Default false: the caller waits for the device first.
  virtual bool orders_device_work() const { return false; }
  /// True when a send holds up the operations posted after it until the peer's matching receive
  /// runs (NCCL: a send occupies the stream), so that two ranks each sending to the other before
  /// receiving deadlock unless the sends and receives are posted together with exchange(). Default
  /// false: sends are buffered or progress on their own (MPI).
  virtual bool sends_wait_for_their_receive() const { return false; }

  // ---- point-to-point (ranks are ranks of this group; tags in [0, max_tag()]) ----
  /// Starts sending the contiguous data of `tensor` to `destination`. Throws partrain::Error for a
  /// bad rank or tag, an undefined tensor, or a tensor the backend cannot access.
  virtual Request send(const Tensor& tensor, int destination, int tag) = 0;
  /// Starts receiving into `tensor`, preallocated with the shape and dtype of the message. A message
  /// of another byte size is an error, reported by wait().
  virtual Request receive(const Tensor& tensor, int source, int tag) = 0;
  /// Grouped point-to-point: starts every receive and every send together and returns one request
  /// for all of them (ncclGroupStart/End semantics); any order of specs cannot deadlock.
  virtual Request exchange(std::span<const SendSpec> sends, std::span<const ReceiveSpec> receives) = 0;
  /// Largest valid tag (at least 32767).
  virtual int max_tag() const = 0;

  // ---- collectives, in place, called by every rank in the same order ----
  /// Reduces `tensor` element-wise over all ranks; every rank gets the result. bf16 is reduced in
  /// fp32 and rounded once.
  virtual void all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::Sum) = 0;
  /// Non-blocking all_reduce; the result is in `tensor` after wait().
  virtual Request all_reduce_async(const Tensor& tensor, ReduceOp op = ReduceOp::Sum) = 0;
  /// all_reduce of several tensors of one dtype as one message (a gradient bucket). The default
  /// packs host tensors into one buffer, reduces it and unpacks it.
  virtual void all_reduce_coalesced(std::span<const Tensor> tensors, ReduceOp op = ReduceOp::Sum);
  /// Reduce-scatter (ZeRO's gradient step, Rajbhandari et al. 2020): `input` (f32, size() × n
  /// elements) is summed element-wise over all ranks and rank r receives elements [r·n, (r+1)·n) in
  /// `output` (f32, n elements). Throws partrain::Error on another dtype or size.
  virtual void reduce_scatter(const Tensor& input, const Tensor& output) = 0;
  /// Non-blocking reduce_scatter (a ZeRO gradient bucket): the same operands and checks; `output`
  /// holds the result after wait(), and `input` must stay unchanged until then.
  virtual Request reduce_scatter_async(const Tensor& input, const Tensor& output) = 0;
  /// All-gather: rank r's `input` (n elements) lands at [r·n, (r+1)·n) of `output` (the same dtype,
  /// size() × n elements) on every rank. `input` may be that slot of `output` itself (in place, as
  /// NCCL defines it: ZeRO-1 gathers the parameters into the spent gradient buffer, in bf16 under
  /// mixed precision). Throws partrain::Error on mismatched dtypes or sizes.
  virtual void all_gather(const Tensor& input, const Tensor& output) = 0;
  /// All-reduce of one host scalar (loss, gradient norm², token counts), in double precision.
  virtual double all_reduce_scalar(double value, ReduceOp op = ReduceOp::Sum) = 0;
  /// Copies `tensor` of rank `root` into `tensor` on every rank (same shape and dtype everywhere).
  virtual void broadcast(const Tensor& tensor, int root) = 0;
  /// Copies `bytes` of rank `root` into `bytes` on every rank (resized as needed).
  virtual void broadcast_bytes(std::string& bytes, int root) = 0;
  /// On `root`: every rank's `bytes`, indexed by rank. On other ranks: an empty vector.
  virtual std::vector<std::string> gather_bytes(const std::string& bytes, int root) = 0;
  /// Every rank's `bytes`, indexed by rank, on every rank.
  virtual std::vector<std::string> all_gather_bytes(const std::string& bytes) = 0;
  /// Returns when every rank has entered it.
  virtual void barrier() = 0;

  /// A sub-communicator over `ranks`, given as global ranks (global_ranks() values) of members of
  /// this communicator, in the order that defines the new group's ranks. Collective over this
  /// communicator, like MPI_Comm_split: every rank calls it, either with the same list (ranks not in
  /// it get nullptr) or each with the list of its own group (e.g. the replicas of its stage; lists of
  /// different groups must be disjoint and every member of a group passes the same list). Throws
  /// partrain::Error for an empty list, a duplicate, a rank not in this communicator, or lists that
  /// the members do not agree on.
  virtual std::unique_ptr<Communicator> group(std::span<const int> ranks) = 0;

 protected:
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
};

/// Checks the operands of all_gather on a communicator of `ranks` ranks: defined, of one dtype,
/// `whole` holding ranks × part.numel() elements. Throws partrain::Error naming `operation`.
void check_gather(const Tensor& whole, const Tensor& part, int ranks, const char* operation);
/// The same for reduce_scatter, which sums: f32 only.
void check_scatter_gather(const Tensor& whole, const Tensor& part, int ranks, const char* operation);

/// Whether `part` is rank `rank`'s slot of `whole` (an in-place all_gather).
bool is_own_slot(const Tensor& part, const Tensor& whole, int rank);

/// The position of `global_rank` in `communicator.global_ranks()`, or -1 if it is not a member.
int group_rank_of(const Communicator& communicator, int global_rank);

}  // namespace partrain::comm
