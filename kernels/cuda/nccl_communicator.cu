#include "kernels/cuda/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <sstream>
#include <thread>
#include <utility>

#include "comm/device_communicator.h"
#include "core/error.h"
#include "kernels/cuda/cuda_backend.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/optimizer.cuh"

namespace partrain::comm {

namespace detail {

struct NcclState {
  ncclComm_t comm = nullptr;  // null once destroyed or aborted
  bool aborted = false;
  std::string abort_reason;
  int rank = 0, size = 0, world_rank = -1, device = 0;
  std::chrono::milliseconds timeout{0};

  std::string where() const {
    std::ostringstream text;
    text << "rank " << rank << " of " << size << " of the NCCL communicator (world rank " << world_rank
         << ", cuda:" << device << ")";
    return text.str();
  }

  /// Aborts the NCCL communicator (its queued kernels stop, so the stream drains) and records why;
  /// every later operation and every pending request of this communicator then fails.
  void abort(const std::string& reason) noexcept {
    if (aborted) return;
    aborted = true;
    abort_reason = reason;
    if (comm) {
      (void)ncclCommAbort(comm);
      comm = nullptr;
    }
  }

  /// Throws if the communicator was aborted or destroyed, or if NCCL reports an asynchronous error
  /// (a failed peer or network): then it aborts the communicator first.
  void check_health(const std::string& what) {
    PARTRAIN_DEVICE_CHECK(!aborted, what << " on " << where() << ": the communicator was aborted after an earlier failure ("
                                  << abort_reason << ")");
    PARTRAIN_CHECK(comm != nullptr, what << " on " << where() << ": the NCCL communicator was destroyed");
    ncclResult_t async = ncclSuccess;
    const ncclResult_t query = ncclCommGetAsyncError(comm, &async);
    if (query != ncclSuccess) async = query;
    if (async == ncclSuccess || async == ncclInProgress) return;
    std::ostringstream reason;
    reason << "NCCL reported an asynchronous error: " << ncclGetErrorString(async);
    const char* last = ncclGetLastError(comm);
    if (last && *last) reason << " (" << last << ")";
    const std::string text = reason.str();
    abort(text);
    PARTRAIN_DEVICE_CHECK(false, what << " failed on " << where() << ": " << text
                       << "; the communicator was aborted (a peer may have failed)");
  }
};

}  // namespace detail

namespace {

using detail::NcclState;

/// Aborts the communicator after a failed NCCL call and throws a cuda::CudaError naming the call and rank.
[[noreturn]] void fail_nccl_call(const char* file, int line, NcclState& state, const char* call,
                                 ncclResult_t result) {
  std::string name(call);
  name = name.substr(0, name.find('('));
  std::ostringstream message;
  message << name << " failed on " << state.where() << ": " << ncclGetErrorString(result);
  const char* last = state.comm ? ncclGetLastError(state.comm) : nullptr;
  if (last && *last) message << " (" << last << ")";
  state.abort(message.str());
  message << "; the communicator was aborted [" << file << ":" << line << "]";
  throw cuda::CudaError(file, line, message.str());
}

// An NCCL operation of this communicator: on failure the communicator is aborted (the ranks are out
// of step from then on) and the error names the call and the rank.
#define PARTRAIN_NCCL_OPERATION(state, call)                                                    \
  do {                                                                                          \
    const ncclResult_t partrain_nccl_result_ = (call);                                          \
    if (partrain_nccl_result_ != ncclSuccess)                                                   \
      fail_nccl_call(__FILE__, __LINE__, (state), #call, partrain_nccl_result_);                \
  } while (0)

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
  }
  PARTRAIN_FAIL("no NCCL datatype for dtype " << static_cast<int>(dtype));
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  PARTRAIN_FAIL("unknown ReduceOp " << static_cast<int>(op));
}

std::string describe(const Tensor& tensor) {
  return std::string(dtype_name(tensor.dtype())) + " " + shape_string(tensor.shape());
}

/// Makes `device` current for the scope (CUDA events are created on the current device and must be
/// recorded on a stream of the same device); restores the previous device afterwards.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : device_(device) {
    PARTRAIN_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device_) PARTRAIN_CUDA_CHECK(cudaSetDevice(device_));
  }
  ~DeviceGuard() {
    if (previous_ != device_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int device_;
  int previous_ = -1;
};

/// A CUDA event (no timing) recorded on `stream` when constructed.
class RecordedEvent {
 public:
  explicit RecordedEvent(cudaStream_t stream) {
    PARTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    const cudaError_t status = cudaEventRecord(event_, stream);
    if (status != cudaSuccess) {
      (void)cudaEventDestroy(event_);
      event_ = nullptr;
      PARTRAIN_CUDA_CHECK(status);
    }
  }
  ~RecordedEvent() {
    if (event_) (void)cudaEventDestroy(event_);  // safe while pending: released on completion
  }
  RecordedEvent(const RecordedEvent&) = delete;
  RecordedEvent& operator=(const RecordedEvent&) = delete;

  cudaEvent_t get() const { return event_; }

  /// cudaSuccess when the work before the event is done, cudaErrorNotReady while it is pending,
  /// another code on a failure of that work.
  cudaError_t query() const {
    const cudaError_t status = cudaEventQuery(event_);
    // "Not ready" is not an error but is left as the thread's last error; clear it so that the next
    // PARTRAIN_CUDA_CHECK_LAUNCH (cudaGetLastError) does not report it (PyTorch does the same).
    if (status == cudaErrorNotReady) (void)cudaGetLastError();
    return status;
  }

 private:
  cudaEvent_t event_ = nullptr;
};

/// Blocks until `event` completes, polling NCCL's asynchronous error state and the timeout so that a
/// failed or vanished peer is an error instead of a hang (the watchdog of PyTorch's ProcessGroupNCCL,
/// done in the waiting thread). On an error or timeout the communicator is aborted.
void watch(NcclState& state, const RecordedEvent& event, const std::string& what) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  for (std::uint64_t poll = 0;; ++poll) {
    const cudaError_t status = event.query();
    if (status == cudaSuccess) return;
    PARTRAIN_DEVICE_CHECK(status == cudaErrorNotReady, what << " failed on " << state.where() << ": "
                                                     << cudaGetErrorName(status) << " ("
                                                     << cudaGetErrorString(status) << ")");
    state.check_health(what);
    if (state.timeout.count() > 0 && Clock::now() - start > state.timeout) {
      std::ostringstream reason;
      reason << what << " did not complete within " << state.timeout.count() << " ms";
      state.abort(reason.str());
      PARTRAIN_DEVICE_CHECK(false, reason.str() << " on " << state.where()
                                 << " (a peer may have failed, or the ranks posted different operations); the "
                                    "communicator was aborted");
    }
    // Most waits are short: spin (yielding) first, then sleep so that a long wait leaves the core free.
    if (poll < 2000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

/// The request of NCCL work queued on the communication stream: an event recorded after it. Keeps
/// the tensors the work reads or writes alive until it has completed, or until the compute stream
/// is ordered after it (then a block the caching allocator hands out again is reused after it).
class NcclRequest final : public Request::Impl {
 public:
  /// `compute`: the stream whose later work must see the result; equal to `communication` under
  /// plain ordering.
  NcclRequest(std::shared_ptr<NcclState> state, cudaStream_t communication, cudaStream_t compute, std::string what,
              std::vector<Tensor> tensors)
      : state_(std::move(state)), what_(std::move(what)), tensors_(std::move(tensors)), event_(communication),
        compute_(compute), overlapped_(compute != communication) {}

  /// Overlap ordering: the compute stream waits for the event on the device, the host does not.
  /// Plain ordering: the host waits, watching NCCL's error state and the timeout.
  void wait() override {
    if (overlapped_) {
      state_->check_health(what_);
      PARTRAIN_CUDA_CHECK(cudaStreamWaitEvent(compute_, event_.get(), 0));
    } else {
      watch(*state_, event_, what_);
    }
    finish();
  }

  bool test() override {
    const cudaError_t status = event_.query();
    if (status == cudaErrorNotReady) {
      state_->check_health(what_);
      return false;
    }
    PARTRAIN_DEVICE_CHECK(status == cudaSuccess, what_ << " failed on " << state_->where() << ": " << cudaGetErrorName(status)
                                                << " (" << cudaGetErrorString(status) << ")");
    finish();
    return true;
  }

 private:
  void finish() {
    // An abort stops NCCL's kernels, so the event completes without the data having arrived.
    PARTRAIN_DEVICE_CHECK(!state_->aborted, what_ << " on " << state_->where() << ": the communicator was aborted ("
                                           << state_->abort_reason << "); the result is undefined");
    tensors_.clear();
  }

  std::shared_ptr<NcclState> state_;
  std::string what_;
  std::vector<Tensor> tensors_;
  RecordedEvent event_;
  cudaStream_t compute_;
  bool overlapped_;
};

/// Makes `waiting` wait, on the device, for the work queued on `producer` so far (nothing when they
/// are the same stream).
void order_after(cudaStream_t waiting, cudaStream_t producer) {
  if (waiting == producer) return;
  const RecordedEvent produced(producer);
  PARTRAIN_CUDA_CHECK(cudaStreamWaitEvent(waiting, produced.get(), 0));
}

/// Several requests finished together (the host part of an exchange through the control
/// communicator and its device part through NCCL).
class CombinedRequest final : public Request::Impl {
 public:
  explicit CombinedRequest(std::vector<Request> parts) : parts_(std::move(parts)) {}
  void wait() override { wait_all(parts_); }
  bool test() override {
    bool complete = true;
    for (Request& part : parts_) complete = part.test() && complete;  // test every part
    return complete;
  }

 private:
  std::vector<Request> parts_;
};

std::string describe_exchange(const std::vector<SendSpec>& sends, const std::vector<ReceiveSpec>& receives) {
  std::ostringstream text;
  if (sends.size() == 1 && receives.empty()) {
    text << "send of " << describe(sends[0].tensor) << " to rank " << sends[0].peer << " (tag " << sends[0].tag << ")";
  } else if (receives.size() == 1 && sends.empty()) {
    text << "receive into " << describe(receives[0].tensor) << " from rank " << receives[0].peer << " (tag "
         << receives[0].tag << ")";
  } else {
    text << "exchange of " << sends.size() << " send(s) to ranks [";
    for (std::size_t i = 0; i < sends.size(); ++i) text << (i ? ", " : "") << sends[i].peer;
    text << "] and " << receives.size() << " receive(s) from ranks [";
    for (std::size_t i = 0; i < receives.size(); ++i) text << (i ? ", " : "") << receives[i].peer;
    text << "]";
  }
  return text.str();
}

/// "host GPU-uuid" of this rank's GPU, or "!message" when it cannot be determined (so that the
/// collective around it still completes and every rank can report the failure).
std::string gpu_identity(const cuda::CudaBackend& backend) {
  const int device = backend.device().index;
  cudaDeviceProp properties{};
  const cudaError_t status = cudaGetDeviceProperties(&properties, device);
  if (status != cudaSuccess)
    return std::string("!cudaGetDeviceProperties(cuda:") + std::to_string(device) + ") failed: " +
           cudaGetErrorName(status);
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "unknown-host");
  std::ostringstream identity;
  identity << host << " GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) identity << '-';
    char hex[3];
    std::snprintf(hex, sizeof hex, "%02x", static_cast<unsigned>(static_cast<unsigned char>(properties.uuid.bytes[i])));
    identity << hex;
  }
  return identity.str();
}

}  // namespace

