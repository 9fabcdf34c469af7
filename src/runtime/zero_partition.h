#pragma once
// ZeRO stage 1 (Rajbhandari et al., SC'20, §5.1 "Optimizer State Partitioning"; DESIGN.md
// "Parallelism in three dimensions") over one stage's data-parallel group of D ranks. The stage's
// parameters are laid end to end in one flat f32 order of N elements, padded to a multiple of D;
// rank r owns elements [r·N/D, (r+1)·N/D) and keeps the optimizer state of those elements only.
// A step: the gradients are reduce-scattered (each rank receives the sum of its elements), each rank
// updates its elements of the f32 master parameters, and the group all-gathers the parameters —
// the same communication volume as one all-reduce.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/backend.h"

namespace partrain::runtime {

class ZeroPartition {
 public:
  /// A contiguous run of one parameter's elements inside this rank's part.
  struct Piece {
    std::size_t parameter = 0;  // index into the constructor's list
    std::int64_t begin = 0;     // the run is elements [begin, end) of the flattened parameter
    std::int64_t end = 0;
    std::int64_t offset = 0;    // where the run starts inside this rank's part
  };

  /// `parameters` (f32 on `backend`'s device, in a fixed order every member passes alike) are
  /// partitioned over `group` (the stage's data-parallel group; kept by reference).
  ZeroPartition(std::vector<Tensor> parameters, comm::Communicator& group, Backend& backend);

  /// This rank's runs of parameter elements, in flat order.
  const std::vector<Piece>& pieces() const { return pieces_; }
  /// Elements each rank owns (N/D, padding included).
  std::int64_t part_size() const { return part_size_; }

  /// `tensor` (shaped like parameter `piece.parameter`) restricted to the piece's elements: a 1-D
  /// view sharing its storage.
  static Tensor view(const Tensor& tensor, const Piece& piece);

  /// Sums `gradients` (one per parameter, in the constructor's order) over the group and returns this
  /// rank's part: one 1-D tensor per piece (views into an owned buffer, valid until the next call).
  /// Collective over the group.
  std::vector<Tensor> reduce_scatter(std::span<const Tensor> gradients);

  /// Every rank's updated elements of `tensors` (one per parameter, shaped like it: the parameters
  /// after the update, or an optimizer state laid out like them) copied to every rank, in place.
  /// Collective over the group.
  void all_gather(std::span<const Tensor> tensors);

 private:
  std::vector<Tensor> parameters_;
  comm::Communicator& group_;
  Backend& backend_;
  std::int64_t part_size_ = 0;
  std::vector<Piece> pieces_;
  std::vector<std::int64_t> offsets_;  // flat start of each parameter
  Tensor flat_;                        // D × part_size elements (gradients, then gathered values)
  Tensor part_;                        // part_size elements
};

}  // namespace partrain::runtime
