#pragma once
// The NCCL backend of Communicator: device tensors of one GPU move through NCCL on the CUDA
// backend's stream; everything else (byte strings, scalars, barriers, host tensors) goes through a
// control communicator of the same ranks (an MpiCommunicator), to which this one delegates.
//
// Semantics that differ from the MPI backend (see comm/communicator.h for the interface):
//  - Stream order (core/cuda_ordering.h). Every NCCL call, and every conversion or copy this class
//    makes for it, is queued on CudaBackend::communication_stream(), after an event recorded on the
//    compute stream (CudaBackend::stream()), so it runs after the kernels that produced the tensors.
//    A completion event is recorded after it. Under overlap ordering (the default) the two streams
//    differ: the blocking-API operations (all_reduce, all_reduce_coalesced, reduce_scatter,
//    all_gather, broadcast) return once the compute stream waits for the completion event, so later
//    kernels see the result and the host does not wait; an asynchronous operation's Request makes
//    the compute stream wait at wait() (no host block), so the kernels queued meanwhile overlap it;
//    test() polls the event. Requests keep the tensors alive until then. Under plain ordering both
//    are the one compute stream and every collective, asynchronous ones included, completes (the
//    host waits) before returning; point-to-point requests are waited for by the host at wait().
//  - No tags. NCCL matches the messages between two ranks by their order: the n-th message that rank
//    A posts to rank B is received by the n-th receive that B posts from A, whatever the tags. Tags
//    are still checked to be in [0, max_tag()] so that code stays valid on the MPI backend. A message
//    whose size differs from the receiving tensor's is not detected (NCCL gives no such error): the
//    data is corrupt or the ranks hang, so sizes must agree.
//  - Blocking sends. An NCCL send occupies the stream until the peer's matching receive runs, so two
//    ranks that each send() to the other before their receive() deadlock (the MPI backend allows
//    that order). Post such patterns with exchange() (one ncclGroupStart/End), or order them so that
//    one side receives first. sends_wait_for_their_receive() says so, and the pipeline executor then
//    posts each run of sends with the receives after it as one exchange (RuntimeOptions::
//    group_transfers; 1F1B's steady state sends and receives across each link in both directions).
//  - Failures. A communicator whose peer failed would otherwise hang: wait() polls the CUDA event,
//    NCCL's asynchronous error state (ncclCommGetAsyncError) and a timeout (kDefaultTimeout unless
//    given; make_nccl_communicator takes PARTRAIN_NCCL_TIMEOUT_SECONDS). On an error or a timeout it
//    aborts the NCCL communicator (ncclCommAbort, so that its kernels stop) and throws a
//    partrain::Error naming the operation and the rank; every later NCCL operation of this
//    communicator, pending requests included, then throws as well.
//  - One GPU per rank. NCCL refuses two ranks on one GPU; the constructor checks this first (see
//    ranks_have_distinct_gpus) so that every rank gets the same clear error. make_device_world
//    (comm/device_communicator.h) stages device tensors through host memory instead in that case.
//  - Construction and destruction are collective over the ranks of the control communicator.
//    Destruction waits for the stream's pending work (with the same error and timeout checks), then
//    calls ncclCommDestroy; while an exception propagates it aborts instead (the peers may be gone).
//
// The CudaBackend must outlive every NcclCommunicator made on it. The class lives with the CUDA
// backend (kernels/cuda/) rather than in comm/, which is below kernels/ in the layering: it queues
// its work on CudaBackend's stream.
#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"

struct CUstream_st;
using cudaStream_t = CUstream_st*;

namespace partrain {
class Backend;
}  // namespace partrain

namespace partrain::cuda {
class CudaBackend;
}  // namespace partrain::cuda

namespace partrain::comm {

namespace detail {
/// The NCCL communicator handle and its failure state, shared with pending requests.
struct NcclState;
}  // namespace detail

class NcclCommunicator final : public Communicator {
 public:
  /// How long wait() waits for one operation before it declares the communicator hung, unless
  /// PARTRAIN_NCCL_TIMEOUT_SECONDS says otherwise (make_nccl_communicator).
  static constexpr std::chrono::milliseconds kDefaultTimeout{10 * 60 * 1000};

  /// Collective over the ranks of `control` (an MPI communicator): checks that every rank has its
  /// own GPU, makes an ncclUniqueId on rank 0, broadcasts it through `control` and calls
  /// ncclCommInitRank on `backend`'s GPU. NCCL rank i is control rank i. `timeout` bounds every
  /// wait (0 = no limit). Throws partrain::Error on every rank when any rank fails (shared GPU,
  /// NCCL initialisation).
  NcclCommunicator(std::unique_ptr<Communicator> control, cuda::CudaBackend& backend,
                   std::chrono::milliseconds timeout = kDefaultTimeout);
  ~NcclCommunicator() override;

