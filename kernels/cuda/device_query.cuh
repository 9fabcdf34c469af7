#pragma once
// CUDA device discovery. Placeholder of the CUDA backend until its issue lands: it proves the
// CUDA toolchain, cuBLAS, cuDNN and NCCL link, and lets tests skip cleanly without a GPU.
#include <string>

namespace partrain::cuda {

/// Number of usable GPUs; 0 when there is no GPU or no driver (never throws).
int device_count();
/// One line describing the CUDA runtime, cuBLAS, cuDNN and NCCL versions found at run time.
std::string library_versions();

}  // namespace partrain::cuda
