#pragma once
// A Communicator for device tensors that stages them through host memory: every tensor on the
// backend's device is copied to a host buffer (Backend::copy), the operation runs on a host
// communicator of the same ranks (an MpiCommunicator), and results are copied back into the device
// tensors. It is what make_device_world (comm/device_communicator.h) returns when ranks share a GPU,
// which NCCL refuses (e.g. a 2-stage pipeline on a 1-GPU machine), or when
// PARTRAIN_DEVICE_COMMUNICATOR=host asks for it. Slower than NCCL (two PCIe copies and a host
// synchronisation per message), but it runs wherever MPI runs.
//
// Semantics: those of the host communicator (comm/communicator.h), tensor for tensor:
//  - A tensor on the backend's device is staged; a host tensor (when the backend is a GPU) is passed
//    to the host communicator as it is; a tensor on another device is an error. On the CPU backend
//    every tensor is on the backend's device, so every tensor is staged (host to host): that is how
//    the tests exercise the staging on machines without a GPU.
//  - Sends copy the device tensor to the host and synchronise the backend (the send reads the staged
//    copy only after the device work that produced the tensor is done). Receives and the results of
//    collectives land in host buffers and are copied into the device tensors by wait() (or by the
//    test() that sees completion), so a receiving tensor holds the data only after wait(), as the
//    interface says; the backend is synchronised after the copies back (the host buffers are
//    freed then).
//  - Tags and message matching are the host communicator's (MPI matches by tag, and a send does not
//    block until its receive is posted, so none of NCCL's ordering restrictions apply).
//  - Byte strings, scalars and barriers go straight to the host communicator.
// Results are bit-identical to the host communicator's on host copies of the same tensors.
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/backend.h"

namespace partrain::comm {

class HostStagedCommunicator final : public Communicator {
 public:
  /// Wraps `host` (a communicator of host tensors, e.g. an MpiCommunicator; owned) for tensors on
  /// `backend`'s device. `backend` must outlive this communicator. Not collective.
  HostStagedCommunicator(std::unique_ptr<Communicator> host, Backend& backend);

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::span<const int> global_ranks() const override { return host_->global_ranks(); }
  /// "host-staged".
  const char* backend_name() const override { return "host-staged"; }

  Request send(const Tensor& tensor, int destination, int tag) override;
  Request receive(const Tensor& tensor, int source, int tag) override;
  Request exchange(std::span<const SendSpec> sends, std::span<const ReceiveSpec> receives) override;
  int max_tag() const override { return host_->max_tag(); }

  void all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::Sum) override;
  Request all_reduce_async(const Tensor& tensor, ReduceOp op = ReduceOp::Sum) override;
  /// The host communicator's all_reduce_coalesced on the list with every device tensor replaced by
  /// its host copy (one message, as there).
  void all_reduce_coalesced(std::span<const Tensor> tensors, ReduceOp op = ReduceOp::Sum) override;
  void reduce_scatter(const Tensor& input, const Tensor& output) override;
  Request reduce_scatter_async(const Tensor& input, const Tensor& output) override;
  void all_gather(const Tensor& input, const Tensor& output) override;
  double all_reduce_scalar(double value, ReduceOp op = ReduceOp::Sum) override;
  void broadcast(const Tensor& tensor, int root) override;
  void broadcast_bytes(std::string& bytes, int root) override;
  std::vector<std::string> gather_bytes(const std::string& bytes, int root) override;
  std::vector<std::string> all_gather_bytes(const std::string& bytes) override;
  void barrier() override;
  /// host.group(ranks) (collective over this communicator) wrapped for the same backend; nullptr
  /// on ranks outside the group.
  std::unique_ptr<Communicator> group(std::span<const int> ranks) override;

  /// The communicator that carries the host copies.
  Communicator& host() const { return *host_; }
  Backend& backend() const { return backend_; }

 private:
  /// A device tensor and the host buffer whose contents it receives once the operation completes.
  struct CopyBack {
    Tensor device;
    Tensor host;
  };
  /// True when `tensor` is on the backend's device (staged), false for a host tensor of a GPU
  /// backend (passed as it is); throws for an undefined tensor or one on another device.
  bool staged(const Tensor& tensor, const char* operation) const;
  /// A host copy of `tensor` when it is staged (the caller synchronises before MPI reads it), else
  /// `tensor` itself.
  Tensor host_copy(const Tensor& tensor, const char* operation);
  /// A host buffer that receives into `tensor` when it is staged (recorded in `copy_back`), else
  /// `tensor` itself.
  Tensor host_target(const Tensor& tensor, const char* operation, std::vector<CopyBack>& copy_back);
  /// Copies every staged result into its device tensor on `backend`.
  static void finish(Backend& backend, const std::vector<CopyBack>& copy_back);
  /// A request that completes `inner`, then copies the results back.
  Request staged_request(Request inner, std::vector<CopyBack> copy_back);

  std::unique_ptr<Communicator> host_;
  Backend& backend_;
};

}  // namespace partrain::comm
