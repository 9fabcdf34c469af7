#pragma once
// Tensor shapes. A graph-level shape may contain kBatch, the symbolic batch dimension, which is
// replaced by a concrete per-replica microbatch size when a subgraph is instantiated.
#include <cstdint>
#include <string>
#include <vector>

namespace partrain {

using Shape = std::vector<std::int64_t>;

/// The symbolic batch dimension of graph shapes.
inline constexpr std::int64_t kBatch = -1;

/// Number of elements; throws partrain::Error if the shape still holds kBatch.
std::int64_t numel(const Shape& shape);
/// "[B, 128, 768]" (B for the symbolic batch dimension).
std::string shape_string(const Shape& shape);
/// True when any dimension is kBatch.
bool has_batch_dim(const Shape& shape);
/// The shape with every kBatch replaced by `batch_size`.
Shape with_batch(const Shape& shape, std::int64_t batch_size);
/// Numpy broadcasting of two shapes (kBatch broadcasts like any other size); throws partrain::Error.
Shape broadcast_shapes(const Shape& a, const Shape& b);
/// Row-major strides in elements.
std::vector<std::int64_t> contiguous_strides(const Shape& shape);
/// Normalises a possibly negative axis into [0, rank); throws partrain::Error when out of range.
int normalise_axis(std::int64_t axis, std::size_t rank);

}  // namespace partrain
