#include "kiln/serving/core/server_core.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <initializer_list>
#include <map>
#include <set>
#include <shared_mutex>
#include <string_view>
#include <thread>
#include <unordered_map>

#include "kiln/core/error.h"
#include "kiln/core/thread_pool.h"
#include "kiln/serving/core/compute_pool.h"
#include "kiln/serving/core/loader.h"
#include "kiln/serving/core/source.h"
#include "kiln/serving/core/version_manager.h"

namespace kiln::serving {
namespace {

int64_t micros_since(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t).count();
}

std::string spec_str(const ModelSpec& s) {
  if (s.version) return "Specific(" + s.name + ", " + std::to_string(*s.version) + ")";
  if (s.label) return "Label(" + s.name + ", " + *s.label + ")";
  return "Latest(" + s.name + ")";
}

}  // namespace

void ServerCoreOptions::validate() const {
  config.validate();
  if (file_system_poll_wait_seconds < 0)
    throw ValueError("file_system_poll_wait_seconds must be >= 0. Received: " +
                     std::to_string(file_system_poll_wait_seconds));
  if (num_load_threads < 1)
    throw ValueError("num_load_threads must be a positive integer. Received: " + std::to_string(num_load_threads));
  if (enable_batching) batching.validate();
  if (num_compute_threads < 0)
    throw ValueError(
        "num_compute_threads must be >= 0 (0: compute on the calling thread; N: N compute threads). Received: " +
        std::to_string(num_compute_threads));
  if (max_queued_computes < 1)
    throw ValueError("max_queued_computes must be a positive integer. Received: " +
                     std::to_string(max_queued_computes));
}

struct VersionEntry {
  std::string model;
  int64_t version = 0;
  int64_t model_json_mtime = 0;
  std::unique_ptr<VersionLoader> loader;  // the version directory's; set when the entry is made
  std::string scan_error;                 // set when the entry is made: the directory cannot be read (source.h)
  VersionLifecycle life;
  std::shared_ptr<Servable> servable;  // set in Loading, reset in Unloading
  BatchQueuePtr batch_queue;           // idem; a queue of Impl::batcher_ when batching
  std::mutex mu;                       // guards in_flight with cv
  std::condition_variable cv;
  int64_t in_flight = 0;          // guarded by mu
  bool unload_scheduled = false;  // guarded by Impl::mu_
};

struct ModelEntry {
  ModelConfig config;
  std::map<int64_t, std::shared_ptr<VersionEntry>> versions;  // every version seen, for status
};

struct ServerCore::Impl {
  ServerCore* self;
  ServerCoreOptions& o;
  MetricsRegistry& metrics;

  mutable std::shared_mutex mu_;                               // routing: models_ and entries' maps
  std::map<std::string, std::shared_ptr<ModelEntry>> models_;  // guarded by mu_

  std::mutex reconcile_mu_;  // one reconcile at a time

  std::unique_ptr<ThreadPool> loaders_;  // load and unload jobs

  std::thread poller_;
  std::mutex poll_mu_;
  std::condition_variable poll_cv_;
  bool poll_stop_ = false;  // guarded by poll_mu_

  // One scheduler (num_batch_threads threads) for every version's queue;
  // null without batching. Last member: destroyed first, so its threads are
  // joined before the versions (and servables) they compute go.
  std::unique_ptr<SharedBatchScheduler> batcher_;
  // record_request's series by a flat key (see series_key), so that a
  // request does not rebuild label maps to find them: that was ~40
  // mallocs per request, a third of the server's, on the batch thread.
  mutable std::shared_mutex series_mu_;
  std::unordered_map<std::string, Counter*> requests_;                 // guarded by series_mu_
  std::unordered_map<std::string, std::array<Histogram*, 5>> phases_;  // guarded by series_mu_
  std::unordered_map<std::string, Histogram*> batch_sizes_;            // guarded by series_mu_: by model

