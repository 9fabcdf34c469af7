#include "comm/mpi_communicator.h"

#include <sched.h>

#include <omp.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <utility>
#include <vector>

#include "core/error.h"

namespace partrain::comm {

namespace {

int world_rank() {
  if (!MpiSession::active()) return -1;
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error code " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(length));
}

[[noreturn]] void throw_mpi_error(const char* file, int line, const char* call, int code) {
  std::string name(call);
  name = name.substr(0, name.find('('));
  std::ostringstream message;
  message << name << " failed on world rank " << world_rank() << ": " << mpi_error_string(code);
  throw Error(file, line, message.str());
}

// Checks the return code of an MPI call; the error names the MPI function, the rank and file:line.
#define PARTRAIN_MPI(call)                                                         \
  do {                                                                             \
    const int partrain_mpi_code_ = (call);                                         \
    if (partrain_mpi_code_ != MPI_SUCCESS)                                         \
      throw_mpi_error(__FILE__, __LINE__, #call, partrain_mpi_code_);              \
  } while (0)

// Element type used on the wire (bf16 and f16 travel as their 16 bits).
MPI_Datatype wire_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return MPI_FLOAT;
    case DType::BF16: return MPI_UINT16_T;
    case DType::F16: return MPI_UINT16_T;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
  }
  PARTRAIN_FAIL("no MPI datatype for dtype " << static_cast<int>(dtype));
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return MPI_SUM;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  PARTRAIN_FAIL("unknown ReduceOp " << static_cast<int>(op));
}

// Validates a tensor for the MPI backend and returns its element count as an MPI count.
int checked_count(const Tensor& tensor, const char* operation) {
  PARTRAIN_CHECK(tensor.defined(), operation << ": the tensor is undefined");
  PARTRAIN_CHECK(tensor.device().is_cpu(),
                 operation << ": the tensor is on " << tensor.device().to_string()
                           << "; the MPI backend takes host tensors only (use the NCCL backend or stage "
                              "through host memory)");
  PARTRAIN_CHECK(tensor.numel() <= INT_MAX, operation << ": " << tensor.numel()
                                                      << " elements exceed MPI's int count limit");
  return static_cast<int>(tensor.numel());
}

std::string describe(const Tensor& tensor) {
  return std::string(dtype_name(tensor.dtype())) + " " + shape_string(tensor.shape());
}

// A 16-bit float tensor (bf16 or f16) widened to fp32, and fp32 rounded back into one.
void half_to_f32(const Tensor& source, float* destination) {
  if (source.dtype() == DType::F16) {
    const Float16* values = source.data<Float16>();
    for (std::int64_t i = 0; i < source.numel(); ++i) destination[i] = static_cast<float>(values[i]);
    return;
  }
  const BFloat16* values = source.data<BFloat16>();
  for (std::int64_t i = 0; i < source.numel(); ++i) destination[i] = static_cast<float>(values[i]);
}

void f32_to_half(const float* source, const Tensor& destination) {
  if (destination.dtype() == DType::F16) {
    Float16* values = destination.data<Float16>();
    for (std::int64_t i = 0; i < destination.numel(); ++i) values[i] = Float16(source[i]);
    return;
  }
  BFloat16* values = destination.data<BFloat16>();
  for (std::int64_t i = 0; i < destination.numel(); ++i) values[i] = BFloat16(source[i]);
}

// Whether waits sleep between tests (MpiCommunicator::set_sleeping_waits).
std::atomic<bool> sleeping_waits{false};

// MPI_Wait, or where waits sleep, MPI_Test with sleeps of 50 to 250 us between tests: a rank
// waiting on a node with more ranks than cores leaves the scheduler nothing to run for it, so the
// computing ranks get every core. (Open MPI's waits spin; with mpi_yield_when_idle they call
// sched_yield, which only yields to a rank queued on the same core: two computing ranks could share
// one core while two waiting ones spun on the other.)
int wait_for(MPI_Request* request, MPI_Status* status) {
  if (!sleeping_waits.load(std::memory_order_relaxed)) return MPI_Wait(request, status);
  constexpr long kFirstSleepNanoseconds = 50'000, kLongestSleepNanoseconds = 250'000;
  long sleep = kFirstSleepNanoseconds;
  for (int tests = 0;; ++tests) {
    int flag = 0;
    const int code = MPI_Test(request, &flag, status);
    if (code != MPI_SUCCESS || flag) return code;
    if (tests < 8) continue;  // a message already on its way lands in microseconds
    const timespec pause{0, sleep};
    nanosleep(&pause, nullptr);
    sleep = std::min(2 * sleep, kLongestSleepNanoseconds);
  }
}

// A collective: the blocking call, or where waits sleep, the non-blocking one and wait_for (the
// blocking calls keep Open MPI's tuned algorithms where nobody shares a core).
template <typename Blocking, typename Started>
int collective(Blocking blocking, Started started) {
  if (!sleeping_waits.load(std::memory_order_relaxed)) return blocking();
  MPI_Request request = MPI_REQUEST_NULL;
  const int code = started(&request);
  if (code != MPI_SUCCESS) return code;
  return wait_for(&request, MPI_STATUS_IGNORE);
}

// One or more started MPI operations finished together. Keeps the tensors they use alive.
class MpiRequest final : public Request::Impl {
 public:
  enum class Kind { Send, Receive, Collective };
  struct Operation {
    Kind kind;
    int peer;  // group rank (sends and receives)
    int tag;
    int count;  // elements expected (receives)
    MPI_Datatype type;
    std::size_t tensor;  // index into tensors_
    const char* name;    // collectives
  };

