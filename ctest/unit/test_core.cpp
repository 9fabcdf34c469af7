// Core: allocator peak accounting, tensors, bf16 conversion, Philox known answers, check macros.
#include <cstring>
#include <gtest/gtest.h>

#include <cmath>

#include "core/allocator.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace partrain {
namespace {

TEST(CachingAllocator, TracksCurrentAndPeakBytes) {
  CachingAllocator allocator(cpu_device(), std::make_unique<HostMemory>());
  void* a = allocator.allocate(1000);   // rounds to 1024
  void* b = allocator.allocate(4096);
  EXPECT_EQ(allocator.current_bytes(), 1024u + 4096u);
  EXPECT_EQ(allocator.peak_bytes(), 1024u + 4096u);
  allocator.deallocate(b, 4096);
  EXPECT_EQ(allocator.current_bytes(), 1024u);
  EXPECT_EQ(allocator.peak_bytes(), 1024u + 4096u);      // peak survives frees
  EXPECT_EQ(allocator.reserved_bytes(), 1024u + 4096u);  // freed block is cached, not returned
  void* c = allocator.allocate(4096);                    // reuses the cached block
  EXPECT_EQ(c, b);
  EXPECT_EQ(allocator.reserved_bytes(), 1024u + 4096u);
  allocator.reset_peak();
  EXPECT_EQ(allocator.peak_bytes(), 1024u + 4096u);
  allocator.deallocate(c, 4096);
  allocator.deallocate(a, 1000);
  EXPECT_EQ(allocator.current_bytes(), 0u);
  allocator.empty_cache();
  EXPECT_EQ(allocator.reserved_bytes(), 0u);
}

TEST(CachingAllocator, TensorLifetimesDriveThePeak) {
  CachingAllocator& allocator = allocator_for(cpu_device());
  const std::size_t base = allocator.current_bytes();
  allocator.reset_peak();
  {
    Tensor first = Tensor::empty({256, 256});   // 256 KiB
    Tensor view = first.reshape({-1});          // shares storage: no new bytes
    EXPECT_EQ(allocator.current_bytes(), base + 256 * 1024);
    { Tensor second = Tensor::empty({128, 256}); EXPECT_EQ(allocator.current_bytes(), base + 384 * 1024); }
    EXPECT_EQ(allocator.current_bytes(), base + 256 * 1024);
  }
  EXPECT_EQ(allocator.current_bytes(), base);
  EXPECT_EQ(allocator.peak_bytes(), base + 384 * 1024);
}

TEST(Tensor, ShapesDtypesAndViews) {
  Tensor t = Tensor::from_vector<float>({2, 3}, {0, 1, 2, 3, 4, 5});
  EXPECT_EQ(t.numel(), 6);
  EXPECT_EQ(t.nbytes(), 24u);
  EXPECT_EQ(t.reshape({3, -1}).shape(), (Shape{3, 2}));
  EXPECT_THROW(t.reshape({4, -1}), Error);
  EXPECT_THROW(t.data<std::int64_t>(), Error);
  EXPECT_EQ(t.slice_rows(1, 2).to_float_vector(), (std::vector<float>{3, 4, 5}));
  EXPECT_THROW(Tensor::empty({kBatch, 3}), Error);
  Tensor copy = t.clone();
  copy.data<float>()[0] = 42;
  EXPECT_EQ(t.data<float>()[0], 0);
  EXPECT_EQ(Tensor::full({2}, 7, DType::I32).to_float_vector(), (std::vector<float>{7, 7}));
}

// ZeRO-1's bf16 all-gather reads the f32 gradient buffer's bytes as twice as many bf16 slots.
TEST(Tensor, ReinterpretSharesTheBytes) {
  const Tensor t = Tensor::from_vector<float>({2, 3}, {0, 1, 2, 3, 4, 5});
  const Tensor halves = t.slice_rows(1, 2).reinterpret(DType::BF16);
  EXPECT_EQ(halves.shape(), (Shape{6}));
  EXPECT_EQ(halves.dtype(), DType::BF16);
  EXPECT_EQ(halves.raw_data(), t.slice_rows(1, 2).raw_data());
  halves.data<BFloat16>()[0] = BFloat16(-2.5f);  // the low two bytes of element 3 (little-endian)
  halves.data<BFloat16>()[1] = BFloat16(7.0f);   // and its high two
  const std::uint32_t word = (std::uint32_t{BFloat16(7.0f).bits} << 16) | BFloat16(-2.5f).bits;
  float expected;
  std::memcpy(&expected, &word, sizeof expected);
  EXPECT_EQ(t.data<float>()[3], expected);
  EXPECT_EQ(t.data<float>()[4], 4.0f) << "the next element is untouched";
  EXPECT_EQ(t.reinterpret(DType::BF16).reinterpret(DType::F32).to_float_vector(), t.to_float_vector());
  EXPECT_THROW(halves.slice_rows(1, 2).reinterpret(DType::F32), Error);  // starts mid-element
  EXPECT_THROW(halves.slice_rows(0, 3).reinterpret(DType::F32), Error);  // 6 bytes
}

TEST(BFloat16, RoundsToNearestEven) {
  EXPECT_EQ(static_cast<float>(BFloat16(1.0f)), 1.0f);
  EXPECT_EQ(static_cast<float>(BFloat16(1.00390625f)), 1.0f);         // halfway: ties to even
  EXPECT_EQ(static_cast<float>(BFloat16(1.01171875f)), 1.015625f);    // halfway: ties to even (odd below)
  EXPECT_EQ(static_cast<float>(BFloat16(-3.140625f)), -3.140625f);    // exactly representable
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(std::nanf("")))));
}

TEST(Philox, MatchesRandom123KnownAnswers) {
  // Random123 kat_vectors, philox4x32 10 rounds: counter, key -> output.
  EXPECT_EQ(philox4x32({0, 0, 0, 0}, {0, 0}), (PhiloxCounter{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(philox4x32({~0u, ~0u, ~0u, ~0u}, {~0u, ~0u}),
            (PhiloxCounter{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(philox4x32({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
            (PhiloxCounter{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Philox, UniformDependsOnlyOnItsCoordinates) {
  const RandomContext context{123, 4, 2, 0, 9};
  RandomContext shifted = context;
  shifted.first_sample = 3;
  // Sample 5 of a tensor that starts at sample 0 is sample 2 of one that starts at sample 3.
  EXPECT_EQ(random_uniform(context, 5, 77), random_uniform(shifted, 2, 77));
  EXPECT_NE(random_uniform(context, 5, 77), random_uniform(context, 5, 78));
  double sum = 0;
  for (int i = 0; i < 100000; ++i) sum += random_uniform(context, 0, i);
  EXPECT_NEAR(sum / 100000, 0.5, 0.005);
}

TEST(Errors, CarryFileAndLine) {
  try {
    PARTRAIN_CHECK(1 + 1 == 3, "arithmetic is " << "broken");
    FAIL() << "no exception";
  } catch (const Error& error) {
    EXPECT_EQ(error.message(), "arithmetic is broken");
    EXPECT_NE(std::string(error.what()).find("test_core.cpp:"), std::string::npos) << error.what();
    EXPECT_GT(error.line(), 0);
  }
}

}  // namespace
}  // namespace partrain