// ---------------- NcclCommunicator ----------------

NcclCommunicator::NcclCommunicator(std::unique_ptr<Communicator> control, cuda::CudaBackend& backend,
                                   std::chrono::milliseconds timeout)
    : control_(std::move(control)), backend_(backend), timeout_(timeout), state_(std::make_shared<NcclState>()) {
  PARTRAIN_CHECK(control_ != nullptr, "NcclCommunicator: no control communicator");
  PARTRAIN_CHECK(timeout.count() >= 0, "NcclCommunicator: negative timeout " << timeout.count() << " ms");
  NcclState& state = *state_;
  state.rank = control_->rank();
  state.size = control_->size();
  state.world_rank = control_->global_ranks()[static_cast<std::size_t>(state.rank)];
  state.device = backend.device().index;
  state.timeout = timeout;

  // 1. One GPU per rank: NCCL rejects a shared GPU, on some versions only at the first operation.
  //    The check is collective, so every rank gets this error together.
  const std::string shared = shared_gpu_description(*control_, backend_);
  PARTRAIN_CHECK(shared.empty(), "NcclCommunicator: " << shared
                                     << "; NCCL needs one GPU per rank (stage device tensors through host memory "
                                        "instead)");

  // 2. The unique id, made on rank 0 and broadcast with a status byte, so that a failure there is an
  //    error on every rank instead of a hang in ncclCommInitRank.
  std::string message;
  if (state.rank == 0) {
    ncclUniqueId id;
    const ncclResult_t result = ncclGetUniqueId(&id);
    if (result == ncclSuccess) {
      message = '\1' + std::string(id.internal, NCCL_UNIQUE_ID_BYTES);
    } else {
      message = std::string(1, '\0') + ncclGetErrorString(result);
    }
  }
  control_->broadcast_bytes(message, 0);
  PARTRAIN_CHECK(message.size() == 1 + NCCL_UNIQUE_ID_BYTES && message[0] == '\1',
                 "NcclCommunicator: ncclGetUniqueId failed on rank 0: " << (message.empty() ? "" : message.substr(1)));
  ncclUniqueId id;
  std::memcpy(id.internal, message.data() + 1, NCCL_UNIQUE_ID_BYTES);

  // 3. Initialise on this rank's GPU, then agree: a rank whose initialisation failed makes every rank
  //    throw, and the others free the communicators they made.
  ncclComm_t comm = nullptr;
  std::string failure;
  try {
    DeviceGuard guard(state.device);
    const ncclResult_t result = ncclCommInitRank(&comm, state.size, id, state.rank);
    if (result != ncclSuccess) {
      comm = nullptr;
      failure = std::string("ncclCommInitRank failed: ") + ncclGetErrorString(result);
      const char* last = ncclGetLastError(nullptr);
      if (last && *last) failure += std::string(" (") + last + ")";
    }
  } catch (const std::exception& error) {
    failure = error.what();
  }
  const double all_succeeded = control_->all_reduce_scalar(failure.empty() ? 1.0 : 0.0, ReduceOp::Min);
  if (all_succeeded < 1.0) {
    if (comm) (void)ncclCommAbort(comm);
    PARTRAIN_CHECK(failure.empty(), "NcclCommunicator: " << failure << " on " << state.where());
    PARTRAIN_FAIL("NcclCommunicator: NCCL initialisation failed on another rank (this is " << state.where() << ")");
  }
  state.comm = comm;
}