  void add(MPI_Request request, Operation operation, const Tensor& tensor) {
    operation.tensor = tensors_.size();
    tensors_.push_back(tensor);
    requests_.push_back(request);
    operations_.push_back(operation);
  }
  void keep_alive(const Tensor& tensor) { tensors_.push_back(tensor); }
  void on_complete(std::function<void()> callback) { on_complete_ = std::move(callback); }
  std::size_t pending() const { return requests_.size(); }

  // Each request is waited for or tested on its own, never with MPI_Waitall: Open MPI 4.1.4 with a
  // thread level above MPI_THREAD_SINGLE can hang in MPI_Waitall on a receive that has already
  // failed (a truncated message that arrived before the receive was posted).
  void wait() override {
    prepare();
    for (std::size_t i = 0; i < requests_.size(); ++i) {
      if (requests_[i] == MPI_REQUEST_NULL) continue;
      record(i, wait_for(&requests_[i], &statuses_[i]));
    }
    finish();
  }

  bool test() override {
    prepare();
    bool complete = true;
    for (std::size_t i = 0; i < requests_.size(); ++i) {
      if (requests_[i] == MPI_REQUEST_NULL) continue;
      int flag = 0;
      const int code = MPI_Test(&requests_[i], &flag, &statuses_[i]);
      if (code != MPI_SUCCESS || flag) {
        record(i, code);
      } else {
        complete = false;
      }
    }
    if (!complete) return false;  // after an error too: the others finish before anything is freed
    finish();
    return true;
  }

 private:
  std::string describe_operation(const Operation& operation) const {
    std::ostringstream text;
    switch (operation.kind) {
      case Kind::Send:
        text << "send of " << describe(tensors_[operation.tensor]) << " to rank " << operation.peer
             << " with tag " << operation.tag;
        break;
      case Kind::Receive:
        text << "receive into " << describe(tensors_[operation.tensor]) << " from rank " << operation.peer
             << " with tag " << operation.tag;
        break;
      case Kind::Collective: text << operation.name << " of " << describe(tensors_[operation.tensor]); break;
    }
    text << " (world rank " << world_rank() << ")";
    return text.str();
  }

