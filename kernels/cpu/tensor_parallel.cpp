// CPU kernels of the tensor-parallel communication ops (graph/ops/tensor_parallel.cpp): the
// all-reduces, all-gathers and reduce-scatters go through the KernelContext's TensorParallelGroup.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_common.h"

namespace partrain {

namespace {
using cpu::kParallelThreshold;

TensorParallelGroup& group_of(const KernelContext& context) {
  PARTRAIN_CHECK(context.tensor_parallel != nullptr,
                 "a tensor-parallel op ran without a tensor-parallel group (a graph transformed for t > 1 on one rank?)");
  return *context.tensor_parallel;
}

void copy_tensor(const Tensor& destination, const Tensor& source) {
  std::memcpy(destination.raw_data(), source.raw_data(), source.nbytes());
}

// ---------------- TensorParallelCopy (f) and TensorParallelAllReduce (g) ----------------
void copy_forward(const KernelContext&, std::span<const Tensor> in, std::span<const Tensor> out) { copy_tensor(out[0], in[0]); }
void copy_backward(const KernelContext& context, std::span<const Tensor>, std::span<const Tensor>,
                   std::span<const Tensor> dout, std::span<const Tensor> din) {
  if (!din[0].defined()) return;
  copy_tensor(din[0], dout[0]);
  group_of(context).all_reduce_deferrable(din[0]);
}
void all_reduce_forward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out) {
  copy_tensor(out[0], in[0]);
  group_of(context).all_reduce_deferrable(out[0]);
}
void all_reduce_backward(const KernelContext&, std::span<const Tensor>, std::span<const Tensor>,
                         std::span<const Tensor> dout, std::span<const Tensor> din) {
  if (din[0].defined()) copy_tensor(din[0], dout[0]);
}

// ---------------- sequence parallelism ----------------
// The group's collectives lay the ranks' parts out one after another ([parts, outer, chunk]); the
// tensors are [outer, parts, chunk] (graph/ops/tensor_parallel.cpp): staged through a buffer when
// outer > 1.
using kernels::SequenceSplit;

// Copies `chunk` elements for every (outer o, rank r) between [parts, outer, chunk] (`grouped`) and
// [outer, parts, chunk] (`interleaved`); `to_grouped` says which way.
void regroup(float* grouped, float* interleaved, const SequenceSplit& split, bool to_grouped) {
  const std::size_t bytes = static_cast<std::size_t>(split.chunk) * sizeof(float);
#pragma omp parallel for collapse(2) schedule(static) if (split.outer * split.parts * split.chunk > kParallelThreshold)
  for (std::int64_t o = 0; o < split.outer; ++o)
    for (int r = 0; r < split.parts; ++r) {
      float* in_group = grouped + (static_cast<std::int64_t>(r) * split.outer + o) * split.chunk;
      float* in_place = interleaved + (o * split.parts + r) * split.chunk;
      if (to_grouped) {
        std::memcpy(in_group, in_place, bytes);
      } else {
        std::memcpy(in_place, in_group, bytes);
      }
    }
}

// whole = the parts of every rank, gathered along the axis.
void gather_parts(const KernelContext& context, const Tensor& part, const Tensor& whole, const char* op) {
  const SequenceSplit split = kernels::sequence_split(context, part, whole, op);
  TensorParallelGroup& group = group_of(context);
  if (split.outer == 1) return group.all_gather(part, whole);
  const Tensor staging = Tensor::empty({whole.numel()}, DType::F32);
  group.all_gather(part, staging);
  regroup(staging.data<float>(), whole.data<float>(), split, false);
}

// part = the rank's part of the sum over the group of every rank's `whole`.
void reduce_scatter_parts(const KernelContext& context, const Tensor& whole, const Tensor& part, const char* op) {
  const SequenceSplit split = kernels::sequence_split(context, part, whole, op);
  TensorParallelGroup& group = group_of(context);
  if (split.outer == 1) return group.reduce_scatter(whole, part);
  const Tensor staging = Tensor::empty({whole.numel()}, DType::F32);
  regroup(staging.data<float>(), whole.data<float>(), split, true);
  group.reduce_scatter(staging, part);
}

// part = the rank's part of `whole` (no communication).
void take_part(const KernelContext& context, const Tensor& whole, const Tensor& part, const char* op) {
  const SequenceSplit split = kernels::sequence_split(context, part, whole, op);
  const std::size_t bytes = static_cast<std::size_t>(split.chunk) * dtype_size(part.dtype());
  const char* source = static_cast<const char*>(whole.raw_data());
  char* destination = static_cast<char*>(part.raw_data());
  for (std::int64_t o = 0; o < split.outer; ++o)
    std::memcpy(destination + static_cast<std::size_t>(o) * bytes,
                source + static_cast<std::size_t>(o * split.parts + split.rank) * bytes, bytes);
}

void sequence_all_gather_forward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out) {
  gather_parts(context, in[0], out[0], "SequenceParallelAllGather");
}
void sequence_all_gather_backward(const KernelContext& context, std::span<const Tensor>, std::span<const Tensor>,
                                  std::span<const Tensor> dout, std::span<const Tensor> din) {
  if (din[0].defined()) reduce_scatter_parts(context, dout[0], din[0], "SequenceParallelAllGather backward");
}
void sequence_reduce_scatter_forward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out) {
  reduce_scatter_parts(context, in[0], out[0], "SequenceParallelReduceScatter");
}
void sequence_reduce_scatter_backward(const KernelContext& context, std::span<const Tensor>, std::span<const Tensor>,
                                      std::span<const Tensor> dout, std::span<const Tensor> din) {
  if (din[0].defined()) gather_parts(context, dout[0], din[0], "SequenceParallelReduceScatter backward");
}
void sequence_scatter_forward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out) {
  take_part(context, in[0], out[0], "SequenceParallelScatter");
}
void sequence_scatter_backward(const KernelContext& context, std::span<const Tensor>, std::span<const Tensor>,
                               std::span<const Tensor> dout, std::span<const Tensor> din) {
  if (din[0].defined()) gather_parts(context, dout[0], din[0], "SequenceParallelScatter backward");
}
void sequence_gather_forward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out) {
  gather_parts(context, in[0], out[0], "SequenceParallelGather");
}
void sequence_gather_backward(const KernelContext& context, std::span<const Tensor>, std::span<const Tensor>,
                              std::span<const Tensor> dout, std::span<const Tensor> din) {
  if (din[0].defined()) take_part(context, dout[0], din[0], "SequenceParallelGather backward");
}

