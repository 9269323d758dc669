#include "kiln/core/device_memory.h"

#include <c10/core/CachingDeviceAllocator.h>

#include <atomic>
#include <exception>
#include <iostream>

namespace kiln {
namespace {

// The caching allocator behind `device` once it has allocated there; null
// on the CPU, for a device type LibTorch has no caching allocator for, and
// before the first allocation (its per-GPU state does not exist yet).
c10::DeviceAllocator* caching_allocator(const at::Device& device) {
  if (device.is_cpu() || device.is_meta()) return nullptr;
  auto* allocator = dynamic_cast<c10::DeviceAllocator*>(c10::GetAllocator(device.type()));
  return allocator && allocator->initialized() ? allocator : nullptr;
}

void warn_allocator_failure_once(const char* what, const std::exception& e) {
  static std::atomic<bool> warned{false};
  if (!warned.exchange(true)) std::cerr << "kiln: warning: " << what << " failed: " << e.what() << "\n";
}

}  // namespace

DeviceMemoryStats device_memory_stats(const at::Device& device) {
  DeviceMemoryStats s;
  try {
    c10::DeviceAllocator* allocator = caching_allocator(device);
    if (!allocator) return s;
    const c10::DeviceIndex index = device.has_index() ? device.index() : 0;
    const auto stats = allocator->getDeviceStats(index);
    constexpr size_t kAll = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    s.allocated_bytes = stats.allocated_bytes[kAll].current;
    s.reserved_bytes = stats.reserved_bytes[kAll].current;
  } catch (const std::exception& e) {
    warn_allocator_failure_once("reading the device allocator's statistics", e);
  }
  return s;
}

void empty_device_cache(const at::Device& device) {
  try {
    if (c10::DeviceAllocator* allocator = caching_allocator(device)) allocator->emptyCache();
  } catch (const std::exception& e) {
    warn_allocator_failure_once("emptying the device allocator's cache", e);
  }
}

}  // namespace kiln
