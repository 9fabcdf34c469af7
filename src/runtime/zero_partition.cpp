#include "runtime/zero_partition.h"

#include <algorithm>

#include "core/error.h"

namespace partrain::runtime {

ZeroPartition::ZeroPartition(std::vector<Tensor> parameters, comm::Communicator& group, Backend& backend)
    : parameters_(std::move(parameters)), group_(group), backend_(backend) {
  std::int64_t total = 0;
  for (const Tensor& parameter : parameters_) {
    PARTRAIN_CHECK(parameter.defined() && parameter.dtype() == DType::F32, "ZeRO: parameters must be f32");
    offsets_.push_back(total);
    total += parameter.numel();
  }
  const std::int64_t ranks = group_.size();
  part_size_ = (total + ranks - 1) / ranks;  // the last part is padded
  const std::int64_t first = part_size_ * group_.rank(), last = first + part_size_;
  for (std::size_t p = 0; p < parameters_.size(); ++p) {
    const std::int64_t begin = std::max(first, offsets_[p]), end = std::min(last, offsets_[p] + parameters_[p].numel());
    if (begin < end) pieces_.push_back({p, begin - offsets_[p], end - offsets_[p], begin - first});
  }
  flat_ = backend_.zeros({part_size_ * ranks});
  part_ = backend_.zeros({part_size_});
}

Tensor ZeroPartition::view(const Tensor& tensor, const Piece& piece) {
  return tensor.reshape({-1}).slice_rows(piece.begin, piece.end);
}

std::vector<Tensor> ZeroPartition::reduce_scatter(std::span<const Tensor> gradients) {
  PARTRAIN_CHECK(gradients.size() == parameters_.size(),
                 "ZeRO: " << gradients.size() << " gradients for " << parameters_.size() << " parameters");
  for (std::size_t p = 0; p < gradients.size(); ++p)
    backend_.copy(flat_.slice_rows(offsets_[p], offsets_[p] + gradients[p].numel()), gradients[p].reshape({-1}));
  group_.reduce_scatter(flat_, part_);
  std::vector<Tensor> result;
  for (const Piece& piece : pieces_)
    result.push_back(part_.slice_rows(piece.offset, piece.offset + piece.end - piece.begin));
  return result;
}

void ZeroPartition::all_gather(std::span<const Tensor> tensors) {
  PARTRAIN_CHECK(tensors.size() == parameters_.size(),
                 "ZeRO: " << tensors.size() << " tensors for " << parameters_.size() << " parameters");
  for (const Piece& piece : pieces_)
    backend_.copy(part_.slice_rows(piece.offset, piece.offset + piece.end - piece.begin), view(tensors[piece.parameter], piece));
  group_.all_gather(part_, flat_);
  for (std::size_t p = 0; p < tensors.size(); ++p)
    backend_.copy(tensors[p].reshape({-1}), flat_.slice_rows(offsets_[p], offsets_[p] + tensors[p].numel()));
}

}  // namespace partrain::runtime