// ---------------- VocabParallelEmbedding ----------------
// The rank's vocabulary rows are [first, first + rows); every index must lie in [0, vocabulary)
// (rows · t less the vocabulary padding).
std::int64_t first_row(const KernelContext& context, const Tensor& table, const Tensor& indices) {
  TensorParallelGroup& group = group_of(context);
  const std::int64_t vocabulary =
      kernels::vocabulary_part(context.attributes, table.dim(0), group.rank(), group.size(), "VocabParallelEmbedding").vocabulary;
  for (std::int64_t i = 0; i < indices.numel(); ++i) {
    const std::int64_t index = cpu::index_at(indices, i);
    PARTRAIN_CHECK(index >= 0 && index < vocabulary, "VocabParallelEmbedding index " << index << " at position "
                                                                                     << kernels::position_string(i, indices.shape())
                                                                                     << " is out of range [0, " << vocabulary << ")");
  }
  return table.dim(0) * group.rank();
}

void embedding_forward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out) {
  const Tensor& table = in[0];
  const Tensor& indices = in[1];
  const std::int64_t first = first_row(context, table, indices), rows = table.dim(0);
  const std::size_t row_bytes = static_cast<std::size_t>(table.dim(1)) * dtype_size(table.dtype());
  const char* source = static_cast<const char*>(table.raw_data());
  char* y = static_cast<char*>(out[0].raw_data());
  const std::int64_t n = indices.numel();
#pragma omp parallel for schedule(static) if (out[0].numel() > kParallelThreshold)
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t row = cpu::index_at(indices, i) - first;
    if (row >= 0 && row < rows) {
      std::memcpy(y + i * row_bytes, source + row * row_bytes, row_bytes);
    } else {
      std::memset(y + i * row_bytes, 0, row_bytes);  // another rank's row: its part of the sum is 0
    }
  }
}