  int rank() const override;
  int size() const override;
  std::span<const int> global_ranks() const override;
  const char* backend_name() const override { return "nccl"; }
  /// True: device work is ordered by CUDA events (see "Stream order" above).
  bool orders_device_work() const override { return true; }
  bool sends_wait_for_their_receive() const override { return true; }

  /// Device tensors: ncclSend / ncclRecv on the stream (see the notes above on order and blocking).
  /// Host tensors: the control communicator's send / receive.
  Request send(const Tensor& tensor, int destination, int tag) override;
  Request receive(const Tensor& tensor, int source, int tag) override;
  /// Device specs: every receive and send between one ncclGroupStart/ncclGroupEnd, one event.
  /// Host specs go to the control communicator (started first); a mix returns one request for both.
  Request exchange(std::span<const SendSpec> sends, std::span<const ReceiveSpec> receives) override;
  /// The control communicator's maximum tag.
  int max_tag() const override;

  /// Device tensors: ncclAllReduce in place, queued on the stream. A bf16 sum is reduced in an f32
  /// copy and rounded back once (NCCL would accumulate in bf16); bf16 max/min are exact in bf16.
  void all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::Sum) override;
  Request all_reduce_async(const Tensor& tensor, ReduceOp op = ReduceOp::Sum) override;
  /// Device tensors (one dtype) are packed into one device buffer (cudaMemcpyAsync, or a conversion
  /// to f32 for a bf16 sum), reduced with one ncclAllReduce and unpacked; host tensors in the list
  /// are reduced by the control communicator afterwards (every rank must pass the same placement).
  void all_reduce_coalesced(std::span<const Tensor> tensors, ReduceOp op = ReduceOp::Sum) override;
  void reduce_scatter(const Tensor& input, const Tensor& output) override;
  Request reduce_scatter_async(const Tensor& input, const Tensor& output) override;
  void all_gather(const Tensor& input, const Tensor& output) override;
  double all_reduce_scalar(double value, ReduceOp op = ReduceOp::Sum) override;
  /// Device tensors: ncclBroadcast in place, queued on the stream. Host tensors: control.
  void broadcast(const Tensor& tensor, int root) override;
  void broadcast_bytes(std::string& bytes, int root) override;
  std::vector<std::string> gather_bytes(const std::string& bytes, int root) override;
  std::vector<std::string> all_gather_bytes(const std::string& bytes) override;
  /// A host barrier (the control communicator's); it does not wait for queued device work.
  void barrier() override;
  /// control.group(ranks) (collective over this communicator), then a new NcclCommunicator over the
  /// members (its own ncclUniqueId), with the same backend and timeout. Non-members get nullptr.
  std::unique_ptr<Communicator> group(std::span<const int> ranks) override;

  /// The communicator that carries everything but device tensors.
  Communicator& control() const { return *control_; }
  cuda::CudaBackend& backend() const { return backend_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  enum class Place { Host, Device };
  /// Checks that `tensor` is defined and on the host or this communicator's GPU.
  Place place_of(const Tensor& tensor, const char* operation) const;
  void check_peer(int peer, int tag, const char* operation, const char* role) const;
  /// Queues the all-reduce of one device tensor; returns the tensors the queued work still uses.
  std::vector<Tensor> enqueue_all_reduce(const Tensor& tensor, ReduceOp op, const char* operation);
  /// Orders the communication stream after the work queued on the compute stream; returns it.
  cudaStream_t enter_communication_stream() const;
  enum class Completion { Now, NowIfPlain, Later };
  /// The request of the operation just queued on the communication stream, keeping `tensors` alive:
  /// waited for before returning for Completion::Now (and NowIfPlain under plain ordering).
  Request finish_operation(std::string what, std::vector<Tensor> tensors, Completion completion);
  void all_reduce_device_coalesced(const std::vector<Tensor>& tensors, ReduceOp op);

  std::unique_ptr<Communicator> control_;
  cuda::CudaBackend& backend_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<detail::NcclState> state_;
};

/// A NcclCommunicator over the ranks of `control` on `backend`, which must be a CudaBackend
/// (partrain::Error otherwise), with the timeout of PARTRAIN_NCCL_TIMEOUT_SECONDS (default
/// kDefaultTimeout; comm/device_communicator.h). Collective, like the constructor.
std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> control, Backend& backend);

/// True when no two ranks of `control` use the same physical GPU (compared by host name and the
/// GPU's UUID, so CUDA_VISIBLE_DEVICES remappings are seen through). Collective over `control`
/// (all_gather_bytes); every rank gets the same answer. NCCL needs distinct GPUs; when this is false
/// device tensors must be staged through host memory instead.
bool ranks_have_distinct_gpus(Communicator& control, const cuda::CudaBackend& backend);

/// The same check with its finding: "" when every rank has its own GPU, else a sentence naming two
/// ranks that share one ("ranks 0 and 1 share the GPU host GPU-<uuid>"). Collective over `control`;
/// throws partrain::Error on every rank when some rank cannot query its GPU.
std::string shared_gpu_description(Communicator& control, const cuda::CudaBackend& backend);

}  // namespace partrain::comm
