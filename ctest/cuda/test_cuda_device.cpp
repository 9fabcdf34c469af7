// CUDA toolchain check (label "cuda"): the CUDA backend target links cuBLAS, cuDNN and NCCL and
// reports their versions; on a machine without a GPU the test is skipped with a message.
#include <gtest/gtest.h>

#include "kernels/cuda/device_query.cuh"

TEST(CudaDevice, LibrariesLoadAndDevicesAreCounted) {
  const std::string versions = partrain::cuda::library_versions();
  EXPECT_NE(versions.find("NCCL"), std::string::npos);
  const int count = partrain::cuda::device_count();
  if (count == 0) GTEST_SKIP() << "no GPU on this machine (" << versions << "): CUDA tests skipped";
  EXPECT_GE(count, 1);
  std::printf("%d GPU(s); %s\n", count, versions.c_str());
}
