#pragma once
// The tensor-parallel group of the kernels (core/tensor_parallel_group.h) over a Communicator: the
// MPI communicator for host tensors, NCCL for GPU tensors.
#include <memory>

#include "comm/communicator.h"
#include "core/tensor_parallel_group.h"

namespace partrain::comm {

class CommunicatorTensorParallelGroup final : public TensorParallelGroup {
 public:
  /// `group` holds the ranks of one tensor-parallel group in tensor-parallel rank order; it must
  /// outlive this object.
  explicit CommunicatorTensorParallelGroup(Communicator& group) : group_(group) {}
  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  void all_reduce(const Tensor& tensor, Reduction reduction) override {
    group_.all_reduce(tensor, reduction == Reduction::Max ? ReduceOp::Max : ReduceOp::Sum);
  }
  void all_gather(const Tensor& input, const Tensor& output) override { group_.all_gather(input, output); }
  void reduce_scatter(const Tensor& input, const Tensor& output) override { group_.reduce_scatter(input, output); }
  std::function<void()> start_all_reduce(const Tensor& tensor) override {
    auto request = std::make_shared<Request>(group_.all_reduce_async(tensor, ReduceOp::Sum));
    return [request] { request->wait(); };
  }
  bool orders_device_work() const override { return group_.orders_device_work(); }

 private:
  Communicator& group_;
};

}  // namespace partrain::comm