NcclCommunicator::~NcclCommunicator() {
  NcclState& state = *state_;
  if (!state.comm) return;  // aborted
  if (std::uncaught_exceptions() > 0) {
    // Unwinding: the peers may never complete the queued work, so do not wait for it.
    state.abort("the communicator was destroyed while an exception propagated");
    return;
  }
  try {
    DeviceGuard guard(state.device);
    order_after(backend_.communication_stream(), backend_.stream());
    const RecordedEvent drained(backend_.communication_stream());
    watch(state, drained, "the work queued before the communicator's destruction");
  } catch (const std::exception& error) {
    std::cerr << "partrain: destroying the NCCL communicator: " << error.what() << std::endl;
    state.abort(error.what());  // no-op when watch() aborted already
    return;
  }
  const ncclResult_t result = ncclCommDestroy(state.comm);
  state.comm = nullptr;
  if (result != ncclSuccess)
    std::cerr << "partrain: ncclCommDestroy failed on " << state.where() << ": " << ncclGetErrorString(result)
              << std::endl;
}

cudaStream_t NcclCommunicator::enter_communication_stream() const {
  order_after(backend_.communication_stream(), backend_.stream());
  return backend_.communication_stream();
}

Request NcclCommunicator::finish_operation(std::string what, std::vector<Tensor> tensors, Completion completion) {
  Request request(std::make_unique<NcclRequest>(state_, backend_.communication_stream(), backend_.stream(),
                                                std::move(what), std::move(tensors)));
  const bool plain = backend_.communication_stream() == backend_.stream();
  // A blocking-API collective, or any collective under plain ordering, is waited for now: under
  // overlap that only orders the compute stream after it, under plain the host waits.
  if (completion == Completion::Now || (plain && completion == Completion::NowIfPlain)) request.wait();
  return request;
}