  void prepare() {
    if (codes_.size() == requests_.size()) return;
    codes_.assign(requests_.size(), MPI_SUCCESS);
    statuses_.resize(requests_.size());
  }

  void record(std::size_t i, int code) {
    codes_[i] = code;
    // A failed request is complete: never touch it again.
    if (code != MPI_SUCCESS) requests_[i] = MPI_REQUEST_NULL;
  }

  void finish() {
    for (std::size_t i = 0; i < codes_.size(); ++i)
      PARTRAIN_CHECK(codes_[i] == MPI_SUCCESS,
                     describe_operation(operations_[i]) << " failed: " << mpi_error_string(codes_[i]));
    for (std::size_t i = 0; i < statuses_.size(); ++i) {
      const Operation& operation = operations_[i];
      if (operation.kind != Kind::Receive) continue;
      int received = 0;
      PARTRAIN_MPI(MPI_Get_count(&statuses_[i], operation.type, &received));
      PARTRAIN_CHECK(received == operation.count,
                     describe_operation(operation)
                         << ": the message has "
                         << (received == MPI_UNDEFINED ? std::string("a size that is not a whole number of")
                                                       : std::to_string(received))
                         << " elements, the tensor " << operation.count);
    }
    if (on_complete_) on_complete_();
  }

  std::vector<MPI_Request> requests_;
  std::vector<MPI_Status> statuses_;
  std::vector<int> codes_;  // MPI return code of each request once complete
  std::vector<Operation> operations_;
  std::vector<Tensor> tensors_;
  std::function<void()> on_complete_;
};

// Starts operations into `request`; if starting one fails, the ones already started are abandoned
// (leaked with their buffers) before the error propagates, so nothing writes into freed memory.
template <typename Body>
Request start(Body&& body) {
  auto request = std::make_unique<MpiRequest>();
  try {
    body(*request);
  } catch (...) {
    if (request->pending()) (void)request.release();
    throw;
  }
  return Request(std::move(request));
}

}  // namespace

// ---------------- MpiSession ----------------

namespace {

// Open MPI's non-blocking collectives (coll/libnbc) all-reduce in a binomial tree (reduce to one
// rank, then broadcast) whenever the buffer is reduced in place or the group has fewer than 4 ranks;
// the gradient buckets are both. On 2 ranks its ring took 4.0-4.3 ms for ResNet's 11 MB of
// gradients where the tree took 10.2 ms, and the blocking MPI_Allreduce the communication profile
// times 4.4 ms (docs/parallelism.md §Overlapped gradient all-reduce). The ring, as NCCL and Gloo use for
// large buffers. Set before MPI_Init, where Open MPI reads its MCA variables; a value the user set
// (OMPI_MCA_... in the environment, or mpirun --mca, which sets it) is kept; other MPIs ignore it.
void choose_nonblocking_allreduce_algorithm() {
  ::setenv(kNonblockingAllReduceAlgorithmVariable, "1", /*overwrite=*/0);
}

}  // namespace

MpiSession::MpiSession(int* argc, char*** argv, int required_thread_level) {
  int initialised = 0;
  PARTRAIN_MPI(MPI_Initialized(&initialised));
  if (!initialised) {
    int finalised = 0;
    PARTRAIN_MPI(MPI_Finalized(&finalised));
    PARTRAIN_CHECK(!finalised, "MpiSession: MPI was finalised already and cannot be initialised again");
    choose_nonblocking_allreduce_algorithm();
    PARTRAIN_MPI(MPI_Init_thread(argc, argv, required_thread_level, &thread_level_));
    owns_ = true;
  } else {
    PARTRAIN_MPI(MPI_Query_thread(&thread_level_));
  }
  PARTRAIN_CHECK(thread_level_ >= required_thread_level,
                 "MpiSession: MPI provides thread level " << thread_level_ << ", " << required_thread_level
                                                          << " is required");
}

MpiSession::~MpiSession() {
  if (owns_ && active()) MPI_Finalize();
}

