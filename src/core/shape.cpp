#include "core/shape.h"

#include <sstream>

#include "core/error.h"

namespace partrain {

std::int64_t numel(const Shape& shape) {
  std::int64_t count = 1;
  for (std::int64_t dim : shape) {
    PARTRAIN_CHECK(dim >= 0, "shape " << shape_string(shape) << " has a symbolic or negative dimension");
    count *= dim;
  }
  return count;
}

std::string shape_string(const Shape& shape) {
  std::ostringstream out;
  out << '[';
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) out << ", ";
    if (shape[i] == kBatch) out << 'B'; else out << shape[i];
  }
  out << ']';
  return out.str();
}

bool has_batch_dim(const Shape& shape) {
  for (std::int64_t dim : shape) if (dim == kBatch) return true;
  return false;
}

Shape with_batch(const Shape& shape, std::int64_t batch_size) {
  Shape result = shape;
  for (std::int64_t& dim : result) if (dim == kBatch) dim = batch_size;
  return result;
}

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  const std::size_t rank = std::max(a.size(), b.size());
  Shape result(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    const std::int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const std::int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    PARTRAIN_CHECK(da == db || da == 1 || db == 1,
                   "shapes " << shape_string(a) << " and " << shape_string(b) << " do not broadcast");
    result[i] = da == 1 ? db : da;
  }
  return result;
}

std::vector<std::int64_t> contiguous_strides(const Shape& shape) {
  std::vector<std::int64_t> strides(shape.size(), 1);
  for (std::size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * shape[i];
  return strides;
}

int normalise_axis(std::int64_t axis, std::size_t rank) {
  const std::int64_t r = static_cast<std::int64_t>(rank);
  PARTRAIN_CHECK(axis >= -r && axis < r, "axis " << axis << " out of range for rank " << rank);
  return static_cast<int>(axis < 0 ? axis + r : axis);
}

}  // namespace partrain
