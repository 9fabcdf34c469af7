#include "app/trimmed_pipeline_communicator.h"

#include <algorithm>
#include <climits>
#include <numeric>

#include "core/error.h"

namespace partrain::app {
namespace {

// A send to a trimmed GPU: complete, but like an MPI send request it keeps the sent tensors'
// storage alive until it is waited for (the executor waits for its sends at the end of the step), so
// the trimmed run holds the same buffers as the real pipeline rank.
class HeldSend final : public comm::Request::Impl {
 public:
  explicit HeldSend(std::vector<Tensor> tensors) : tensors_(std::move(tensors)) {}
  void wait() override { tensors_.clear(); }
  bool test() override {
    tensors_.clear();
    return true;
  }

 private:
  std::vector<Tensor> tensors_;
};

}  // namespace

TrimmedPipelineCommunicator::TrimmedPipelineCommunicator(int size, int rank, Backend& backend)
    : members_(static_cast<std::size_t>(std::max(0, size))), rank_(rank), backend_(backend) {
  PARTRAIN_CHECK(size >= 1 && rank >= 0 && rank < size,
                 "trimmed profiling run: rank " << rank << " of a pipeline of " << size << " ranks");
  std::iota(members_.begin(), members_.end(), 0);
}

TrimmedPipelineCommunicator::TrimmedPipelineCommunicator(std::vector<int> members, int rank, Backend& backend)
    : members_(std::move(members)), rank_(rank), backend_(backend) {}

comm::Request TrimmedPipelineCommunicator::send(const Tensor& tensor, int, int) {
  PARTRAIN_CHECK(tensor.defined(), "trimmed profiling run: sending an undefined tensor");
  return comm::Request(std::make_unique<HeldSend>(std::vector<Tensor>{tensor}));
}

comm::Request TrimmedPipelineCommunicator::receive(const Tensor& tensor, int, int) {
  PARTRAIN_CHECK(tensor.defined(), "trimmed profiling run: receiving into an undefined tensor");
  backend_.fill_zero(tensor);
  return {};
}

comm::Request TrimmedPipelineCommunicator::exchange(std::span<const comm::SendSpec> sends,
                                                    std::span<const comm::ReceiveSpec> receives) {
  for (const comm::ReceiveSpec& receive : receives) backend_.fill_zero(receive.tensor);
  std::vector<Tensor> held;
  for (const comm::SendSpec& send : sends) held.push_back(send.tensor);
  return comm::Request(std::make_unique<HeldSend>(std::move(held)));
}

int TrimmedPipelineCommunicator::max_tag() const { return INT_MAX; }

void TrimmedPipelineCommunicator::all_reduce(const Tensor&, comm::ReduceOp) {}

comm::Request TrimmedPipelineCommunicator::all_reduce_async(const Tensor&, comm::ReduceOp) { return {}; }

void TrimmedPipelineCommunicator::all_reduce_coalesced(std::span<const Tensor>, comm::ReduceOp) {}

void TrimmedPipelineCommunicator::reduce_scatter(const Tensor& input, const Tensor& output) {
  comm::check_scatter_gather(input, output, size(), "reduce_scatter");
  const std::int64_t n = output.numel();
  backend_.copy(output, input.reshape({input.numel()}).slice_rows(rank_ * n, (rank_ + 1) * n));
}

comm::Request TrimmedPipelineCommunicator::reduce_scatter_async(const Tensor& input, const Tensor& output) {
  reduce_scatter(input, output);
  return {};
}

void TrimmedPipelineCommunicator::all_gather(const Tensor& input, const Tensor& output) {
  comm::check_gather(output, input, size(), "all_gather");
  const std::int64_t n = input.numel();
  const Tensor own = output.reshape({output.numel()}).slice_rows(rank_ * n, (rank_ + 1) * n);
  if (n > 0 && own.raw_data() == input.raw_data()) return;  // in place (ZeRO-1's gather): already there
  backend_.copy(own, input);
}

double TrimmedPipelineCommunicator::all_reduce_scalar(double value, comm::ReduceOp) { return value; }

void TrimmedPipelineCommunicator::broadcast(const Tensor&, int) {}

void TrimmedPipelineCommunicator::broadcast_bytes(std::string&, int) {}

std::vector<std::string> TrimmedPipelineCommunicator::gather_bytes(const std::string& bytes, int root) {
  if (root != rank_) return {};
  std::vector<std::string> all(members_.size());
  all[static_cast<std::size_t>(rank_)] = bytes;
  return all;
}

std::vector<std::string> TrimmedPipelineCommunicator::all_gather_bytes(const std::string& bytes) {
  std::vector<std::string> all(members_.size());
  all[static_cast<std::size_t>(rank_)] = bytes;
  return all;
}

std::unique_ptr<comm::Communicator> TrimmedPipelineCommunicator::group(std::span<const int> ranks) {
  PARTRAIN_CHECK(!ranks.empty(), "trimmed profiling run: an empty group");
  const int self = members_[static_cast<std::size_t>(rank_)];
  const auto found = std::find(ranks.begin(), ranks.end(), self);
  if (found == ranks.end()) return nullptr;
  return std::unique_ptr<comm::Communicator>(new TrimmedPipelineCommunicator(
      std::vector<int>(ranks.begin(), ranks.end()), static_cast<int>(found - ranks.begin()), backend_));
}

}  // namespace partrain::app