bool MpiSession::active() {
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  return initialised && !finalised;
}

void MpiSession::abort(int exit_code) {
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::abort();  // not reached
}

// ---------------- MpiCommunicator ----------------

std::unique_ptr<MpiCommunicator> MpiCommunicator::world() {
  PARTRAIN_CHECK(MpiSession::active(), "MpiCommunicator::world: MPI is not initialised (create an MpiSession)");
  MPI_Comm duplicate = MPI_COMM_NULL;
  PARTRAIN_MPI(MPI_Comm_dup(MPI_COMM_WORLD, &duplicate));
  set_sleeping_waits(node_local_size() * omp_get_max_threads() > node_cpu_count());
  return std::make_unique<MpiCommunicator>(duplicate);
}

void MpiCommunicator::set_sleeping_waits(bool sleep) { sleeping_waits.store(sleep); }

bool MpiCommunicator::sleeping_waits_enabled() { return sleeping_waits.load(); }

namespace {
// This process's rank in, and the size of, the communicator of its node's processes
// (MPI_Comm_split_type SHARED on MPI_COMM_WORLD). Collective over MPI_COMM_WORLD.
std::pair<int, int> node_rank_and_size() {
  PARTRAIN_CHECK(MpiSession::active(), "MpiCommunicator: MPI is not initialised");
  MPI_Comm node = MPI_COMM_NULL;
  PARTRAIN_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int rank = 0, size = 0;
  int status = MPI_Comm_rank(node, &rank);
  if (status == MPI_SUCCESS) status = MPI_Comm_size(node, &size);
  MPI_Comm_free(&node);
  PARTRAIN_MPI(status);
  return {rank, size};
}
}  // namespace

int MpiCommunicator::node_local_rank() { return node_rank_and_size().first; }

int MpiCommunicator::node_local_size() { return node_rank_and_size().second; }

int MpiCommunicator::node_cpu_count() {
  PARTRAIN_CHECK(MpiSession::active(), "MpiCommunicator: MPI is not initialised");
  cpu_set_t mine;
  CPU_ZERO(&mine);
  PARTRAIN_CHECK(sched_getaffinity(0, sizeof mine, &mine) == 0, "MpiCommunicator: sched_getaffinity failed");
  constexpr int kWords = CPU_SETSIZE / 64;
  std::vector<std::uint64_t> words(kWords, 0), node_words(kWords, 0);
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &mine)) words[cpu / 64] |= std::uint64_t{1} << (cpu % 64);
  MPI_Comm node = MPI_COMM_NULL;
  PARTRAIN_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  const int status = MPI_Allreduce(words.data(), node_words.data(), kWords, MPI_UINT64_T, MPI_BOR, node);
  MPI_Comm_free(&node);
  PARTRAIN_MPI(status);
  int count = 0;
  for (std::uint64_t word : node_words) count += std::popcount(word);
  return count;
}