void embedding_backward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor>,
                        std::span<const Tensor> dout, std::span<const Tensor> din) {
  const Tensor& dtable = din[0];
  if (!dtable.defined()) return;
  PARTRAIN_CHECK(dtable.dtype() == DType::F32 && dout[0].dtype() == DType::F32,
                 "VocabParallelEmbedding backward supports f32 gradients only");
  const Tensor& indices = in[1];
  const std::int64_t first = first_row(context, in[0], indices), rows = dtable.dim(0), hidden = dtable.dim(1);
  dtable.zero();
  const float* dy = dout[0].data<float>();
  float* dw = dtable.data<float>();
  // Positions in order, so repeated indices add in the same order as the one-device Gather.
  for (std::int64_t i = 0; i < indices.numel(); ++i) {
    const std::int64_t row = cpu::index_at(indices, i) - first;
    if (row < 0 || row >= rows) continue;
    float* target = dw + row * hidden;
    const float* source = dy + i * hidden;
    for (std::int64_t h = 0; h < hidden; ++h) target[h] += source[h];
  }
}

// ---------------- VocabParallelCrossEntropy ----------------
struct CrossEntropyRows {
  std::int64_t classes = 0;  // the rank's classes
  std::int64_t real = 0;     // of those, the first `real` are not vocabulary padding (the rest take no part)
  std::int64_t rows = 0;
  std::int64_t first = 0;    // the rank's first class
  std::int64_t ignore_index = -100;
  std::int64_t counted = 0;  // rows whose label is not ignore_index
};

CrossEntropyRows cross_entropy_rows(const KernelContext& context, const Tensor& logits, const Tensor& labels) {
  TensorParallelGroup& group = group_of(context);
  CrossEntropyRows dims;
  dims.classes = logits.dim(logits.rank() - 1);
  dims.rows = labels.numel();
  const kernels::VocabularyPart part =
      kernels::vocabulary_part(context.attributes, dims.classes, group.rank(), group.size(), "VocabParallelCrossEntropy");
  dims.first = part.first;
  dims.real = part.real;
  dims.ignore_index = context.attributes.get_int("ignore_index", -100);
  const std::int64_t all_classes = part.vocabulary;
  for (std::int64_t r = 0; r < dims.rows; ++r) {
    const std::int64_t label = cpu::index_at(labels, r);
    if (label == dims.ignore_index) continue;
    PARTRAIN_CHECK(label >= 0 && label < all_classes, "VocabParallelCrossEntropy label " << label << " at position "
                                                                                         << kernels::position_string(r, labels.shape())
                                                                                         << " is outside [0, " << all_classes
                                                                                         << ") and is not ignore_index");
    ++dims.counted;
  }
  return dims;
}