int NcclCommunicator::rank() const { return control_->rank(); }
int NcclCommunicator::size() const { return control_->size(); }
std::span<const int> NcclCommunicator::global_ranks() const { return control_->global_ranks(); }
int NcclCommunicator::max_tag() const { return control_->max_tag(); }

NcclCommunicator::Place NcclCommunicator::place_of(const Tensor& tensor, const char* operation) const {
  PARTRAIN_CHECK(tensor.defined(), operation << ": the tensor is undefined");
  if (tensor.device().is_cpu()) return Place::Host;
  const Device mine = backend_.device();
  PARTRAIN_CHECK(tensor.device() == mine, operation << ": the tensor is on " << tensor.device().to_string()
                                                    << ", this NCCL communicator uses " << mine.to_string());
  return Place::Device;
}

void NcclCommunicator::check_peer(int peer, int tag, const char* operation, const char* role) const {
  PARTRAIN_CHECK(peer >= 0 && peer < size(), operation << ": " << role << " " << peer
                                                       << " is out of range for a communicator of size " << size());
  PARTRAIN_CHECK(tag >= 0 && tag <= max_tag(),
                 operation << ": tag " << tag << " is out of range [0, " << max_tag() << "]");
}

Request NcclCommunicator::send(const Tensor& tensor, int destination, int tag) {
  const SendSpec spec{tensor, destination, tag};
  return exchange(std::span<const SendSpec>(&spec, 1), {});
}