  // Batching off: the compute threads (null with batching or
  // num_compute_threads 0). Destroyed before the versions too: its
  // destructor runs what is queued, then joins.
  std::unique_ptr<ComputePool> compute_;

  Impl(ServerCore* s, ServerCoreOptions& opts, MetricsRegistry& m) : self(s), o(opts), metrics(m) {
    if (o.enable_batching) {
      batcher_ = std::make_unique<SharedBatchScheduler>(o.batching);
    } else if (o.num_compute_threads > 0) {
      ComputePoolOptions c;
      c.num_threads = static_cast<int>(o.num_compute_threads);
      c.max_queued = o.max_queued_computes;
      compute_ = std::make_unique<ComputePool>(c);
    }
  }

  // The batch queue of the version `h` leases; null with batching off (or
  // for a handle this core did not make).
  BatchQueuePtr batch_queue_of(const ServableHandle& h) const {
    if (!batcher_) return nullptr;
    std::shared_lock<std::shared_mutex> l(mu_);
    auto it = models_.find(h.model_name);
    if (it == models_.end()) return nullptr;
    auto vit = it->second->versions.find(h.version);
    if (vit == it->second->versions.end() || vit->second->servable != h.servable) return nullptr;
    return vit->second->batch_queue;
  }

  // Fire and forget: a job logs its own failure (nobody waits on its future).
  void submit(std::function<void()> job) {
    try {
      loaders_->submit([job = std::move(job)] {
        try {
          job();
        } catch (const std::exception& e) {
          spdlog::error("serving: loader job failed: {}", e.what());
        }
      });
    } catch (const StateError&) {
      // Shutting down: dropped, as the jobs still queued then are.
    }
  }

  void set_state_gauge(const VersionEntry& v) {
    metrics
        .gauge("kiln_model_version_available", "1 while the version is AVAILABLE",
               {{"model", v.model}, {"version", std::to_string(v.version)}})
        .set(v.life.state() == VersionState::kReady ? 1 : 0);
  }

  void transition(VersionEntry& v, VersionState to) {
    VersionState from = v.life.state();
    v.life.transition(to);
    spdlog::info("serving: {} version {}: {} -> {}", v.model, v.version, state_name(from), state_name(to));
    set_state_gauge(v);
  }

  void load(std::shared_ptr<VersionEntry> v) {
    if (v->life.state() != VersionState::kNew) return;
    transition(*v, VersionState::kLoading);
    try {
      if (!v->scan_error.empty()) throw NotFoundError(v->scan_error);
      v->servable = v->loader->load();  // warmed up; metrics recorded
    } catch (const std::exception& e) {
      std::string msg = e.what();
      v->life.fail(msg);
      spdlog::error("serving: {} version {}: Loading -> Error: {}", v->model, v->version, msg);
      set_state_gauge(*v);
      return;
    }
    if (batcher_) {
      Servable* raw = v->servable.get();  // removed with the queue (in unload()) before the servable goes
      // Unset parameters take the defaults of the device the version is on
      // (a GPU's gathers larger batches, in page-locked memory).
      v->batch_queue = batcher_->add_queue(
          batching_for_device(o.batching, raw->device()),
          [raw](const std::string& sig, const TensorMap& batch) { return raw->predict(batch, sig); },
          string_signatures(raw->signatures()));
    }
    {
      std::unique_lock<std::shared_mutex> l(mu_);  // routing sees it from now on
      transition(*v, VersionState::kReady);
    }
  }

  void unload(std::shared_ptr<VersionEntry> v) {
    {
      std::unique_lock<std::shared_mutex> l(mu_);  // no get() between the check and the lease
      VersionState s = v->life.state();
      if (s == VersionState::kNew) {
        transition(*v, VersionState::kDisabled);
        return;
      }
      if (s != VersionState::kReady) return;
      transition(*v, VersionState::kQuiescing);
    }
    {
      std::unique_lock<std::mutex> l(v->mu);
      v->cv.wait(l, [&] { return v->in_flight == 0; });
    }
    transition(*v, VersionState::kUnloading);
    // Every request in the queue holds a handle, so it drained before
    // in_flight reached 0; one left (its blocking caller gave up at its
    // deadline) gets UNAVAILABLE. Waits for a batch still running.
    if (v->batch_queue) batcher_->remove_queue(v->batch_queue);
    v->batch_queue.reset();
    v->loader->unload(std::move(v->servable));  // frees it and trims the heap
    transition(*v, VersionState::kDisabled);
  }

