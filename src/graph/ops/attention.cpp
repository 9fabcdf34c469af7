// Schemas of the attention ops: not written yet.
#include "graph/op_schema.h"

namespace partrain {
void add_attention_schemas(std::vector<OpSchema>&) {}
}  // namespace partrain
