// The loader (TF Serving's Loader): turns one version directory into a
// running servable, and a servable back into free memory. ServerCore calls
// it on its loader threads; the lifecycle (lifecycle.h), routing, leases
// and batch queues stay in the core, which decides when (version_manager.h).
//
//   VersionLoader loader({.model = "mnist", .version = 3, .platform = "kiln",
//                         .dir = "/models/mnist/3"}, metrics);
//   std::shared_ptr<Servable> s = loader.load();  // throws LoadError naming the dir
//   ...                                           // serve; wait for the last lease
//   loader.unload(std::move(s));                  // frees it; pages go back to the system
//
// load(): make_servable for the platform (servable.h), then, with
// enable_warmup, the version's warmup requests (warmup.h). On success it
// records kiln_model_load_seconds{model} (load and warmup) and the resource
// estimate kiln_model_memory_bytes{model,version} (the servable's
// memory_bytes()). On failure it keeps nothing (the half-made servable is
// destroyed before it throws), counts kiln_model_load_failures_total{model},
// and throws LoadError whose message names the directory and the cause.
// It also records kiln_model_device_memory_bytes{model,version,device}:
// the bytes of the servable's weights resident on the device it computes on
// (device_memory_bytes(); device="cuda:0", or "cpu" for a version on the
// CPU, where it equals kiln_model_memory_bytes for a kiln model).
// unload(): drops the caller's reference (the caller holds the last one:
// no request may still use it), hands the freed memory back to the system
// (malloc_trim; for a GPU version, the caching allocator's cached blocks
// too: empty_device_cache), sets the memory gauge to 0 and removes the
// device memory series (a version no longer on any device has none).
// Thread safety: different loaders run concurrently; one loader's load and
// unload are called one after the other. Cost: load reads the weights and
// runs the warmup (seconds for large models); unload is the destructor.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kiln/core/error.h"
#include "kiln/serving/core/servable.h"
#include "kiln/serving/metrics.h"

namespace kiln::serving {

struct LoaderOptions {
  std::string model;     // the model's name, for metrics and logs
  int64_t version = 0;   // positive
  std::string platform;  // the model_platform (a registered servable factory)
  std::string dir;       // the version directory
  bool enable_warmup = true;
};

// A version failed to load; what() is "<dir>: <cause>" unless the cause
// already names the directory.
class LoadError : public Error {
 public:
  using Error::Error;
};

class VersionLoader {
 public:
  static constexpr const char* kDeviceMemoryGauge = "kiln_model_device_memory_bytes";

  // Borrows `metrics`, which must outlive the loader.
  VersionLoader(LoaderOptions options, MetricsRegistry& metrics);

  std::shared_ptr<Servable> load() const;
  void unload(std::shared_ptr<Servable> servable) const;

  const LoaderOptions& options() const { return o_; }

 private:
  void set_memory_gauge(double bytes) const;
  Labels device_gauge_labels(const at::Device& device) const;
  LoaderOptions o_;
  MetricsRegistry& metrics_;
};

}  // namespace kiln::serving