Request NcclCommunicator::receive(const Tensor& tensor, int source, int tag) {
  const ReceiveSpec spec{tensor, source, tag};
  return exchange({}, std::span<const ReceiveSpec>(&spec, 1));
}

Request NcclCommunicator::exchange(std::span<const SendSpec> sends, std::span<const ReceiveSpec> receives) {
  // Validate everything before starting anything.
  std::vector<SendSpec> host_sends, device_sends;
  std::vector<ReceiveSpec> host_receives, device_receives;
  for (const SendSpec& spec : sends) {
    const Place place = place_of(spec.tensor, "send");
    check_peer(spec.peer, spec.tag, "send", "destination");
    (place == Place::Host ? host_sends : device_sends).push_back(spec);
  }
  for (const ReceiveSpec& spec : receives) {
    const Place place = place_of(spec.tensor, "receive");
    check_peer(spec.peer, spec.tag, "receive", "source");
    (place == Place::Host ? host_receives : device_receives).push_back(spec);
  }
  if (device_sends.empty() && device_receives.empty()) return control_->exchange(sends, receives);

  DeviceGuard guard(state_->device);
  const std::string what = describe_exchange(device_sends, device_receives);
  state_->check_health(what);
  std::vector<Request> parts;
  // The host part first: its non-blocking MPI operations cannot hold up NCCL's connection setup.
  if (!host_sends.empty() || !host_receives.empty()) parts.push_back(control_->exchange(host_sends, host_receives));

  const cudaStream_t stream = enter_communication_stream();
  std::vector<Tensor> tensors;
  PARTRAIN_NCCL_CHECK(ncclGroupStart());
  ncclResult_t result = ncclSuccess;
  const char* failed_call = nullptr;
  // Zero-element messages are skipped on both sides (the shapes agree), so the order stays matched.
  for (const ReceiveSpec& spec : device_receives) {
    tensors.push_back(spec.tensor);
    if (spec.tensor.numel() == 0) continue;
    result = ncclRecv(spec.tensor.raw_data(), static_cast<std::size_t>(spec.tensor.numel()),
                      nccl_type(spec.tensor.dtype()), spec.peer, state_->comm, stream);
    if (result != ncclSuccess) {
      failed_call = "ncclRecv";
      break;
    }
  }
  if (result == ncclSuccess) {
    for (const SendSpec& spec : device_sends) {
      tensors.push_back(spec.tensor);
      if (spec.tensor.numel() == 0) continue;
      result = ncclSend(spec.tensor.raw_data(), static_cast<std::size_t>(spec.tensor.numel()),
                        nccl_type(spec.tensor.dtype()), spec.peer, state_->comm, stream);
      if (result != ncclSuccess) {
        failed_call = "ncclSend";
        break;
      }
    }
  }
  // The group is always closed (a thread's group depth must return to zero) before any abort.
  const ncclResult_t end = ncclGroupEnd();
  if (result == ncclSuccess && end != ncclSuccess) {
    result = end;
    failed_call = "ncclGroupEnd";
  }
  if (result != ncclSuccess) fail_nccl_call(__FILE__, __LINE__, *state_, failed_call, result);

  // Point-to-point messages keep their request under both orderings (the host waits at wait() under
  // plain ordering, as the MPI backend does): a send completes only when the peer receives.
  Request device_request = finish_operation(what, std::move(tensors), Completion::Later);
  if (parts.empty()) return device_request;
  parts.push_back(std::move(device_request));
  return Request(std::make_unique<CombinedRequest>(std::move(parts)));
}