MpiCommunicator::MpiCommunicator(MPI_Comm communicator) : communicator_(communicator) {
  PARTRAIN_CHECK(communicator != MPI_COMM_NULL, "MpiCommunicator: MPI_COMM_NULL");
  PARTRAIN_MPI(MPI_Comm_set_errhandler(communicator_, MPI_ERRORS_RETURN));
  PARTRAIN_MPI(MPI_Comm_rank(communicator_, &rank_));
  PARTRAIN_MPI(MPI_Comm_size(communicator_, &size_));
  void* tag_bound = nullptr;
  int found = 0;
  PARTRAIN_MPI(MPI_Comm_get_attr(communicator_, MPI_TAG_UB, &tag_bound, &found));
  if (found && tag_bound) max_tag_ = *static_cast<int*>(tag_bound);

  MPI_Group group = MPI_GROUP_NULL, world_group = MPI_GROUP_NULL;
  PARTRAIN_MPI(MPI_Comm_group(communicator_, &group));
  PARTRAIN_MPI(MPI_Comm_group(MPI_COMM_WORLD, &world_group));
  std::vector<int> local(static_cast<std::size_t>(size_));
  for (int i = 0; i < size_; ++i) local[static_cast<std::size_t>(i)] = i;
  global_ranks_.resize(static_cast<std::size_t>(size_));
  const int code = MPI_Group_translate_ranks(group, size_, local.data(), world_group, global_ranks_.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  PARTRAIN_MPI(code);
}

MpiCommunicator::~MpiCommunicator() {
  if (communicator_ != MPI_COMM_NULL && MpiSession::active()) MPI_Comm_free(&communicator_);
}

Request MpiCommunicator::send(const Tensor& tensor, int destination, int tag) {
  const SendSpec spec{tensor, destination, tag};
  return exchange(std::span<const SendSpec>(&spec, 1), {});
}

Request MpiCommunicator::receive(const Tensor& tensor, int source, int tag) {
  const ReceiveSpec spec{tensor, source, tag};
  return exchange({}, std::span<const ReceiveSpec>(&spec, 1));
}

Request MpiCommunicator::exchange(std::span<const SendSpec> sends, std::span<const ReceiveSpec> receives) {
  // Validate everything before starting anything.
  auto check_peer = [&](int peer, int tag, const char* operation, const char* role) {
    PARTRAIN_CHECK(peer >= 0 && peer < size_, operation << ": " << role << " " << peer
                                                        << " is out of range for a communicator of size "
                                                        << size_);
    PARTRAIN_CHECK(tag >= 0 && tag <= max_tag_,
                   operation << ": tag " << tag << " is out of range [0, " << max_tag_ << "]");
  };
  for (const SendSpec& spec : sends) {
    checked_count(spec.tensor, "send");
    check_peer(spec.peer, spec.tag, "send", "destination");
  }
  for (const ReceiveSpec& spec : receives) {
    checked_count(spec.tensor, "receive");
    check_peer(spec.peer, spec.tag, "receive", "source");
  }
  return start([&](MpiRequest& request) {
    for (const ReceiveSpec& spec : receives) {  // receives first: early arrivals land in place
      const int count = static_cast<int>(spec.tensor.numel());
      const MPI_Datatype type = wire_type(spec.tensor.dtype());
      MPI_Request handle = MPI_REQUEST_NULL;
      PARTRAIN_MPI(MPI_Irecv(spec.tensor.raw_data(), count, type, spec.peer, spec.tag, communicator_, &handle));
      request.add(handle, {MpiRequest::Kind::Receive, spec.peer, spec.tag, count, type, 0, nullptr}, spec.tensor);
    }
    for (const SendSpec& spec : sends) {
      const int count = static_cast<int>(spec.tensor.numel());
      const MPI_Datatype type = wire_type(spec.tensor.dtype());
      MPI_Request handle = MPI_REQUEST_NULL;
      PARTRAIN_MPI(MPI_Isend(spec.tensor.raw_data(), count, type, spec.peer, spec.tag, communicator_, &handle));
      request.add(handle, {MpiRequest::Kind::Send, spec.peer, spec.tag, count, type, 0, nullptr}, spec.tensor);
    }
  });
}

void MpiCommunicator::all_reduce(const Tensor& tensor, ReduceOp op) {
  const int count = checked_count(tensor, "all_reduce");
  if (is_half_float(tensor.dtype())) {
    std::vector<float> values(static_cast<std::size_t>(count));
    half_to_f32(tensor, values.data());
    PARTRAIN_MPI(collective(
        [&] { return MPI_Allreduce(MPI_IN_PLACE, values.data(), count, MPI_FLOAT, mpi_op(op), communicator_); },
        [&](MPI_Request* r) { return MPI_Iallreduce(MPI_IN_PLACE, values.data(), count, MPI_FLOAT, mpi_op(op), communicator_, r); }));
    f32_to_half(values.data(), tensor);
    return;
  }
  const MPI_Datatype type = wire_type(tensor.dtype());
  PARTRAIN_MPI(collective(
      [&] { return MPI_Allreduce(MPI_IN_PLACE, tensor.raw_data(), count, type, mpi_op(op), communicator_); },
      [&](MPI_Request* r) { return MPI_Iallreduce(MPI_IN_PLACE, tensor.raw_data(), count, type, mpi_op(op), communicator_, r); }));
}

Request MpiCommunicator::all_reduce_async(const Tensor& tensor, ReduceOp op) {
  const int count = checked_count(tensor, "all_reduce_async");
  return start([&](MpiRequest& request) {
    Tensor buffer = tensor;
    if (is_half_float(tensor.dtype())) {  // reduce an fp32 copy, round back on completion
      buffer = Tensor::empty(tensor.shape(), DType::F32);
      half_to_f32(tensor, buffer.data<float>());
      request.keep_alive(tensor);
      request.on_complete([buffer, tensor] { f32_to_half(buffer.data<float>(), tensor); });
    }
    const MPI_Datatype type = wire_type(buffer.dtype());
    MPI_Request handle = MPI_REQUEST_NULL;
    PARTRAIN_MPI(MPI_Iallreduce(MPI_IN_PLACE, buffer.raw_data(), count, type, mpi_op(op), communicator_, &handle));
    request.add(handle, {MpiRequest::Kind::Collective, -1, -1, count, type, 0, "all_reduce_async"}, buffer);
  });
}

void MpiCommunicator::reduce_scatter(const Tensor& input, const Tensor& output) {
  check_scatter_gather(input, output, size(), "reduce_scatter");
  const int count = checked_count(output, "reduce_scatter");
  PARTRAIN_MPI(collective(
      [&] { return MPI_Reduce_scatter_block(input.raw_data(), output.raw_data(), count, MPI_FLOAT, MPI_SUM, communicator_); },
      [&](MPI_Request* r) {
        return MPI_Ireduce_scatter_block(input.raw_data(), output.raw_data(), count, MPI_FLOAT, MPI_SUM, communicator_, r);
      }));
}

Request MpiCommunicator::reduce_scatter_async(const Tensor& input, const Tensor& output) {
  check_scatter_gather(input, output, size(), "reduce_scatter_async");
  const int count = checked_count(output, "reduce_scatter_async");
  return start([&](MpiRequest& request) {
    MPI_Request handle = MPI_REQUEST_NULL;
    PARTRAIN_MPI(MPI_Ireduce_scatter_block(input.raw_data(), output.raw_data(), count, MPI_FLOAT, MPI_SUM,
                                           communicator_, &handle));
    request.add(handle, {MpiRequest::Kind::Collective, -1, -1, count, MPI_FLOAT, 0, "reduce_scatter_async"}, output);
    request.keep_alive(input);
  });
}

void MpiCommunicator::all_gather(const Tensor& input, const Tensor& output) {
  check_gather(output, input, size(), "all_gather");
  const int count = checked_count(input, "all_gather");
  // MPI forbids aliased buffers; the own-slot case is its MPI_IN_PLACE.
  const void* send = is_own_slot(input, output, rank()) ? MPI_IN_PLACE : input.raw_data();
  const MPI_Datatype type = wire_type(input.dtype());
  PARTRAIN_MPI(collective(
      [&] { return MPI_Allgather(send, count, type, output.raw_data(), count, type, communicator_); },
      [&](MPI_Request* r) { return MPI_Iallgather(send, count, type, output.raw_data(), count, type, communicator_, r); }));
}

double MpiCommunicator::all_reduce_scalar(double value, ReduceOp op) {
  PARTRAIN_MPI(collective(
      [&] { return MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, mpi_op(op), communicator_); },
      [&](MPI_Request* r) { return MPI_Iallreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, mpi_op(op), communicator_, r); }));
  return value;
}

