#pragma once
// The communicator of a trimmed profiling run (CAPSlog §III-A, model trimming): one process plays
// one GPU of a pipeline whose other GPUs are trimmed away. Every message from a trimmed neighbour is
// a tensor of dummy data of the right size (zeros), every message to one is dropped, and the
// collectives of groups whose other members are trimmed leave this rank's data as it is. Send
// requests keep their tensors alive until waited for, as MPI's do (the executor waits for its sends
// at the end of the step: on a pipeline rank every sent tensor of the step stays allocated). The
// executor runs unchanged on it, so its allocations — and its allocator high-water mark — are those
// of the real pipeline rank.
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/backend.h"

namespace partrain::app {

class TrimmedPipelineCommunicator final : public comm::Communicator {
 public:
  /// Rank `rank` of a pipeline of `size` ranks whose global ranks are 0..size−1; received tensors
  /// are zeroed on `backend`. Throws partrain::Error for a rank outside [0, size).
  TrimmedPipelineCommunicator(int size, int rank, Backend& backend);

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  std::span<const int> global_ranks() const override { return members_; }
  const char* backend_name() const override { return "trimmed"; }

  /// Dropped (the receiver is trimmed); the request holds `tensor` until waited for, as MPI's does.
  comm::Request send(const Tensor& tensor, int destination, int tag) override;
  /// Fills `tensor` with zeros (the dummy data of a trimmed sender); complete at once.
  comm::Request receive(const Tensor& tensor, int source, int tag) override;
  comm::Request exchange(std::span<const comm::SendSpec> sends, std::span<const comm::ReceiveSpec> receives) override;
  int max_tag() const override;

  /// The other members are trimmed: the rank's own data stands for the result.
  void all_reduce(const Tensor& tensor, comm::ReduceOp op = comm::ReduceOp::Sum) override;
  comm::Request all_reduce_async(const Tensor& tensor, comm::ReduceOp op = comm::ReduceOp::Sum) override;
  /// Leaves the tensors as they are, on any device (the default packs host tensors only).
  void all_reduce_coalesced(std::span<const Tensor> tensors, comm::ReduceOp op = comm::ReduceOp::Sum) override;
  /// Copies this rank's part of `input` into `output` (checked as check_scatter_gather).
  void reduce_scatter(const Tensor& input, const Tensor& output) override;
  comm::Request reduce_scatter_async(const Tensor& input, const Tensor& output) override;
  /// Copies `input` into this rank's part of `output` (the trimmed members' parts keep their data).
  void all_gather(const Tensor& input, const Tensor& output) override;
  double all_reduce_scalar(double value, comm::ReduceOp op = comm::ReduceOp::Sum) override;
  void broadcast(const Tensor& tensor, int root) override;
  void broadcast_bytes(std::string& bytes, int root) override;
  /// {bytes} at this rank's index (other entries empty) on the root; empty elsewhere.
  std::vector<std::string> gather_bytes(const std::string& bytes, int root) override;
  std::vector<std::string> all_gather_bytes(const std::string& bytes) override;
  void barrier() override {}
  /// A trimmed communicator over `ranks` when this rank's global rank is among them, else nullptr.
  std::unique_ptr<comm::Communicator> group(std::span<const int> ranks) override;

 private:
  TrimmedPipelineCommunicator(std::vector<int> members, int rank, Backend& backend);
  std::vector<int> members_;
  int rank_ = 0;
  Backend& backend_;
};

}  // namespace partrain::app
