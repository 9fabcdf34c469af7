#pragma once
// The tensor-parallel group a kernel runs in (Megatron-LM, Shoeybi et al. 2019 §3): the ops that a
// tensor-parallel graph transformation inserts (graph/tensor_parallel.h) — the conjugate f / g
// all-reduces, the vocabulary-parallel embedding and cross-entropy, dropout on a split tensor, and
// sequence parallelism's all-gathers and reduce-scatters (Korthikanti et al. 2022 §4.2.2) — need
// the rank's position in its group and collectives over it. The runtime implements it over its
// communicator; core/ knows nothing of MPI or NCCL.
#include <functional>

#include "core/tensor.h"

namespace partrain {

class TensorParallelGroup {
 public:
  enum class Reduction { Sum, Max };
  virtual ~TensorParallelGroup() = default;
  /// This rank's position in the group, in [0, size()).
  virtual int rank() const = 0;
  /// Ranks in the group (the tensor-parallel degree t).
  virtual int size() const = 0;
  /// Reduces `tensor` (on the kernel's device, f32) element-wise over the group, in place; every
  /// rank gets the result. Collective: every rank of the group calls it in the same order.
  virtual void all_reduce(const Tensor& tensor, Reduction reduction) = 0;
  /// All-gather: rank r's `input` (f32, n elements, on the kernel's device) lands at elements
  /// [r·n, (r+1)·n) of `output` (f32, size() × n elements) on every rank. Collective.
  virtual void all_gather(const Tensor& input, const Tensor& output) = 0;
  /// Reduce-scatter: `input` (f32, size() × n elements) is summed element-wise over the group and
  /// rank r receives elements [r·n, (r+1)·n) of the sum in `output` (f32, n elements). Collective.
  virtual void reduce_scatter(const Tensor& input, const Tensor& output) = 0;
  /// Starts a sum all-reduce of `tensor` and returns the function that completes it (the result is
  /// in `tensor` once it returned). Default: all_reduce now, nothing left to complete.
  virtual std::function<void()> start_all_reduce(const Tensor& tensor) {
    all_reduce(tensor, Reduction::Sum);
    return [] {};
  }
  /// A sum all-reduce whose result only later tasks read (Megatron's f and g): under Merak's
  /// sub-pipelined TMP the interpreter's group starts it and completes it before the next task of
  /// the same sub-microbatch runs, so the other sub-microbatch computes meanwhile. Default: blocking.
  virtual void all_reduce_deferrable(const Tensor& tensor) { all_reduce(tensor, Reduction::Sum); }
  /// True when the collectives on device tensors are ordered after the device work the caller
  /// queued before the call, and the work queued after them sees their result (stream-ordered, as
  /// NCCL over the CUDA backend): then GPU kernels need not wait for the device before calling.
  /// Default false: the caller waits first (an implementation may stage through host memory).
  virtual bool orders_device_work() const { return false; }
};

}  // namespace partrain