void MpiCommunicator::broadcast(const Tensor& tensor, int root) {
  const int count = checked_count(tensor, "broadcast");
  PARTRAIN_CHECK(root >= 0 && root < size_,
                 "broadcast: root " << root << " is out of range for a communicator of size " << size_);
  const MPI_Datatype type = wire_type(tensor.dtype());
  PARTRAIN_MPI(collective([&] { return MPI_Bcast(tensor.raw_data(), count, type, root, communicator_); },
                          [&](MPI_Request* r) { return MPI_Ibcast(tensor.raw_data(), count, type, root, communicator_, r); }));
}

void MpiCommunicator::broadcast_bytes(std::string& bytes, int root) {
  PARTRAIN_CHECK(root >= 0 && root < size_,
                 "broadcast_bytes: root " << root << " is out of range for a communicator of size " << size_);
  std::uint64_t length = bytes.size();
  PARTRAIN_MPI(collective([&] { return MPI_Bcast(&length, 1, MPI_UINT64_T, root, communicator_); },
                          [&](MPI_Request* r) { return MPI_Ibcast(&length, 1, MPI_UINT64_T, root, communicator_, r); }));
  PARTRAIN_CHECK(length <= static_cast<std::uint64_t>(INT_MAX),
                 "broadcast_bytes: " << length << " bytes exceed MPI's int count limit");
  if (rank_ != root) bytes.resize(length);
  if (length)
    PARTRAIN_MPI(collective(
        [&] { return MPI_Bcast(bytes.data(), static_cast<int>(length), MPI_CHAR, root, communicator_); },
        [&](MPI_Request* r) { return MPI_Ibcast(bytes.data(), static_cast<int>(length), MPI_CHAR, root, communicator_, r); }));
}