  // Brings one model's versions toward what its policy aspires to.
  // log_unreadable: log each version directory that cannot be read (a
  // symlink loop): once per poll, not again on the reconciles that follow
  // each load and unload.
  void reconcile_model(const std::shared_ptr<ModelEntry>& m, bool removed, bool log_unreadable = false) {
    std::map<int64_t, VersionDir> on_disk =
        removed ? std::map<int64_t, VersionDir>{} : scan_versions(m->config.base_path);
    if (log_unreadable)
      for (auto& [v, d] : on_disk)
        if (!d.error.empty()) spdlog::error("serving: {} version {}: {}", m->config.name, v, d.error);
    const std::set<int64_t> aspired = aspired_versions(m->config.version_policy, on_disk, removed);

    std::vector<std::shared_ptr<VersionEntry>> to_load, to_unload;
    {
      std::unique_lock<std::shared_mutex> l(mu_);
      std::vector<KnownVersion> known;
      for (auto& [v, e] : m->versions) {
        KnownVersion k{v, e->life.state(), e->unload_scheduled, false};
        auto d = on_disk.find(v);
        k.changed_on_disk = d != on_disk.end() && d->second.model_json_mtime != e->model_json_mtime;
        known.push_back(k);
      }
      TransitionPlan plan =
          plan_transitions(aspired, known, {.removed = removed, .resource_preserving = o.resource_preserving});
      for (int64_t v : plan.unload) {
        auto& e = m->versions.at(v);
        if (e->life.state() == VersionState::kReady) e->unload_scheduled = true;
        to_unload.push_back(e);
      }
      for (int64_t v : plan.load) {
        auto e = std::make_shared<VersionEntry>();
        e->model = m->config.name;
        e->version = v;
        e->model_json_mtime = on_disk.at(v).model_json_mtime;
        e->scan_error = on_disk.at(v).error;
        e->loader = std::make_unique<VersionLoader>(LoaderOptions{.model = e->model,
                                                                  .version = v,
                                                                  .platform = m->config.model_platform,
                                                                  .dir = on_disk.at(v).dir,
                                                                  .enable_warmup = o.enable_warmup},
                                                    metrics);
        m->versions[v] = e;
        to_load.push_back(e);
        spdlog::info("serving: {} version {}: found at {}", e->model, v, e->loader->options().dir);
      }
    }
    std::weak_ptr<ModelEntry> weak = m;
    for (auto& e : to_load)
      submit([this, e, weak, removed] {
        load(e);
        if (auto mm = weak.lock()) reconcile_later(mm, removed);
      });
    for (auto& e : to_unload)
      submit([this, e, weak, removed] {
        unload(e);
        if (auto mm = weak.lock()) reconcile_later(mm, removed);
      });
  }

  void reconcile_later(const std::shared_ptr<ModelEntry>& m, bool removed) {
    std::lock_guard<std::mutex> l(reconcile_mu_);
    bool still = false;
    {
      std::shared_lock<std::shared_mutex> rl(mu_);
      auto it = models_.find(m->config.name);
      still = it != models_.end() && it->second == m;
    }
    reconcile_model(m, removed || !still);
  }

  void poll() {
    std::lock_guard<std::mutex> l(reconcile_mu_);
    std::vector<std::shared_ptr<ModelEntry>> ms;
    {
      std::shared_lock<std::shared_mutex> rl(mu_);
      for (auto& [n, m] : models_) ms.push_back(m);
    }
    for (auto& m : ms) reconcile_model(m, false, /*log_unreadable=*/true);
  }

