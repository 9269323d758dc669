// device_memory.h: nothing to count on the CPU; on a GPU (tests named
// *CUDA*, skipped without one) the caching allocator's figures follow a
// tensor's life and emptying the cache hands its blocks back.
#include "kiln/core/device_memory.h"

#include <gtest/gtest.h>

#include "kiln/core/device.h"

namespace kiln {
namespace {

TEST(DeviceMemory, TheCpuHasNoAllocatorAccountAndNothingToEmpty) {
  at::Tensor big = at::ones({1 << 20});
  DeviceMemoryStats s = device_memory_stats(at::Device(at::kCPU));
  EXPECT_EQ(s.allocated_bytes, 0);
  EXPECT_EQ(s.reserved_bytes, 0);
  empty_device_cache(at::Device(at::kCPU));  // no-op, no throw
  EXPECT_EQ(big.sum().item<float>(), float(1 << 20)) << "CPU tensors are untouched";
}

TEST(DeviceMemoryCUDA, FiguresFollowATensorAndEmptyingReturnsItsBlock) {
  if (gpu_count() == 0) GTEST_SKIP() << "no GPU: this test allocates 64 MiB on cuda:0";
  const at::Device gpu(at::kCUDA, 0);
  at::Tensor warm = at::zeros({1}, at::TensorOptions().device(gpu));  // the allocator exists from here
  empty_device_cache(gpu);
  const DeviceMemoryStats before = device_memory_stats(gpu);
  constexpr int64_t kBytes = int64_t{64} << 20;
  at::Tensor t = at::empty({kBytes / 4}, at::TensorOptions().device(gpu).dtype(at::kFloat));
  const DeviceMemoryStats held = device_memory_stats(gpu);
  EXPECT_GE(held.allocated_bytes - before.allocated_bytes, kBytes);
  EXPECT_GE(held.reserved_bytes - before.reserved_bytes, kBytes);
  t.reset();
  const DeviceMemoryStats freed = device_memory_stats(gpu);
  EXPECT_EQ(freed.allocated_bytes, before.allocated_bytes);
  EXPECT_GE(freed.reserved_bytes - before.reserved_bytes, kBytes) << "cached by the allocator until emptied";
  empty_device_cache(gpu);
  EXPECT_EQ(device_memory_stats(gpu).reserved_bytes, before.reserved_bytes);
}

}  // namespace
}  // namespace kiln
