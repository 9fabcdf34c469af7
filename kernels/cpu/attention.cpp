// CPU kernels of the attention ops: not written yet.
#include "kernels/cpu/cpu_backend.h"

namespace partrain {
void register_cpu_attention_kernels(Backend&) {}
}  // namespace partrain