  void apply_config(const ModelServerConfig& cfg) {
    std::lock_guard<std::mutex> l(reconcile_mu_);
    std::vector<std::shared_ptr<ModelEntry>> removed, kept;
    {
      std::unique_lock<std::shared_mutex> wl(mu_);
      std::map<std::string, std::shared_ptr<ModelEntry>> next;
      for (auto& mc : cfg.models) {
        auto it = models_.find(mc.name);
        std::shared_ptr<ModelEntry> m;
        if (it != models_.end() && it->second->config.base_path == mc.base_path &&
            it->second->config.model_platform == mc.model_platform) {
          m = it->second;
          m->config = mc;  // policy and labels apply on this reconcile
        } else {
          if (it != models_.end()) removed.push_back(it->second);
          m = std::make_shared<ModelEntry>();
          m->config = mc;
          spdlog::info("serving: model {} added (base_path {})", mc.name, mc.base_path);
        }
        next[mc.name] = m;
        kept.push_back(m);
      }
      for (auto& [n, m] : models_)
        if (!next.count(n)) {
          removed.push_back(m);
          spdlog::info("serving: model {} removed", n);
        }
      models_ = std::move(next);
    }
    for (auto& m : removed) reconcile_model(m, true);
    for (auto& m : kept) reconcile_model(m, false, /*log_unreadable=*/true);
  }

  std::shared_ptr<ModelEntry> find_model(const std::string& name) const {
    auto it = models_.find(name);
    if (it == models_.end())
      throw ServingError(Code::kNotFound,
                         "Servable not found for request: Latest(" + name + "): unknown model '" + name + "'");
    return it->second;
  }

  // Resolves spec to a version number (label -> version). Under mu_.
  std::optional<int64_t> resolve(const ModelEntry& m, const ModelSpec& spec) const {
    if (spec.version && spec.label) throw ServingError(Code::kInvalidArgument, "give a version or a label, not both");
    if (spec.label) {
      auto it = m.config.version_labels.find(*spec.label);
      if (it == m.config.version_labels.end())
        throw ServingError(Code::kNotFound, "Unrecognized servable version label: " + *spec.label);
      return it->second;
    }
    return spec.version;
  }
};

ServerCore::ServerCore(ServerCoreOptions options)
    : options_(std::move(options)), metrics_(std::make_unique<MetricsRegistry>()) {
  options_.validate();
  impl_ = std::make_unique<Impl>(this, options_, *metrics_);
  impl_->loaders_ =
      std::make_unique<ThreadPool>(ThreadPoolOptions{.num_threads = static_cast<int>(options_.num_load_threads)});
}

ServerCore::~ServerCore() {
  stop();
  impl_->loaders_->shutdown(ThreadPool::QueuedWork::kDiscard);
}

void ServerCore::start() {
  impl_->apply_config(options_.config);
  // Wait for the first aspired versions (they may also fail; then status says so).
  wait_until_idle(options_.initial_load_timeout_seconds);
  if (options_.file_system_poll_wait_seconds > 0 && !impl_->poller_.joinable()) {
    impl_->poller_ = std::thread([this] {
      std::unique_lock<std::mutex> l(impl_->poll_mu_);
      while (!impl_->poll_stop_) {
        impl_->poll_cv_.wait_for(l, std::chrono::duration<double>(options_.file_system_poll_wait_seconds),
                                 [&] { return impl_->poll_stop_; });
        if (impl_->poll_stop_) break;
        l.unlock();
        try {
          impl_->poll();
        } catch (const std::exception& e) {
          spdlog::error("serving: file system poll failed: {}", e.what());
        }
        l.lock();
      }
    });
  }
}

void ServerCore::stop() {
  {
    std::lock_guard<std::mutex> l(impl_->poll_mu_);
    impl_->poll_stop_ = true;
  }
  impl_->poll_cv_.notify_all();
  if (impl_->poller_.joinable()) impl_->poller_.join();
}