MpiCommunicator::GatheredLayout MpiCommunicator::gathered_layout(int length, const char* operation) const {
  // Every rank learns every length (a control path, so the extra data is negligible): then every
  // rank sees the same total and the size check below fails on all ranks together.
  GatheredLayout layout;
  layout.lengths.resize(static_cast<std::size_t>(size_));
  PARTRAIN_MPI(MPI_Allgather(&length, 1, MPI_INT, layout.lengths.data(), 1, MPI_INT, communicator_));
  layout.offsets.resize(layout.lengths.size());
  for (std::size_t i = 0; i < layout.lengths.size(); ++i) {
    layout.offsets[i] = static_cast<int>(std::min<std::int64_t>(layout.total, INT_MAX));
    layout.total += layout.lengths[i];
  }
  PARTRAIN_CHECK(layout.total <= INT_MAX,
                 operation << ": " << layout.total << " bytes in all exceed MPI's int count limit");
  return layout;
}

std::vector<std::string> MpiCommunicator::gather_bytes(const std::string& bytes, int root) {
  PARTRAIN_CHECK(root >= 0 && root < size_,
                 "gather_bytes: root " << root << " is out of range for a communicator of size " << size_);
  PARTRAIN_CHECK(bytes.size() <= static_cast<std::size_t>(INT_MAX),
                 "gather_bytes: " << bytes.size() << " bytes exceed MPI's int count limit");
  const int length = static_cast<int>(bytes.size());
  const auto [lengths, offsets, total] = gathered_layout(length, "gather_bytes");
  std::string buffer(rank_ == root ? static_cast<std::size_t>(total) : 0, '\0');
  PARTRAIN_MPI(MPI_Gatherv(bytes.data(), length, MPI_CHAR, buffer.data(), lengths.data(), offsets.data(), MPI_CHAR,
                           root, communicator_));
  std::vector<std::string> result;
  if (rank_ != root) return result;
  result.reserve(lengths.size());
  for (std::size_t i = 0; i < lengths.size(); ++i) result.emplace_back(buffer, offsets[i], lengths[i]);
  return result;
}