void vocab_cross_entropy_forward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out) {
  const Tensor& logits = in[0];
  const Tensor& labels = in[1];
  const CrossEntropyRows dims = cross_entropy_rows(context, logits, labels);
  TensorParallelGroup& group = group_of(context);
  const float* z = logits.data<float>();
  Tensor maximum = Tensor::empty({dims.rows}), sum = Tensor::empty({dims.rows}), target = Tensor::zeros({dims.rows});
  float* pm = maximum.data<float>();
  float* ps = sum.data<float>();
  float* pt = target.data<float>();
#pragma omp parallel for schedule(static) if (logits.numel() > kParallelThreshold)
  for (std::int64_t r = 0; r < dims.rows; ++r) {
    const float* row = z + r * dims.classes;
    pm[r] = dims.real > 0 ? *std::max_element(row, row + dims.real) : -std::numeric_limits<float>::infinity();
    const std::int64_t label = cpu::index_at(labels, r) - dims.first;
    if (label >= 0 && label < dims.real) pt[r] = row[label];
  }
  group.all_reduce(maximum, TensorParallelGroup::Reduction::Max);
#pragma omp parallel for schedule(static) if (logits.numel() > kParallelThreshold)
  for (std::int64_t r = 0; r < dims.rows; ++r) {
    const float* row = z + r * dims.classes;
    double total = 0;
    for (std::int64_t j = 0; j < dims.real; ++j) total += std::exp(row[j] - pm[r]);
    ps[r] = static_cast<float>(total);
  }
  group.all_reduce(sum, TensorParallelGroup::Reduction::Sum);
  group.all_reduce(target, TensorParallelGroup::Reduction::Sum);
  float* log_sum_exp = out[1].data<float>();
  double total = 0;
  for (std::int64_t r = 0; r < dims.rows; ++r) {
    if (cpu::index_at(labels, r) == dims.ignore_index) {
      log_sum_exp[r] = 0.f;
      continue;
    }
    const double value = std::log(static_cast<double>(ps[r])) + pm[r];
    log_sum_exp[r] = static_cast<float>(value);
    total += value - pt[r];
  }
  out[0].data<float>()[0] = dims.counted > 0 ? static_cast<float>(total / static_cast<double>(dims.counted)) : 0.f;
}

void vocab_cross_entropy_backward(const KernelContext& context, std::span<const Tensor> in, std::span<const Tensor> out,
                                  std::span<const Tensor> dout, std::span<const Tensor> din) {
  if (din[1].defined()) din[1].zero();  // labels have no gradient
  if (!din[0].defined()) return;
  const Tensor& logits = in[0];
  const Tensor& labels = in[1];
  const CrossEntropyRows dims = cross_entropy_rows(context, logits, labels);
  const float scale = dims.counted > 0 ? static_cast<float>(double(dout[0].data<float>()[0]) / double(dims.counted)) : 0.f;
  const float* z = logits.data<float>();
  const float* log_sum_exp = out[1].data<float>();
  float* dz = din[0].data<float>();
#pragma omp parallel for schedule(static) if (logits.numel() > kParallelThreshold)
  for (std::int64_t r = 0; r < dims.rows; ++r) {
    float* row = dz + r * dims.classes;
    const std::int64_t label = cpu::index_at(labels, r);
    if (label == dims.ignore_index) {
      std::fill(row, row + dims.classes, 0.f);
      continue;
    }
    const float* logit = z + r * dims.classes;
    for (std::int64_t j = 0; j < dims.real; ++j) row[j] = std::exp(logit[j] - log_sum_exp[r]) * scale;
    std::fill(row + dims.real, row + dims.classes, 0.f);  // vocabulary padding: no part in the loss
    if (label - dims.first >= 0 && label - dims.first < dims.real) row[label - dims.first] -= scale;
  }
}
}  // namespace

void register_cpu_tensor_parallel_kernels(Backend& backend) {
  backend.set_kernels(OpType::TensorParallelCopy, {copy_forward, copy_backward});
  backend.set_kernels(OpType::TensorParallelAllReduce, {all_reduce_forward, all_reduce_backward});
  backend.set_kernels(OpType::VocabParallelEmbedding, {embedding_forward, embedding_backward});
  backend.set_kernels(OpType::VocabParallelCrossEntropy, {vocab_cross_entropy_forward, vocab_cross_entropy_backward});
  backend.set_kernels(OpType::SequenceParallelAllGather, {sequence_all_gather_forward, sequence_all_gather_backward});
  backend.set_kernels(OpType::SequenceParallelReduceScatter,
                      {sequence_reduce_scatter_forward, sequence_reduce_scatter_backward});
  backend.set_kernels(OpType::SequenceParallelScatter, {sequence_scatter_forward, sequence_scatter_backward});
  backend.set_kernels(OpType::SequenceParallelGather, {sequence_gather_forward, sequence_gather_backward});
}

}  // namespace partrain
