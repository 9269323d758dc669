// Device memory: what LibTorch's caching allocator of a device holds, and
// handing its cached blocks back to the driver.
//
//   kiln::empty_device_cache(at::Device(at::kCUDA, 0));  // after a model is freed
//   int64_t live = kiln::device_memory_stats(at::Device(at::kCUDA, 0)).allocated_bytes;
//
// Written against LibTorch's device-generic allocator interface
// (c10::DeviceAllocator), so it needs no CUDA headers or compile definition
// and builds against a CPU-only LibTorch too (where there is no GPU to ask).
// Kept out of device.h (which every layer includes through variable.h), so
// that changing it rebuilds one file.
//
// Thread safety: every function may be called from any thread.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace kiln {

struct DeviceMemoryStats {
  int64_t allocated_bytes = 0;  // held by live tensors (torch.cuda.memory_allocated)
  int64_t reserved_bytes = 0;   // taken from the driver: allocated plus cached free blocks (memory_reserved)
};

// The caching allocator's current figures for `device`. All 0 on the CPU
// (its allocator keeps no such account), and on a GPU that has not
// allocated yet. Never throws.
DeviceMemoryStats device_memory_stats(const at::Device& device);

// Returns the cached free blocks of `device`'s caching allocator to the
// driver (torch.cuda.empty_cache()), so that other processes, and
// nvidia-smi, see the memory freed tensors held. LibTorch's CUDA allocator
// empties the caches of every GPU at once. Blocks still in use, also by a
// stream that has not caught up, stay. No-op on the CPU. Never throws (a
// failure is logged to stderr once).
void empty_device_cache(const at::Device& device);

}  // namespace kiln
