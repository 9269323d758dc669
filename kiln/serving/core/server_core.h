// ServerCore: the model manager every front end (REST, gRPC) serves from.
// It owns the models of a ModelServerConfig, polls their base paths for
// version directories, runs each version through its lifecycle
// (kiln/serving/core/lifecycle.h) on loader threads, and answers lookups with
// handles that keep a version alive while a request uses it. Its parts:
// source.h (which versions are on disk), version_manager.h (which to load
// and unload next), loader.h (load or unload one version, warmup.h inside);
// the core keeps the routing table, the leases and the batch queues.
//
//   ServerCoreOptions o;
//   o.config = read_model_config_file("models.config");
//   ServerCore core(o);
//   core.start();                                         // loads what is on disk, then polls
//   auto h = core.get({.name = "mnist", .label = "stable"});  // NOT_FOUND / UNAVAILABLE otherwise
//   TensorMap out = core.predict(*h, "serving_default", {{"inputs", x}});
//
// Version transitions are availability-preserving by default: a new version
// is loaded and warmed up (assets/extra/warmup_requests.jsonl) while the old
// one serves; once it is Ready, lookups return it; the old one is Quiescing
// until its last handle is released, then Unloading, then Disabled. With
// resource_preserving the old version is unloaded first. A version that
// fails to load ends in Error (status END with the message) and never
// replaces a working one; so does one whose directory cannot be read (a
// symlink loop: source.h), which is also logged on every poll. Removing a version directory unloads it (rollback
// to the previous version when latest-N is the policy).
//
// Thread safety: every public member is thread-safe. Loading and unloading
// run on their own threads; get() only takes a shared lock on the routing
// table, so a reload does not stall requests to other models.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/json.h"
#include "kiln/serving/batching/batching.h"
#include "kiln/serving/core/lifecycle.h"
#include "kiln/serving/core/model_config.h"
#include "kiln/serving/core/servable.h"
#include "kiln/serving/metrics.h"
#include "kiln/serving/status.h"

namespace kiln::serving {

// Which version a request wants: the latest Ready one when neither version
// nor label is given; never both.
struct ModelSpec {
  std::string name;
  std::optional<int64_t> version;
  std::optional<std::string> label;
};

// A leased version. Holding the shared_ptr keeps the servable loaded (the
// version stays Quiescing until the last handle goes). Cheap to copy.
struct ServableHandle {
  std::string model_name;
  int64_t version = 0;
  std::shared_ptr<Servable> servable;
  std::shared_ptr<void> lease;  // implementation detail: counts the request as in flight
  const Json& signatures() const { return servable->signatures(); }
};
using ServableHandlePtr = std::shared_ptr<const ServableHandle>;

// One version as status reports it.
struct VersionStatus {
  int64_t version = 0;
  VersionState state = VersionState::kNew;
  std::string error;  // non-empty in kError
};

// Per-request times, microseconds; front ends fill parse/serialize, the core
// queue/compute.
struct RequestTiming {
  int64_t parse_us = 0, queue_us = 0, compute_us = 0, serialize_us = 0;
  int64_t batch_size = 0;
};

struct ServerCoreOptions {
  ModelServerConfig config;
  // 0 = scan once at start() and on reload only.
  double file_system_poll_wait_seconds = 1.0;
  bool enable_batching = false;
  BatchingOptions batching;
  // Batching off: 0 runs each prediction on the calling thread (the front
  // end's I/O or polling thread); N > 0 runs them on N compute threads (a
  // ComputePool, compute_pool.h; one intra-op thread each) instead. Unused
  // with batching (the batch threads compute). Default 0: on the 2-core
  // bench the pool cost ~20% more server CPU per request and did not lower
  // p99/p50 (docs/PERFORMANCE.md, issue 15 §4).
  int64_t num_compute_threads = 0;
  // Batching off: requests waiting for a compute thread beyond this are
  // refused with RESOURCE_EXHAUSTED (HTTP 429).
  int64_t max_queued_computes = 1024;
  int64_t num_load_threads = 2;
  bool resource_preserving = false;  // default: availability-preserving
  bool enable_warmup = true;
  // start() waits for the first versions up to this long (they may also fail).
  double initial_load_timeout_seconds = 300;
  void validate() const;
};

class ServerCore {
 public:
  explicit ServerCore(ServerCoreOptions options);
  ~ServerCore();  // stop()s
  ServerCore(const ServerCore&) = delete;
  ServerCore& operator=(const ServerCore&) = delete;

