#include "kiln/serving/core/loader.h"

#include <malloc.h>
#include <spdlog/spdlog.h>

#include <chrono>

#include "kiln/core/device_memory.h"
#include "kiln/serving/core/warmup.h"

namespace kiln::serving {

VersionLoader::VersionLoader(LoaderOptions options, MetricsRegistry& metrics)
    : o_(std::move(options)), metrics_(metrics) {}

void VersionLoader::set_memory_gauge(double bytes) const {
  metrics_
      .gauge("kiln_model_memory_bytes", "Bytes held by the version's servable",
             {{"model", o_.model}, {"version", std::to_string(o_.version)}})
      .set(bytes);
}

Labels VersionLoader::device_gauge_labels(const at::Device& device) const {
  return {{"model", o_.model}, {"version", std::to_string(o_.version)}, {"device", device.str()}};
}

std::shared_ptr<Servable> VersionLoader::load() const {
  const auto start = std::chrono::steady_clock::now();
  std::shared_ptr<Servable> servable;
  try {
    servable = make_servable(o_.platform, o_.dir);
    if (o_.enable_warmup) {
      int n = replay_warmup(*servable, o_.dir);
      if (n > 0) {
        metrics_.counter("kiln_warmup_requests_total", "Warmup requests replayed", {{"model", o_.model}}).inc(n);
        spdlog::info("serving: {} version {}: replayed {} warmup requests", o_.model, o_.version, n);
      }
    }
  } catch (const std::exception& e) {
    servable.reset();  // nothing half-loaded outlives the error
    metrics_.counter("kiln_model_load_failures_total", "Failed version loads", {{"model", o_.model}}).inc();
    std::string msg = e.what();
    if (msg.find(o_.dir) == std::string::npos) msg = o_.dir + ": " + msg;
    throw LoadError(msg);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  metrics_.histogram("kiln_model_load_seconds", "Time to load and warm up a version", {{"model", o_.model}})
      .observe(secs);
  set_memory_gauge((double)servable->memory_bytes());
  metrics_
      .gauge(kDeviceMemoryGauge, "Bytes of the version's weights resident on the device it computes on",
             device_gauge_labels(servable->device()))
      .set((double)servable->device_memory_bytes());
  return servable;
}

void VersionLoader::unload(std::shared_ptr<Servable> servable) const {
  const at::Device device = servable ? servable->device() : at::Device(at::kCPU);
  servable.reset();
  // A GPU's caching allocator keeps the freed weights' blocks for reuse;
  // hand them back to the driver, so that the memory is free for the next
  // version, other processes and nvidia-smi.
  if (!device.is_cpu()) empty_device_cache(device);
  metrics_.remove(kDeviceMemoryGauge, device_gauge_labels(device));
  // Give the freed pages back to the system. glibc keeps freed memory in
  // its heaps (weights below its dynamic mmap threshold land there), so
  // without this the resident size only grew as versions came and went:
  // 255 -> 487 MB after four swaps of a 40 MB model (TF Serving's
  // "memory kept after unload").
  ::malloc_trim(0);
  set_memory_gauge(0);
}

}  // namespace kiln::serving
