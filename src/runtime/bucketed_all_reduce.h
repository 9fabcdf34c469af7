#pragma once
// The overlapped, bucketed gradient all-reduce of a stage's data-parallel group (PyTorch DDP's
// reducer, Li et al., VLDB 2020, §3.2): the gradients live in one flat f32 buffer per bucket (DDP's
// gradient_as_bucket_view: no packing copies), the buckets follow the order in which the backward
// pass completes the gradients (runtime/gradient_buckets.h), and during the step's last backward
// each bucket's non-blocking all-reduce starts as soon as all its gradients are complete. Buckets
// start in bucket order, so every replica issues the same collectives in the same order. Under
// ZeRO-1 the buckets are the ZeroPartition's segments and each bucket's reduction is a
// reduce-scatter (each rank receives the sums of the elements it owns).
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "comm/communicator.h"
#include "core/backend.h"
#include "io/chrome_trace.h"
#include "runtime/gradient_buckets.h"
#include "runtime/zero_partition.h"

namespace partrain::runtime {

class BucketedAllReduce {
 public:
  /// Buckets of at most `limit_bytes` (f32 gradients: 4 bytes per element; one larger gradient is a
  /// bucket alone) over the parameters of `order` (gradient_completion_order of the stage's backward
  /// program), all-reduced (summed) over `group` (kept by reference). Each `gradients[parameter]`
  /// (f32 on `backend`'s device) is replaced by a view of its bucket's buffer with the same shape
  /// and values. Throws partrain::Error for a parameter without a gradient tensor or a non-f32 one.
  BucketedAllReduce(const std::vector<GradientCompletion>& order, std::unordered_map<int, Tensor>& gradients,
                    double limit_bytes, comm::Communicator& group, Backend& backend);

  /// ZeRO-1: the buckets are `zero`'s segments (kept by reference), reduce-scattered over its group;
  /// `parameters[i]` is the value id of the partition's parameter i and `order` their
  /// gradient_completion_order. Each `gradients[parameters[i]]` is replaced by zero.gradient_view(i)
  /// with the same values. Throws partrain::Error when the lists do not match.
  BucketedAllReduce(ZeroPartition& zero, const std::vector<int>& parameters,
                    const std::vector<GradientCompletion>& order, std::unordered_map<int, Tensor>& gradients,
                    Backend& backend);

  /// Number of buckets.
  std::size_t size() const { return buckets_.size(); }
  /// The parameters (value ids) of bucket `index`, in completion order.
  const std::vector<int>& bucket(std::size_t index) const { return buckets_.at(index).parameters; }

  /// Starts a step: a parameter's gradient is complete after `hand_overs` calls of gradient_ready
  /// (the loss pieces of the step's last backward: 1, or 2 under sub-pipelined TMP). Throws
  /// partrain::Error while a previous step's all-reduces are unfinished.
  void begin(int hand_overs);
  /// One hand-over of `parameter`'s gradient during the step's last backward (the interpreter's
  /// ExecutionOptions::on_parameter_gradient): starts, in bucket order, every bucket whose gradients
  /// are all complete, and polls those in flight (which also lets MPI progress them). Parameters of
  /// no bucket (tied ones) are ignored.
  void gradient_ready(int parameter);
  /// Starts the buckets not started yet, in order, and waits for all: then every gradient holds the
  /// sum over the group (under ZeRO-1: the partition's reduced parts hold this rank's sums). Appends
  /// one span per bucket to `trace` ("AllReduce bucket k" or "ReduceScatter bucket k", category
  /// "communication", track io::kGradientAllReduceTrack; microseconds since `clock_origin_us`).
  /// Collective over the group.
  void finish(std::int64_t step, double clock_origin_us, std::vector<io::TraceEvent>& trace);

 private:
  struct Bucket {
    std::vector<int> parameters;
    Tensor flat;              // the gradients, end to end (all-reduce; undefined under ZeRO-1)
    int hand_overs_left = 0;  // until every gradient of the bucket is complete
    comm::Request request;
    bool started = false;
    double start_us = 0, end_us = -1;  // end_us < 0: not seen complete yet
  };
  std::vector<Bucket> buckets_;
  std::unordered_map<int, std::size_t> bucket_of_;   // parameter -> bucket
  std::unordered_map<int, int> produced_;            // parameter -> 1 if the backward produces it, else 0
  comm::Communicator* group_ = nullptr;              // all-reduce over it, or
  ZeroPartition* zero_ = nullptr;                    // reduce-scatter of its segments
  std::size_t next_ = 0;                             // the first bucket not started
  void start_ready();
  void poll();
};

}  // namespace partrain::runtime
