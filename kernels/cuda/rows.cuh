#pragma once
// Row reductions shared by the kernels that reduce along the last dimension (softmax.cu,
// tensor_parallel.cu): a row is processed by one warp (rows of up to 1024 elements, 8 rows per
// 256-thread block) or by one block (longer rows); grid-stride loops cover any number of rows.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/cuda_common.cuh"

namespace partrain::cuda {

/// Threads of a block that processes one row.
inline constexpr int kRowBlockThreads = 512;

/// The rows of a kernel launched with row_launch: kWarp = a warp per row, otherwise a block per
/// row. Every thread of a row's group runs the same iterations, so the shuffles and
/// __syncthreads inside sum() and max() are uniform. `shared` holds 32 floats (block rows only).
template <bool kWarp>
struct Rows {
  /// The first row of the calling thread's group.
  __device__ static std::int64_t first() {
    return kWarp ? std::int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32 : std::int64_t(blockIdx.x);
  }
  /// The distance to the group's next row.
  __device__ static std::int64_t step() {
    return kWarp ? std::int64_t(gridDim.x) * (blockDim.x / 32) : std::int64_t(gridDim.x);
  }
  /// The thread's position in its row group and the group's width.
  __device__ static int lane() { return kWarp ? int(threadIdx.x % 32) : int(threadIdx.x); }
  __device__ static int width() { return kWarp ? 32 : int(blockDim.x); }
  /// Sum / maximum over the row group; every thread of the group gets the result.
  __device__ static float sum(float value, float* shared) {
    if constexpr (kWarp) {
      for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
      return value;
    } else {
      return block_sum(value, shared);
    }
  }
  __device__ static float max(float value, float* shared) {
    if constexpr (kWarp) {
      for (int offset = 16; offset > 0; offset /= 2) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
      return value;
    } else {
      return block_max(value, shared);
    }
  }
};

/// Grid of a row kernel: warp rows (kThreadsPerBlock threads) or block rows (kRowBlockThreads).
struct RowLaunch {
  bool warp = true;
  unsigned int blocks = 1;
  int threads = kThreadsPerBlock;
};

/// Rows of up to 1024 elements get a warp (at most 32 elements per lane), longer ones a block.
inline RowLaunch row_launch(std::int64_t rows, std::int64_t length) {
  constexpr std::int64_t kMaxBlocks = std::int64_t(1) << 20;  // the grid-stride loops do the rest
  RowLaunch launch;
  if (length <= 1024) {
    launch.warp = true;
    launch.threads = kThreadsPerBlock;
    const std::int64_t rows_per_block = kThreadsPerBlock / 32;
    launch.blocks = static_cast<unsigned int>(
        std::clamp<std::int64_t>((rows + rows_per_block - 1) / rows_per_block, 1, kMaxBlocks));
  } else {
    launch.warp = false;
    launch.threads = kRowBlockThreads;
    launch.blocks = static_cast<unsigned int>(std::clamp<std::int64_t>(rows, 1, kMaxBlocks));
  }
  return launch;
}

/// Calls function(std::bool_constant<warp>{}) for the launch's row grouping.
template <typename Function>
void dispatch_rows(const RowLaunch& launch, Function&& function) {
  if (launch.warp)
    function(std::true_type{});
  else
    function(std::false_type{});
}

}  // namespace partrain::cuda