ServableHandlePtr ServerCore::get(const ModelSpec& spec) const {
  std::shared_lock<std::shared_mutex> l(impl_->mu_);
  auto m = impl_->find_model(spec.name);
  auto want = impl_->resolve(*m, spec);
  std::shared_ptr<VersionEntry> v;
  if (want) {
    auto it = m->versions.find(*want);
    if (it == m->versions.end() || it->second->life.state() != VersionState::kReady)
      throw ServingError(Code::kNotFound, "Servable not found for request: " + spec_str(spec));
    v = it->second;
  } else {
    for (auto it = m->versions.rbegin(); it != m->versions.rend(); ++it)
      if (it->second->life.state() == VersionState::kReady) {
        v = it->second;
        break;
      }
    if (!v)
      throw ServingError(Code::kUnavailable, "Servable not found for request: " + spec_str(spec) + ": no version of '" +
                                                 spec.name + "' is available yet");
  }
  {
    std::lock_guard<std::mutex> g(v->mu);
    ++v->in_flight;
  }
  auto h = std::make_shared<ServableHandle>();
  h->model_name = spec.name;
  h->version = v->version;
  h->servable = v->servable;
  h->lease = std::shared_ptr<void>(nullptr, [v](void*) {
    std::lock_guard<std::mutex> g(v->mu);
    if (--v->in_flight == 0) v->cv.notify_all();
  });
  return h;
}

TensorMap ServerCore::predict(const ServableHandle& handle, const std::string& signature, const TensorMap& inputs,
                              Deadline deadline, RequestTiming* timing) {
  auto r = std::make_shared<AwaitedOutputs<RequestTiming>>();
  // With batching the callback may outlive this call (the caller gives up
  // at its deadline), so it gets its own copy of the handle; without, it
  // runs before predict_async returns and borrowing is enough.
  ServableHandlePtr h = impl_->batcher_ || impl_->compute_ ? std::make_shared<const ServableHandle>(handle)
                                                           : ServableHandlePtr(std::shared_ptr<void>(), &handle);
  predict_async(std::move(h), signature, inputs, deadline,
                [r](std::exception_ptr error, TensorMap outputs, const RequestTiming& t) {
                  r->set(error, std::move(outputs), t);
                });
  std::unique_lock<std::mutex> l(r->mu);
  if (!deadline) {
    r->cv.wait(l, [&] { return r->done; });
  } else if (!r->cv.wait_until(l, *deadline, [&] { return r->done; })) {
    // The request stays queued; its batch drops it (not computed) as expired.
    throw ServingError(Code::kDeadlineExceeded, "deadline exceeded while waiting for the batch");
  }
  if (r->error) std::rethrow_exception(r->error);
  if (timing) {
    timing->queue_us = r->timing.queue_us;
    timing->compute_us = r->timing.compute_us;
    timing->batch_size = r->timing.batch_size;
  }
  return std::move(r->outputs);
}

namespace {

// "part\0part\0...": a key for the series caches, built in `key` (a
// thread's reused buffer: no allocation once it has grown).
void series_key(std::string& key, std::initializer_list<std::string_view> parts) {
  key.clear();
  for (std::string_view p : parts) {
    key.append(p.data(), p.size());
    key.push_back('\0');
  }
}

// The cached value for `key`, made by make() (outside the lock; the
// registry has its own) on first use.
template <class V, class Make>
V cached_series(std::shared_mutex& mu, std::unordered_map<std::string, V>& cache, const std::string& key, Make make) {
  {
    std::shared_lock<std::shared_mutex> l(mu);
    auto it = cache.find(key);
    if (it != cache.end()) return it->second;
  }
  V v = make();
  std::unique_lock<std::shared_mutex> l(mu);
  return cache.emplace(key, v).first->second;
}

// A request with batching off: run on a compute thread (or the caller's).
struct UnbatchedRequest {
  ServableHandlePtr handle;
  std::string signature;
  TensorMap inputs;
  Deadline deadline;
  ServerCore::PredictDone done;
  Clock::time_point queued;