std::vector<std::string> MpiCommunicator::all_gather_bytes(const std::string& bytes) {
  PARTRAIN_CHECK(bytes.size() <= static_cast<std::size_t>(INT_MAX),
                 "all_gather_bytes: " << bytes.size() << " bytes exceed MPI's int count limit");
  const int length = static_cast<int>(bytes.size());
  const auto [lengths, offsets, total] = gathered_layout(length, "all_gather_bytes");
  std::string buffer(static_cast<std::size_t>(total), '\0');
  PARTRAIN_MPI(MPI_Allgatherv(bytes.data(), length, MPI_CHAR, buffer.data(), lengths.data(), offsets.data(),
                              MPI_CHAR, communicator_));
  std::vector<std::string> result;
  result.reserve(lengths.size());
  for (std::size_t i = 0; i < lengths.size(); ++i) result.emplace_back(buffer, offsets[i], lengths[i]);
  return result;
}

void MpiCommunicator::barrier() {
  PARTRAIN_MPI(collective([&] { return MPI_Barrier(communicator_); },
                          [&](MPI_Request* r) { return MPI_Ibarrier(communicator_, r); }));
}

std::unique_ptr<Communicator> MpiCommunicator::group(std::span<const int> ranks) {
  // 1. Validate the list locally, then agree on validity, so that no rank is left waiting in
  //    MPI_Comm_split when another one rejected its list.
  std::ostringstream problem;
  std::vector<int> seen;
  for (const int global : ranks) {
    if (group_rank_of(*this, global) < 0) {
      problem << "rank " << global << " is not a member of this communicator";
      break;
    }
    if (std::find(seen.begin(), seen.end(), global) != seen.end()) {
      problem << "rank " << global << " appears twice";
      break;
    }
    seen.push_back(global);
  }
  if (ranks.empty()) problem << "the rank list is empty";
  std::string list_text;
  for (const int global : ranks) list_text += (list_text.empty() ? "" : ", ") + std::to_string(global);
  const std::string local_problem = problem.str();
  int first_bad = local_problem.empty() ? INT_MAX : rank_;
  PARTRAIN_MPI(MPI_Allreduce(MPI_IN_PLACE, &first_bad, 1, MPI_INT, MPI_MIN, communicator_));
  PARTRAIN_CHECK(local_problem.empty(), "group([" << list_text << "]): " << local_problem);
  PARTRAIN_CHECK(first_bad == INT_MAX,
                 "group: rank " << first_bad << " of the communicator passed an invalid rank list");

  // 2. Split: color = the smallest global rank of the group, key = position in the list.
  const int me = global_ranks_[static_cast<std::size_t>(rank_)];
  const auto position = std::find(ranks.begin(), ranks.end(), me);
  const bool member = position != ranks.end();
  const int color = member ? *std::min_element(ranks.begin(), ranks.end()) : MPI_UNDEFINED;
  const int key = member ? static_cast<int>(position - ranks.begin()) : 0;
  MPI_Comm split = MPI_COMM_NULL;
  PARTRAIN_MPI(MPI_Comm_split(communicator_, color, key, &split));
  std::unique_ptr<MpiCommunicator> result;
  if (split != MPI_COMM_NULL) result = std::make_unique<MpiCommunicator>(split);

  // 3. The members must have passed the same list: check the group formed is the list, and agree.
  bool agrees = true;
  if (result) agrees = std::equal(ranks.begin(), ranks.end(), result->global_ranks_.begin(),
                                  result->global_ranks_.end());
  int all_agree = agrees ? 1 : 0;
  PARTRAIN_MPI(MPI_Allreduce(MPI_IN_PLACE, &all_agree, 1, MPI_INT, MPI_MIN, communicator_));
  PARTRAIN_CHECK(agrees, "group([" << list_text << "]): the members of this group passed different lists or "
                                      "the lists of different groups overlap");
  PARTRAIN_CHECK(all_agree, "group: the members of some group passed different lists or the lists of "
                            "different groups overlap");
  return result;
}

}  // namespace partrain::comm