std::vector<Tensor> NcclCommunicator::enqueue_all_reduce(const Tensor& tensor, ReduceOp op, const char* operation) {
  state_->check_health(operation);
  if (tensor.numel() == 0) return {};
  const cudaStream_t stream = enter_communication_stream();
  const std::size_t count = static_cast<std::size_t>(tensor.numel());
  if (is_half_float(tensor.dtype()) && op == ReduceOp::Sum) {
    // NCCL would add in bf16 or f16 at every step; reduce an f32 copy and round once, as the interface says.
    // The conversions run on the communication stream with the reduction they belong to.
    const Tensor wide = backend_.empty(tensor.shape(), DType::F32);
    cuda::launch_convert(stream, wide, tensor);
    PARTRAIN_NCCL_OPERATION(*state_, ncclAllReduce(wide.raw_data(), wide.raw_data(), count, ncclFloat32, ncclSum,
                                                   state_->comm, stream));
    cuda::launch_convert(stream, tensor, wide);
    return {tensor, wide};
  }
  PARTRAIN_NCCL_OPERATION(*state_, ncclAllReduce(tensor.raw_data(), tensor.raw_data(), count, nccl_type(tensor.dtype()),
                                                 nccl_op(op), state_->comm, stream));
  return {tensor};
}

void NcclCommunicator::all_reduce(const Tensor& tensor, ReduceOp op) {
  if (place_of(tensor, "all_reduce") == Place::Host) {
    control_->all_reduce(tensor, op);
    return;
  }
  DeviceGuard guard(state_->device);
  (void)finish_operation(std::string("all_reduce (") + reduce_op_name(op) + ") of " + describe(tensor),
                         enqueue_all_reduce(tensor, op, "all_reduce"), Completion::Now);
}

Request NcclCommunicator::all_reduce_async(const Tensor& tensor, ReduceOp op) {
  if (place_of(tensor, "all_reduce_async") == Place::Host) return control_->all_reduce_async(tensor, op);
  DeviceGuard guard(state_->device);
  std::vector<Tensor> tensors = enqueue_all_reduce(tensor, op, "all_reduce_async");
  return finish_operation(std::string("all_reduce_async (") + reduce_op_name(op) + ") of " + describe(tensor),
                          std::move(tensors), Completion::NowIfPlain);
}

void NcclCommunicator::all_reduce_coalesced(std::span<const Tensor> tensors, ReduceOp op) {
  if (tensors.empty()) return;
  std::vector<Tensor> host, device;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& tensor = tensors[i];
    PARTRAIN_CHECK(tensor.defined(), "all_reduce_coalesced: tensor " << i << " is undefined");
    PARTRAIN_CHECK(tensor.dtype() == tensors.front().dtype(),
                   "all_reduce_coalesced: tensor " << i << " has dtype " << dtype_name(tensor.dtype()) << ", tensor 0 has "
                                                   << dtype_name(tensors.front().dtype()));
    (place_of(tensor, "all_reduce_coalesced") == Place::Host ? host : device).push_back(tensor);
  }
  if (!device.empty()) all_reduce_device_coalesced(device, op);
  if (!host.empty()) control_->all_reduce_coalesced(host, op);
}