  void run() {
    RequestTiming t;
    TensorMap out;
    std::exception_ptr err;
    try {
      auto start = Clock::now();
      t.queue_us = std::chrono::duration_cast<std::chrono::microseconds>(start - queued).count();
      if (deadline && start >= *deadline)
        throw ServingError(Code::kDeadlineExceeded, "deadline exceeded before compute");
      out = handle->servable->predict(inputs, signature);
      t.compute_us = micros_since(start);
      t.batch_size = inputs.empty() || inputs.begin()->second.dim() == 0 ? 1 : inputs.begin()->second.size(0);
    } catch (...) {
      err = std::current_exception();
      out.clear();
    }
    done(err, std::move(out), t);
  }
};

}  // namespace

void ServerCore::predict_async(ServableHandlePtr handle, std::string signature, TensorMap inputs, Deadline deadline,
                               PredictDone done) {
  if (signature.empty()) signature = kDefaultSignature;
  if (BatchQueuePtr queue = impl_->batch_queue_of(*handle)) {
    impl_->batcher_->schedule(queue, signature, std::move(inputs), deadline,
                              [this, handle = std::move(handle), done = std::move(done)](
                                  std::exception_ptr error, TensorMap outputs, const BatchTiming& bt) {
                                RequestTiming t;
                                t.queue_us = bt.queue_us;
                                t.compute_us = bt.compute_us;
                                t.batch_size = bt.batch_size;
                                if (!error) {
                                  thread_local std::string key;
                                  series_key(key, {handle->model_name});
                                  cached_series(impl_->series_mu_, impl_->batch_sizes_, key, [&] {
                                    return &metrics_->histogram("kiln_batch_size",
                                                                "Rows per executed batch (with padding)",
                                                                {{"model", handle->model_name}}, batch_size_buckets());
                                  })->observe((double)bt.batch_size);
                                }
                                done(error, std::move(outputs), t);
                              });  // the scheduler drops this callback (and the handle) right after it runs
    return;
  }
  auto req = std::make_shared<UnbatchedRequest>(UnbatchedRequest{
      std::move(handle), std::move(signature), std::move(inputs), deadline, std::move(done), Clock::now()});
  if (!impl_->compute_) return req->run();
  const ComputePool::Submit s = impl_->compute_->submit([req] { req->run(); });
  if (s == ComputePool::Submit::kQueued) return;
  const bool full = s == ComputePool::Submit::kFull;
  req->done(std::make_exception_ptr(
                ServingError(full ? Code::kResourceExhausted : Code::kUnavailable,
                             full ? "the compute queue is full (" + std::to_string(options_.max_queued_computes) +
                                        " requests waiting); retry later, or raise max_queued_computes"
                                  : "the server is stopping")),
            TensorMap{}, RequestTiming{});
}

void ServerCore::record_request(const std::string& model, int64_t version, const std::string& protocol,
                                const std::string& api, const Status& status, const RequestTiming& t) {
  thread_local std::string key;
  const std::string ver = version > 0 ? std::to_string(version) : "";
  const char* code = code_name(status.code);
  series_key(key, {model, ver, protocol, api, code});
  cached_series(impl_->series_mu_, impl_->requests_, key, [&] {
    return &metrics_->counter(
        "kiln_requests_total", "Requests by model, version, protocol, api and status code",
        {{"model", model}, {"version", ver}, {"protocol", protocol}, {"api", api}, {"code", code}});
  })->inc();
  if (!status.ok()) return;
  static const char* const kPhases[5] = {"parse", "queue", "compute", "serialize", "total"};
  series_key(key, {model, ver, protocol});
  const std::array<Histogram*, 5> h = cached_series(impl_->series_mu_, impl_->phases_, key, [&] {
    std::array<Histogram*, 5> made{};
    for (int i = 0; i < 5; ++i)
      made[i] = &metrics_->histogram(
          "kiln_request_latency_seconds", "Request latency by phase (parse, queue, compute, serialize, total)",
          {{"model", model}, {"version", ver}, {"protocol", protocol}, {"phase", kPhases[i]}});
    return made;
  });
  const int64_t us[5] = {t.parse_us, t.queue_us, t.compute_us, t.serialize_us,
                         t.parse_us + t.queue_us + t.compute_us + t.serialize_us};
  for (int i = 0; i < 5; ++i) h[i]->observe(us[i] / 1e6);
}