  // Scans every base path, loads the aspired versions (waiting up to
  // initial_load_timeout_seconds), then starts the poll thread.
  void start();
  // Stops polling and loading; in-flight handles stay valid.
  void stop();

  // --- requests ------------------------------------------------------------
  // NOT_FOUND: unknown model, version or label ("Servable not found for
  // request: Specific(mnist, 7)"); UNAVAILABLE: the model has no Ready version yet.
  ServableHandlePtr get(const ModelSpec& spec) const;
  // Runs the signature and waits for it: predict_async() and a wait for
  // `done` (up to the deadline: then DEADLINE_EXCEEDED, and the queued
  // request is dropped uncomputed when its batch forms). Throws ServingError
  // with its code, or what the model threw.
  TensorMap predict(const ServableHandle& handle, const std::string& signature, const TensorMap& inputs,
                    Deadline deadline = std::nullopt, RequestTiming* timing = nullptr);
  // What predict_async hands back: the outputs, or the error (a ServingError
  // with its code, or whatever the model threw) with empty outputs.
  using PredictDone = std::function<void(std::exception_ptr error, TensorMap outputs, const RequestTiming& timing)>;
  // predict() without blocking the caller on the batch queue: `done` runs
  // exactly once, on the batch thread that ran the request's batch
  // (batching on), on the compute thread that ran it (batching off,
  // num_compute_threads > 0), or on the calling thread before
  // predict_async returns (batching off and num_compute_threads 0: the
  // compute runs on the caller; or an error found at once, such as a full
  // queue). With batching, the core has one
  // SharedBatchScheduler (batching.h): num_batch_threads threads shared by
  // a queue per loaded version. The handle is kept alive until `done`
  // returns, so a version stays Quiescing until the requests waiting in its
  // queue are answered (the core's destructor answers those still waiting
  // UNAVAILABLE, on its thread; queued computes still run). `done` must not throw and should not block: front ends
  // serialize the reply and hand it to their I/O loop from it. `timing`
  // carries queue/compute/batch_size; its parse/serialize stay 0.
  void predict_async(ServableHandlePtr handle, std::string signature, TensorMap inputs, Deadline deadline,
                     PredictDone done);
  // Counts one finished request into the metrics (protocol: "rest", "grpc",
  // "kserve_rest", ...; api: "predict", "classify", "metadata", ...).
  void record_request(const std::string& model, int64_t version, const std::string& protocol, const std::string& api,
                      const Status& status, const RequestTiming& timing);

  // --- state -----------------------------------------------------------------
  // Versions of `name` (all known ones, newest first), or only `version` /
  // the one `label` points to. NOT_FOUND for an unknown model/version/label.
  std::vector<VersionStatus> model_status(const ModelSpec& spec) const;
  std::vector<std::string> model_names() const;
  // True when every configured model has a Ready version.
  bool ready() const;
  // Is this version (or the latest when none) Ready?
  bool is_ready(const ModelSpec& spec) const;

  // --- configuration -----------------------------------------------------------
  ModelServerConfig config() const;
  // Replaces the served set: new models load, removed ones unload, changed
  // policies/labels apply. ValueError if invalid (nothing changes then).
  void reload_config(const ModelServerConfig& config);
  // Adds or replaces one model (admin :load); removes one (admin :unload).
  void load_model(const ModelConfig& model);
  void unload_model(const std::string& name);
  // One synchronous scan of the file system (what the poll thread does).
  void poll_now();
  // Waits until `spec` resolves to a Ready version (or up to timeout); true if it does.
  bool wait_until_ready(const ModelSpec& spec, double timeout_seconds) const;
  // Waits until no load/unload is pending or running; true if reached in time.
  bool wait_until_idle(double timeout_seconds) const;

  MetricsRegistry& metrics() { return *metrics_; }
  const ServerCoreOptions& options() const { return options_; }

 private:
  struct Impl;
  ServerCoreOptions options_;
  std::unique_ptr<MetricsRegistry> metrics_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::serving
