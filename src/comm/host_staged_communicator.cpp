#include "comm/host_staged_communicator.h"

#include <functional>
#include <utility>

#include "core/error.h"

namespace partrain::comm {

namespace {

/// Completes the host operation, then copies its results into the device tensors.
class StagedRequest final : public Request::Impl {
 public:
  using Finish = std::function<void()>;
  StagedRequest(Request inner, Finish finish) : inner_(std::move(inner)), finish_(std::move(finish)) {}

  void wait() override {
    inner_.wait();
    finish_();
  }
  bool test() override {
    if (!inner_.test()) return false;
    finish_();
    return true;
  }

 private:
  Request inner_;
  Finish finish_;
};

}  // namespace

HostStagedCommunicator::HostStagedCommunicator(std::unique_ptr<Communicator> host, Backend& backend)
    : host_(std::move(host)), backend_(backend) {
  PARTRAIN_CHECK(host_ != nullptr, "HostStagedCommunicator: no host communicator");
}

bool HostStagedCommunicator::staged(const Tensor& tensor, const char* operation) const {
  PARTRAIN_CHECK(tensor.defined(), operation << ": the tensor is undefined");
  const Device device = tensor.device();
  if (device == backend_.device()) return true;
  PARTRAIN_CHECK(device.is_cpu(), operation << ": the tensor is on " << device.to_string()
                                            << ", this host-staged communicator copies from "
                                            << backend_.device().to_string());
  return false;
}

Tensor HostStagedCommunicator::host_copy(const Tensor& tensor, const char* operation) {
  if (!staged(tensor, operation)) return tensor;
  Tensor host = Tensor::empty(tensor.shape(), tensor.dtype());
  backend_.copy(host, tensor);
  return host;
}

Tensor HostStagedCommunicator::host_target(const Tensor& tensor, const char* operation,
                                           std::vector<CopyBack>& copy_back) {
  if (!staged(tensor, operation)) return tensor;
  Tensor host = Tensor::empty(tensor.shape(), tensor.dtype());
  copy_back.push_back({tensor, host});
  return host;
}

void HostStagedCommunicator::finish(Backend& backend, const std::vector<CopyBack>& copy_back) {
  if (copy_back.empty()) return;
  for (const CopyBack& pair : copy_back) backend.copy(pair.device, pair.host);
  // The host buffers are freed after this; a backend whose copies from the host were asynchronous
  // must have read them first.
  backend.synchronise();
}

Request HostStagedCommunicator::staged_request(Request inner, std::vector<CopyBack> copy_back) {
  if (copy_back.empty()) return inner;
  return Request(std::make_unique<StagedRequest>(
      std::move(inner), [&backend = backend_, copy_back = std::move(copy_back)] { finish(backend, copy_back); }));
}

// ---- point-to-point ----

Request HostStagedCommunicator::send(const Tensor& tensor, int destination, int tag) {
  const SendSpec spec{tensor, destination, tag};
  return exchange(std::span<const SendSpec>(&spec, 1), {});
}

Request HostStagedCommunicator::receive(const Tensor& tensor, int source, int tag) {
  const ReceiveSpec spec{tensor, source, tag};
  return exchange({}, std::span<const ReceiveSpec>(&spec, 1));
}

Request HostStagedCommunicator::exchange(std::span<const SendSpec> sends, std::span<const ReceiveSpec> receives) {
  std::vector<SendSpec> host_sends;
  std::vector<ReceiveSpec> host_receives;
  std::vector<CopyBack> copy_back;
  bool copied = false;
  for (const SendSpec& spec : sends) {
    copied = copied || staged(spec.tensor, "send");
    host_sends.push_back({host_copy(spec.tensor, "send"), spec.peer, spec.tag});
  }
  for (const ReceiveSpec& spec : receives)
    host_receives.push_back({host_target(spec.tensor, "receive", copy_back), spec.peer, spec.tag});
  // The staged copies are complete before MPI reads them.
  if (copied) backend_.synchronise();
  return staged_request(host_->exchange(host_sends, host_receives), std::move(copy_back));
}

// ---- collectives ----

void HostStagedCommunicator::all_reduce(const Tensor& tensor, ReduceOp op) {
  if (!staged(tensor, "all_reduce")) return host_->all_reduce(tensor, op);
  const Tensor host = host_copy(tensor, "all_reduce");
  backend_.synchronise();
  host_->all_reduce(host, op);
  finish(backend_, {{tensor, host}});
}

Request HostStagedCommunicator::all_reduce_async(const Tensor& tensor, ReduceOp op) {
  if (!staged(tensor, "all_reduce_async")) return host_->all_reduce_async(tensor, op);
  const Tensor host = host_copy(tensor, "all_reduce_async");
  backend_.synchronise();
  return staged_request(host_->all_reduce_async(host, op), {{tensor, host}});
}

void HostStagedCommunicator::all_reduce_coalesced(std::span<const Tensor> tensors, ReduceOp op) {
  std::vector<Tensor> host_tensors;
  std::vector<CopyBack> copy_back;
  for (const Tensor& tensor : tensors) {
    if (!staged(tensor, "all_reduce_coalesced")) {
      host_tensors.push_back(tensor);
      continue;
    }
    host_tensors.push_back(host_copy(tensor, "all_reduce_coalesced"));
    copy_back.push_back({tensor, host_tensors.back()});
  }
  if (!copy_back.empty()) backend_.synchronise();
  host_->all_reduce_coalesced(host_tensors, op);
  finish(backend_, copy_back);
}

void HostStagedCommunicator::reduce_scatter(const Tensor& input, const Tensor& output) {
  reduce_scatter_async(input, output).wait();  // staging and copying back as the async form does
}

Request HostStagedCommunicator::reduce_scatter_async(const Tensor& input, const Tensor& output) {
  check_scatter_gather(input, output, size(), "reduce_scatter_async");
  std::vector<CopyBack> copy_back;
  const Tensor host_input = host_copy(input, "reduce_scatter_async");
  const Tensor host_output = host_target(output, "reduce_scatter_async", copy_back);
  if (staged(input, "reduce_scatter_async")) backend_.synchronise();
  return staged_request(host_->reduce_scatter_async(host_input, host_output), std::move(copy_back));
}

void HostStagedCommunicator::all_gather(const Tensor& input, const Tensor& output) {
  check_gather(output, input, size(), "all_gather");
  std::vector<CopyBack> copy_back;
  const Tensor host_input = host_copy(input, "all_gather");
  const Tensor host_output = host_target(output, "all_gather", copy_back);
  if (staged(input, "all_gather")) backend_.synchronise();
  host_->all_gather(host_input, host_output);
  finish(backend_, copy_back);
}

double HostStagedCommunicator::all_reduce_scalar(double value, ReduceOp op) { return host_->all_reduce_scalar(value, op); }

void HostStagedCommunicator::broadcast(const Tensor& tensor, int root) {
  if (!staged(tensor, "broadcast")) return host_->broadcast(tensor, root);
  PARTRAIN_CHECK(root >= 0 && root < size(),
                 "broadcast: root " << root << " is out of range for a communicator of size " << size());
  if (rank() == root) {
    const Tensor host = host_copy(tensor, "broadcast");
    backend_.synchronise();
    host_->broadcast(host, root);
    return;
  }
  std::vector<CopyBack> copy_back;
  const Tensor host = host_target(tensor, "broadcast", copy_back);
  host_->broadcast(host, root);
  finish(backend_, copy_back);
}

void HostStagedCommunicator::broadcast_bytes(std::string& bytes, int root) { host_->broadcast_bytes(bytes, root); }

std::vector<std::string> HostStagedCommunicator::gather_bytes(const std::string& bytes, int root) {
  return host_->gather_bytes(bytes, root);
}

std::vector<std::string> HostStagedCommunicator::all_gather_bytes(const std::string& bytes) {
  return host_->all_gather_bytes(bytes);
}

void HostStagedCommunicator::barrier() { host_->barrier(); }

std::unique_ptr<Communicator> HostStagedCommunicator::group(std::span<const int> ranks) {
  std::unique_ptr<Communicator> members = host_->group(ranks);  // validates; collective over all ranks
  if (!members) return nullptr;
  return std::make_unique<HostStagedCommunicator>(std::move(members), backend_);
}

}  // namespace partrain::comm