std::vector<VersionStatus> ServerCore::model_status(const ModelSpec& spec) const {
  std::shared_lock<std::shared_mutex> l(impl_->mu_);
  auto m = impl_->find_model(spec.name);
  auto want = impl_->resolve(*m, spec);
  std::vector<VersionStatus> out;
  for (auto it = m->versions.rbegin(); it != m->versions.rend(); ++it) {
    if (want && it->first != *want) continue;
    out.push_back({it->first, it->second->life.state(), it->second->life.error()});
  }
  if (want && out.empty()) throw ServingError(Code::kNotFound, "Servable not found for request: " + spec_str(spec));
  return out;
}

std::vector<std::string> ServerCore::model_names() const {
  std::shared_lock<std::shared_mutex> l(impl_->mu_);
  std::vector<std::string> out;
  for (auto& [n, m] : impl_->models_) out.push_back(n);
  return out;
}

bool ServerCore::ready() const {
  std::shared_lock<std::shared_mutex> l(impl_->mu_);
  for (auto& [n, m] : impl_->models_) {
    bool any = false;
    for (auto& [v, e] : m->versions) any = any || e->life.state() == VersionState::kReady;
    if (!any) return false;
  }
  return true;
}

bool ServerCore::is_ready(const ModelSpec& spec) const {
  try {
    get(spec);
    return true;
  } catch (const ServingError&) {
    return false;
  }
}

ModelServerConfig ServerCore::config() const {
  std::shared_lock<std::shared_mutex> l(impl_->mu_);
  ModelServerConfig c;
  for (auto& [n, m] : impl_->models_) c.models.push_back(m->config);
  return c;
}

void ServerCore::reload_config(const ModelServerConfig& config) {
  config.validate();
  impl_->apply_config(config);
}

void ServerCore::load_model(const ModelConfig& model) {
  model.validate();
  ModelServerConfig c = config();
  bool replaced = false;
  for (auto& m : c.models)
    if (m.name == model.name) m = model, replaced = true;
  if (!replaced) c.models.push_back(model);
  reload_config(c);
}

void ServerCore::unload_model(const std::string& name) {
  ModelServerConfig c = config();
  auto it = std::find_if(c.models.begin(), c.models.end(), [&](const ModelConfig& m) { return m.name == name; });
  if (it == c.models.end()) throw ServingError(Code::kNotFound, "unknown model '" + name + "'");
  c.models.erase(it);
  reload_config(c);
}

void ServerCore::poll_now() { impl_->poll(); }

bool ServerCore::wait_until_ready(const ModelSpec& spec, double timeout_seconds) const {
  auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_seconds));
  for (;;) {
    const bool was_idle = impl_->loaders_->wait_until_idle(Clock::now());
    if (is_ready(spec)) return true;
    const auto now = Clock::now();
    if (now >= end) return false;
    // Look again when the loaders go idle, or every 20 ms (a load may be
    // queued by a poll at any time).
    const auto step = std::min(end, now + std::chrono::milliseconds(20));
    if (was_idle)
      std::this_thread::sleep_until(step);
    else
      impl_->loaders_->wait_until_idle(step);
  }
}

bool ServerCore::wait_until_idle(double timeout_seconds) const {
  auto end = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_seconds));
  return impl_->loaders_->wait_until_idle(end);
}

}  // namespace kiln::serving
