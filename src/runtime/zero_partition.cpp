#include "runtime/zero_partition.h"

#include <algorithm>

#include "core/error.h"
#include "core/shape.h"

namespace partrain::runtime {

ZeroPartition::ZeroPartition(std::vector<Tensor> parameters, comm::Communicator& group, Backend& backend,
                             std::vector<std::vector<std::size_t>> segments)
    : group_(group), backend_(backend), segments_(std::move(segments)) {
  for (const Tensor& parameter : parameters) {
    PARTRAIN_CHECK(parameter.defined() && parameter.dtype() == DType::F32, "ZeRO: parameters must be f32");
    shapes_.push_back(parameter.shape());
  }
  if (segments_.empty()) {
    segments_.emplace_back();
    for (std::size_t p = 0; p < shapes_.size(); ++p) segments_.back().push_back(p);
  }
  const std::int64_t ranks = group_.size(), rank = group_.rank();
  segment_of_.assign(shapes_.size(), segments_.size());
  offsets_.assign(shapes_.size(), 0);
  std::int64_t flat = 0;
  for (std::size_t k = 0; k < segments_.size(); ++k) {
    std::int64_t total = 0;
    for (std::size_t p : segments_[k]) {
      PARTRAIN_CHECK(p < shapes_.size() && segment_of_[p] == segments_.size(),
                     "ZeRO: segment " << k << " lists parameter " << p << " (of " << shapes_.size()
                                      << ") that is out of range or already in a segment");
      segment_of_[p] = k;
      offsets_[p] = total;
      total += numel(shapes_[p]);
    }
    const std::int64_t part = (total + ranks - 1) / ranks;  // the last rank's run is padded
    layout_.push_back({flat, part_size_, part});
    const std::int64_t first = part * rank, last = first + part;
    for (std::size_t p : segments_[k]) {
      const std::int64_t begin = std::max(first, offsets_[p]), end = std::min(last, offsets_[p] + numel(shapes_[p]));
      if (begin < end) pieces_.push_back({p, begin - offsets_[p], end - offsets_[p], part_size_ + begin - first});
    }
    flat += part * ranks;
    part_size_ += part;
  }
  for (std::size_t p = 0; p < shapes_.size(); ++p)
    PARTRAIN_CHECK(segment_of_[p] < segments_.size(), "ZeRO: parameter " << p << " is in no segment");
  gradients_ = backend_.zeros({flat});
  part_ = backend_.zeros({part_size_});
}

Tensor ZeroPartition::view(const Tensor& tensor, const Piece& piece) {
  return tensor.reshape({-1}).slice_rows(piece.begin, piece.end);
}

Tensor ZeroPartition::flat_view(const Tensor& buffer, std::size_t parameter) const {
  PARTRAIN_CHECK(parameter < shapes_.size(), "ZeRO: no parameter " << parameter);
  const std::int64_t begin = layout_[segment_of_[parameter]].flat_offset + offsets_[parameter];
  return buffer.slice_rows(begin, begin + numel(shapes_[parameter]));
}

Tensor ZeroPartition::gradient_view(std::size_t parameter) const {
  return flat_view(gradients_, parameter).reshape(shapes_[parameter]);
}

Tensor ZeroPartition::gathered_view(std::size_t parameter, DType dtype) const {
  return flat_view(gradients_.reinterpret(dtype), parameter).reshape(shapes_[parameter]);
}

comm::Request ZeroPartition::start_reduce_scatter(std::size_t segment) {
  PARTRAIN_CHECK(segment < layout_.size(), "ZeRO: no segment " << segment);
  const Segment& s = layout_[segment];
  return group_.reduce_scatter_async(gradients_.slice_rows(s.flat_offset, s.flat_offset + s.part * group_.size()),
                                     part_.slice_rows(s.part_offset, s.part_offset + s.part));
}

std::vector<Tensor> ZeroPartition::reduced_parts() const {
  std::vector<Tensor> result;
  for (const Piece& piece : pieces_) result.push_back(part_.slice_rows(piece.offset, piece.offset + piece.end - piece.begin));
  return result;
}

std::vector<Tensor> ZeroPartition::reduce_scatter(std::span<const Tensor> gradients) {
  PARTRAIN_CHECK(gradients.size() == shapes_.size(),
                 "ZeRO: " << gradients.size() << " gradients for " << shapes_.size() << " parameters");
  for (std::size_t p = 0; p < gradients.size(); ++p) {
    const Tensor target = gradient_view(p);
    if (gradients[p].raw_data() != target.raw_data()) backend_.copy(target, gradients[p].reshape(target.shape()));
  }
  for (std::size_t k = 0; k < layout_.size(); ++k) start_reduce_scatter(k).wait();
  return reduced_parts();
}

void ZeroPartition::all_gather(std::span<const Tensor> tensors) {
  PARTRAIN_CHECK(tensors.size() == shapes_.size(),
                 "ZeRO: " << tensors.size() << " tensors for " << shapes_.size() << " parameters");
  std::vector<Tensor> parts;
  for (const Piece& piece : pieces_) parts.push_back(view(tensors[piece.parameter], piece));
  all_gather_pieces(parts);
  for (std::size_t p = 0; p < tensors.size(); ++p) backend_.copy(tensors[p], gradient_view(p).reshape(tensors[p].shape()));
}

void ZeroPartition::all_gather_pieces(std::span<const Tensor> parts, DType dtype) {
  PARTRAIN_CHECK(parts.size() == pieces_.size(), "ZeRO: " << parts.size() << " parts for " << pieces_.size() << " pieces");
  // The flat gradient buffer is spent once the reduce-scatters are complete (the reduced sums are in
  // part_), and its layout is the gathered one: rank r's slot of segment k holds elements
  // [r·p_k, (r+1)·p_k). So this rank's elements go into its slots and each segment is all-gathered
  // in place there, as DeepSpeed and Megatron's distributed optimizer do, with no buffer of its own.
  // In bf16 or f16 the same element offsets index the buffer's bytes read as 16-bit elements.
  const Tensor buffer = gradients_.reinterpret(dtype);
  for (std::size_t k = 0; k < pieces_.size(); ++k) {
    const Piece& piece = pieces_[k];
    const Tensor slot = flat_view(buffer, piece.parameter).slice_rows(piece.begin, piece.end);
    const Tensor part = parts[k].reshape({piece.end - piece.begin});
    if (dtype == DType::F32) backend_.copy(slot, part);
    else backend_.convert(slot, part);
  }
  const std::int64_t ranks = group_.size(), rank = group_.rank();
  for (const Segment& s : layout_) {
    if (s.part == 0) continue;
    const Tensor whole = buffer.slice_rows(s.flat_offset, s.flat_offset + s.part * ranks);
    group_.all_gather(whole.slice_rows(rank * s.part, (rank + 1) * s.part), whole);
  }
}

}  // namespace partrain::runtime
