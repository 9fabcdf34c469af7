#pragma once
// ZeRO stage 1 (Rajbhandari et al., SC'20, §5.1 "Optimizer State Partitioning"; docs/parallelism.md
// §ZeRO-1) over one stage's data-parallel group of D ranks. The stage's
// parameters are grouped into segments (the gradient buckets of the overlapped reduction, or one
// segment of all of them); each segment's parameters are laid end to end in one flat f32 run of
// N_k elements, padded to D·p_k (p_k = ⌈N_k / D⌉), and rank r owns elements [r·p_k, (r+1)·p_k) of
// every segment and keeps the optimizer state of those elements only. A step: the gradients are
// reduce-scattered segment by segment (each rank receives the sums of its elements; a segment's
// reduce-scatter can start as soon as its gradients are complete), each rank updates its elements
// of the f32 master parameters, and the group all-gathers the parameters — the same communication
// volume as one all-reduce. A parameter lies in one segment, so each rank holds at most one
// contiguous run (piece) of each parameter.
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

  /// `parameters` (f32 on `backend`'s device, in a fixed order every member passes alike; only their
  /// shapes are kept) are partitioned over `group` (the stage's data-parallel group; kept by reference), segment by
  /// segment: `segments` lists indices into `parameters`, each exactly once (empty: one segment of
  /// all, in order). Throws partrain::Error for a non-f32 parameter or segments that do not cover
  /// every parameter exactly once.
  ZeroPartition(std::vector<Tensor> parameters, comm::Communicator& group, Backend& backend,
                std::vector<std::vector<std::size_t>> segments = {});

  /// This rank's runs of parameter elements, segment by segment.
  const std::vector<Piece>& pieces() const { return pieces_; }
  /// Elements each rank owns (Σ p_k, padding included).
  std::int64_t part_size() const { return part_size_; }
  /// The segments (indices into the constructor's list).
  const std::vector<std::vector<std::size_t>>& segments() const { return segments_; }

  /// `tensor` (shaped like parameter `piece.parameter`) restricted to the piece's elements: a 1-D
  /// view sharing its storage.
  static Tensor view(const Tensor& tensor, const Piece& piece);

  /// Parameter `parameter`'s gradient inside the partition's flat gradient buffer: a view shaped
  /// like the parameter. Accumulating into these views makes reduce-scatters need no packing copy.
  Tensor gradient_view(std::size_t parameter) const;

  /// Starts the reduce-scatter (sum over the group) of segment `segment`'s gradients as they are in
  /// the gradient views; this rank's sums land in its part (see reduced_parts). Collective over the
  /// group, segments in the same order on every member.
  comm::Request start_reduce_scatter(std::size_t segment);
  /// This rank's part after every segment's reduce-scatter completed: one 1-D tensor per piece
  /// (views into an owned buffer, valid until the next reduction).
  std::vector<Tensor> reduced_parts() const;

  /// Sums `gradients` (one per parameter, in the constructor's order; copied into the gradient
  /// views unless they are those views) over the group, every segment, and returns reduced_parts().
  /// Collective over the group.
  std::vector<Tensor> reduce_scatter(std::span<const Tensor> gradients);

  /// Every rank's updated elements of `tensors` (one per parameter, shaped like it: the parameters
  /// after the update, or an optimizer state laid out like them) copied to every rank, in place.
  /// Gathers through the flat gradient buffer, so the gradient views hold no gradients afterwards
  /// (the reduced sums of reduced_parts() are kept apart and stay valid). Collective over the group.
  void all_gather(std::span<const Tensor> tensors);

  /// The same from this rank's elements alone: `parts` holds one 1-D f32 tensor per piece of
  /// pieces(), in order (e.g. the rank's shard of the f32 master parameters, which it alone keeps
  /// under Megatron-LM's distributed optimizer), gathered as `dtype`: f32, or bf16/f16 (the parts
  /// rounded first, as the working copies are: half the bytes, as Megatron-LM gathers its bf16
  /// parameters). Afterwards gathered_view(p, dtype) holds parameter p whole, until gradients are
  /// accumulated in the buffer again. Collective over the group.
  void all_gather_pieces(std::span<const Tensor> parts, DType dtype = DType::F32);
  /// Parameter `parameter` as the last all_gather_pieces in `dtype` left it: a view into the flat
  /// gradient buffer (reused: its first half holds the bf16 or f16 elements), shaped like the parameter.
  Tensor gathered_view(std::size_t parameter, DType dtype) const;

 private:
  struct Segment {
    std::int64_t flat_offset = 0;  // where its D·p_k elements start in gradients_
    std::int64_t part_offset = 0;  // where its p_k elements start in part_
    std::int64_t part = 0;         // p_k
  };
  std::vector<Shape> shapes_;  // the parameters' shapes (their storage is not kept)
  comm::Communicator& group_;
  Backend& backend_;
  std::vector<std::vector<std::size_t>> segments_;
  std::vector<Segment> layout_;
  std::int64_t part_size_ = 0;
  std::vector<Piece> pieces_;
  std::vector<std::size_t> segment_of_;  // per parameter
  std::vector<std::int64_t> offsets_;    // per parameter: where it starts inside its segment
  // The flat run of parameter `parameter` in `buffer` (gradients_ or a reinterpretation of it).
  Tensor flat_view(const Tensor& buffer, std::size_t parameter) const;
  Tensor gradients_;                     // Σ D·p_k elements: the gradients, segment by segment
  Tensor part_;                          // part_size elements: this rank's reduced gradient sums
};

}  // namespace partrain::runtime