void NcclCommunicator::all_reduce_device_coalesced(const std::vector<Tensor>& tensors, ReduceOp op) {
  DeviceGuard guard(state_->device);
  if (tensors.size() == 1) {
    (void)finish_operation("all_reduce_coalesced of " + describe(tensors.front()),
                           enqueue_all_reduce(tensors.front(), op, "all_reduce_coalesced"), Completion::Now);
    return;
  }
  state_->check_health("all_reduce_coalesced");
  const DType dtype = tensors.front().dtype();
  // A bf16 or f16 sum travels as f32 (one rounding at the end); everything else in its own dtype.
  const DType wire = is_half_float(dtype) && op == ReduceOp::Sum ? DType::F32 : dtype;
  std::int64_t total = 0;
  for (const Tensor& tensor : tensors) total += tensor.numel();
  if (total == 0) return;
  const Tensor flat = backend_.empty({total}, wire);
  const cudaStream_t stream = enter_communication_stream();
  // Pack, reduce, unpack: every step is queued on the communication stream, so the host does not wait.
  std::int64_t offset = 0;
  for (const Tensor& tensor : tensors) {
    const std::int64_t n = tensor.numel();
    if (n == 0) continue;
    const Tensor segment = flat.slice_rows(offset, offset + n);
    if (wire == dtype) {
      PARTRAIN_CUDA_CHECK(cudaMemcpyAsync(segment.raw_data(), tensor.raw_data(), tensor.nbytes(),
                                          cudaMemcpyDeviceToDevice, stream));
    } else {
      cuda::launch_convert(stream, segment, tensor.reshape({n}));
    }
    offset += n;
  }
  PARTRAIN_NCCL_OPERATION(*state_, ncclAllReduce(flat.raw_data(), flat.raw_data(), static_cast<std::size_t>(total),
                                                 nccl_type(wire), nccl_op(op), state_->comm, stream));
  offset = 0;
  for (const Tensor& tensor : tensors) {
    const std::int64_t n = tensor.numel();
    if (n == 0) continue;
    const Tensor segment = flat.slice_rows(offset, offset + n);
    if (wire == dtype) {
      PARTRAIN_CUDA_CHECK(cudaMemcpyAsync(tensor.raw_data(), segment.raw_data(), tensor.nbytes(),
                                          cudaMemcpyDeviceToDevice, stream));
    } else {
      cuda::launch_convert(stream, tensor.reshape({n}), segment);
    }
    offset += n;
  }
  std::vector<Tensor> used(tensors);
  used.push_back(flat);
  (void)finish_operation("all_reduce_coalesced of " + std::to_string(tensors.size()) + " tensors (" +
                             std::to_string(total) + " elements)",
                         std::move(used), Completion::Now);
  // `flat` goes back to the caching allocator here; the compute stream now waits for the unpacking.
}

double NcclCommunicator::all_reduce_scalar(double value, ReduceOp op) { return control_->all_reduce_scalar(value, op); }

void NcclCommunicator::reduce_scatter(const Tensor& input, const Tensor& output) {
  check_scatter_gather(input, output, size(), "reduce_scatter");
  if (place_of(input, "reduce_scatter") == Place::Host) {
    control_->reduce_scatter(input, output);
    return;
  }
  PARTRAIN_CHECK(place_of(output, "reduce_scatter") == Place::Device, "reduce_scatter: input on the GPU, output on the host");
  DeviceGuard guard(state_->device);
  state_->check_health("reduce_scatter");
  if (output.numel() == 0) return;
  PARTRAIN_NCCL_OPERATION(*state_, ncclReduceScatter(input.raw_data(), output.raw_data(),
                                                     static_cast<std::size_t>(output.numel()), ncclFloat32, ncclSum,
                                                     state_->comm, enter_communication_stream()));
  (void)finish_operation("reduce_scatter of " + describe(output), {input, output}, Completion::Now);
}

Request NcclCommunicator::reduce_scatter_async(const Tensor& input, const Tensor& output) {
  check_scatter_gather(input, output, size(), "reduce_scatter_async");
  if (place_of(input, "reduce_scatter_async") == Place::Host) return control_->reduce_scatter_async(input, output);
  PARTRAIN_CHECK(place_of(output, "reduce_scatter_async") == Place::Device,
                 "reduce_scatter_async: input on the GPU, output on the host");
  DeviceGuard guard(state_->device);
  state_->check_health("reduce_scatter_async");
  if (output.numel() > 0)
    PARTRAIN_NCCL_OPERATION(*state_, ncclReduceScatter(input.raw_data(), output.raw_data(),
                                                       static_cast<std::size_t>(output.numel()), ncclFloat32, ncclSum,
                                                       state_->comm, enter_communication_stream()));
  return finish_operation("reduce_scatter_async of " + describe(output), {input, output}, Completion::NowIfPlain);
}

