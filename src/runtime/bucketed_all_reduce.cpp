#include "runtime/bucketed_all_reduce.h"

#include <chrono>
#include <string>

#include "core/error.h"

namespace partrain::runtime {
namespace {
double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

BucketedAllReduce::BucketedAllReduce(const std::vector<GradientCompletion>& order,
                                     std::unordered_map<int, Tensor>& gradients, double limit_bytes,
                                     comm::Communicator& group, Backend& backend)
    : group_(&group) {
  std::vector<std::int64_t> bytes;
  for (const GradientCompletion& completion : order) {
    auto found = gradients.find(completion.parameter);
    PARTRAIN_CHECK(found != gradients.end() && found->second.defined() && found->second.dtype() == DType::F32,
                   "bucketed all-reduce: parameter " << completion.parameter << " has no f32 gradient tensor");
    bytes.push_back(static_cast<std::int64_t>(found->second.nbytes()));
    produced_[completion.parameter] = completion.last_step >= 0 ? 1 : 0;
  }
  for (const std::vector<std::size_t>& indices : assign_buckets(bytes, limit_bytes)) {
    Bucket bucket;
    std::int64_t total = 0;
    for (std::size_t i : indices) total += gradients.at(order[i].parameter).numel();
    bucket.flat = backend.zeros({total});
    std::int64_t offset = 0;
    for (std::size_t i : indices) {
      const int parameter = order[i].parameter;
      Tensor& gradient = gradients.at(parameter);
      const std::int64_t n = gradient.numel();
      Tensor view = bucket.flat.slice_rows(offset, offset + n).reshape(gradient.shape());
      backend.copy(view, gradient);
      gradient = view;  // the backward accumulates straight into the bucket
      offset += n;
      bucket.parameters.push_back(parameter);
      bucket_of_[parameter] = buckets_.size();
    }
    buckets_.push_back(std::move(bucket));
  }
}

BucketedAllReduce::BucketedAllReduce(ZeroPartition& zero, const std::vector<int>& parameters,
                                     const std::vector<GradientCompletion>& order,
                                     std::unordered_map<int, Tensor>& gradients, Backend& backend)
    : zero_(&zero) {
  PARTRAIN_CHECK(order.size() == parameters.size(), "bucketed reduce-scatter: " << order.size() << " completions for "
                                                                                << parameters.size() << " parameters");
  for (const GradientCompletion& completion : order) produced_[completion.parameter] = completion.last_step >= 0 ? 1 : 0;
  for (const std::vector<std::size_t>& segment : zero.segments()) {
    Bucket bucket;
    for (std::size_t i : segment) {
      const int parameter = parameters.at(i);
      PARTRAIN_CHECK(produced_.count(parameter), "bucketed reduce-scatter: parameter " << parameter << " has no completion");
      Tensor& gradient = gradients.at(parameter);
      const Tensor view = zero.gradient_view(i);
      backend.copy(view, gradient);
      gradient = view;
      bucket.parameters.push_back(parameter);
      bucket_of_[parameter] = buckets_.size();
    }
    buckets_.push_back(std::move(bucket));
  }
}

void BucketedAllReduce::begin(int hand_overs) {
  for (const Bucket& bucket : buckets_)
    PARTRAIN_CHECK(!bucket.started, "bucketed all-reduce: a step began before the last one's all-reduces finished");
  for (Bucket& bucket : buckets_) {
    bucket.hand_overs_left = 0;
    for (int parameter : bucket.parameters) bucket.hand_overs_left += produced_.at(parameter) * hand_overs;
    bucket.end_us = -1;
  }
  next_ = 0;
}

void BucketedAllReduce::gradient_ready(int parameter) {
  auto found = bucket_of_.find(parameter);
  if (found == bucket_of_.end()) return;
  Bucket& bucket = buckets_[found->second];
  PARTRAIN_CHECK(bucket.hand_overs_left > 0, "bucketed all-reduce: more gradient hand-overs of parameter "
                                                 << parameter << " than the backward produces");
  --bucket.hand_overs_left;
  start_ready();
  poll();
}

void BucketedAllReduce::start_ready() {
  while (next_ < buckets_.size() && buckets_[next_].hand_overs_left == 0) {
    Bucket& bucket = buckets_[next_++];
    bucket.start_us = now_us();
    bucket.request = zero_ ? zero_->start_reduce_scatter(next_ - 1) : group_->all_reduce_async(bucket.flat);
    bucket.started = true;
  }
}

void BucketedAllReduce::poll() {
  for (std::size_t b = 0; b < next_; ++b) {
    Bucket& bucket = buckets_[b];
    if (bucket.end_us < 0 && bucket.request.test()) bucket.end_us = now_us();
  }
}

void BucketedAllReduce::finish(std::int64_t step, double clock_origin_us, std::vector<io::TraceEvent>& trace) {
  // Buckets whose gradients were not all handed over (none in a normal step) start now, in order.
  for (Bucket& bucket : buckets_) bucket.hand_overs_left = 0;
  start_ready();
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    bucket.request.wait();
    if (bucket.end_us < 0) bucket.end_us = now_us();
    bucket.started = false;
    trace.push_back({(zero_ ? "ReduceScatter bucket " : "AllReduce bucket ") + std::to_string(b), "communication", bucket.start_us - clock_origin_us,
                     bucket.end_us - bucket.start_us, step, io::kGradientAllReduceTrack});
  }
}

}  // namespace partrain::runtime
