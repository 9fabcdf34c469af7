#pragma once
// Counter-based random numbers (Philox4x32-10, Salmon et al., SC'11 "Parallel random numbers: as
// easy as 1, 2, 3"). A random word depends only on its key and counter, never on call order, so a
// dropout mask depends only on (seed, step, microbatch, sample, element) and any partitioning of the
// model or the batch computes the same mask, on the CPU and on the GPU.
#include <array>
#include <cstdint>

namespace partrain {

using PhiloxCounter = std::array<std::uint32_t, 4>;
using PhiloxKey = std::array<std::uint32_t, 2>;

/// Philox4x32 with 10 rounds: four 32-bit random words for (counter, key).
#if defined(__CUDACC__)
__host__ __device__
#endif
inline PhiloxCounter philox4x32(PhiloxCounter counter, PhiloxKey key) {
  constexpr std::uint32_t kMultiplier0 = 0xD2511F53u, kMultiplier1 = 0xCD9E8D57u;
  constexpr std::uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t product0 = std::uint64_t(kMultiplier0) * counter[0];
    const std::uint64_t product1 = std::uint64_t(kMultiplier1) * counter[2];
    counter = {std::uint32_t(product1 >> 32) ^ counter[1] ^ key[0], std::uint32_t(product1),
               std::uint32_t(product0 >> 32) ^ counter[3] ^ key[1], std::uint32_t(product0)};
    key[0] += kWeyl0;
    key[1] += kWeyl1;
  }
  return counter;
}

/// Uniform float in [0, 1) from a 32-bit random word (24 significant bits).
#if defined(__CUDACC__)
__host__ __device__
#endif
inline float uniform_from_word(std::uint32_t word) { return float(word >> 8) * (1.0f / 16777216.0f); }

/// Where in training a random draw happens. Kernels that draw random numbers (dropout) combine it
/// with the sample index inside the tensor (dimension 0) and the element index inside the sample.
struct RandomContext {
  std::uint64_t seed = 0;
  std::uint32_t step = 0;
  std::uint32_t microbatch = 0;
  /// Index of this tensor's first sample within the microbatch (non-zero on a replica that holds a
  /// later slice of the microbatch, so every replica draws the masks of its own samples).
  std::uint32_t first_sample = 0;
  /// Distinguishes random ops of the same model (the task's stable hash).
  std::uint32_t stream = 0;
};

/// Uniform [0, 1) for element `element` of sample `sample` (index inside the tensor's batch):
/// Philox(counter = (step, microbatch, first_sample + sample, element / 4), key = seed ^ stream).
#if defined(__CUDACC__)
__host__ __device__
#endif
inline float random_uniform(const RandomContext& context, std::uint32_t sample, std::uint64_t element) {
  const PhiloxKey key = {std::uint32_t(context.seed) ^ context.stream,
                         std::uint32_t(context.seed >> 32) ^ (std::uint32_t(element >> 34) * 0x9E3779B9u)};
  const PhiloxCounter words = philox4x32(
      {context.step, context.microbatch, context.first_sample + sample, std::uint32_t(element >> 2)}, key);
  return uniform_from_word(words[element & 3]);
}

}  // namespace partrain