void NcclCommunicator::all_gather(const Tensor& input, const Tensor& output) {
  check_gather(output, input, size(), "all_gather");
  if (place_of(input, "all_gather") == Place::Host) {
    control_->all_gather(input, output);
    return;
  }
  PARTRAIN_CHECK(place_of(output, "all_gather") == Place::Device, "all_gather: input on the GPU, output on the host");
  DeviceGuard guard(state_->device);
  state_->check_health("all_gather");
  if (input.numel() == 0) return;
  PARTRAIN_NCCL_OPERATION(*state_, ncclAllGather(input.raw_data(), output.raw_data(), static_cast<std::size_t>(input.numel()),
                                                 nccl_type(input.dtype()), state_->comm, enter_communication_stream()));
  (void)finish_operation("all_gather into " + describe(output), {input, output}, Completion::Now);
}

void NcclCommunicator::broadcast(const Tensor& tensor, int root) {
  if (place_of(tensor, "broadcast") == Place::Host) {
    control_->broadcast(tensor, root);
    return;
  }
  PARTRAIN_CHECK(root >= 0 && root < size(),
                 "broadcast: root " << root << " is out of range for a communicator of size " << size());
  DeviceGuard guard(state_->device);
  state_->check_health("broadcast");
  if (tensor.numel() == 0) return;
  PARTRAIN_NCCL_OPERATION(*state_, ncclBroadcast(tensor.raw_data(), tensor.raw_data(),
                                                 static_cast<std::size_t>(tensor.numel()), nccl_type(tensor.dtype()),
                                                 root, state_->comm, enter_communication_stream()));
  (void)finish_operation("broadcast of " + describe(tensor), {tensor}, Completion::Now);
}

void NcclCommunicator::broadcast_bytes(std::string& bytes, int root) { control_->broadcast_bytes(bytes, root); }

std::vector<std::string> NcclCommunicator::gather_bytes(const std::string& bytes, int root) {
  return control_->gather_bytes(bytes, root);
}

std::vector<std::string> NcclCommunicator::all_gather_bytes(const std::string& bytes) {
  return control_->all_gather_bytes(bytes);
}

void NcclCommunicator::barrier() { control_->barrier(); }

std::unique_ptr<Communicator> NcclCommunicator::group(std::span<const int> ranks) {
  std::unique_ptr<Communicator> members = control_->group(ranks);  // validates; collective over all ranks
  if (!members) return nullptr;
  return std::make_unique<NcclCommunicator>(std::move(members), backend_, timeout_);
}

// ---------------- free functions ----------------

std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> control, Backend& backend) {
  auto* cuda_backend = dynamic_cast<cuda::CudaBackend*>(&backend);
  PARTRAIN_CHECK(cuda_backend != nullptr, "make_nccl_communicator: the backend is \""
                                              << backend.name() << "\"; the NCCL communicator needs the CUDA backend");
  const std::chrono::milliseconds timeout = nccl_timeout_from_environment(NcclCommunicator::kDefaultTimeout);
  return std::make_unique<NcclCommunicator>(std::move(control), *cuda_backend, timeout);
}

std::string shared_gpu_description(Communicator& control, const cuda::CudaBackend& backend) {
  const std::vector<std::string> identities = control.all_gather_bytes(gpu_identity(backend));
  for (std::size_t i = 0; i < identities.size(); ++i)
    PARTRAIN_CHECK(identities[i].empty() || identities[i][0] != '!',
                   "rank " << i << " could not identify its GPU: " << identities[i].substr(1));
  for (std::size_t i = 0; i < identities.size(); ++i)
    for (std::size_t j = i + 1; j < identities.size(); ++j)
      if (identities[i] == identities[j]) {
        std::ostringstream text;
        text << "ranks " << i << " and " << j << " share the GPU " << identities[i];
        return text.str();
      }
  return "";
}

bool ranks_have_distinct_gpus(Communicator& control, const cuda::CudaBackend& backend) {
  return shared_gpu_description(control, backend).empty();
}

}  // namespace partrain::comm
