// CPU kernels of the convolution ops: not written yet.
#include "kernels/cpu/cpu_backend.h"

namespace partrain {
void register_cpu_convolution_kernels(Backend&) {}
}  // namespace partrain
