// Schemas of the shape ops: not written yet.
#include "graph/op_schema.h"

namespace partrain {
void add_shape_schemas(std::vector<OpSchema>&) {}
}  // namespace partrain
