// Automatic batching (TF Serving's SharedBatchScheduler + BasicBatchScheduler
// semantics): requests that arrive close together for the same servable
// version and signature are concatenated along dim 0, run once, and split
// back. One SharedBatchScheduler owns num_batch_threads threads that serve
// the queues of every model version, as TF Serving shares one batch thread
// pool across servables.
//
//   SharedBatchScheduler s(opts);                                  // starts the threads
//   BatchQueuePtr q = s.add_queue([&](const std::string& sig, const TensorMap& batch) {
//     return servable->predict(batch, sig); });                    // one per version
//   s.schedule(q, "serving_default", inputs, deadline,
//              [](std::exception_ptr err, TensorMap out, const BatchTiming& t) { ... });  // returns at once
//   TensorMap out = s.run(q, "serving_default", inputs, deadline); // blocking wrapper
//   s.remove_queue(q);                                             // at unload
//
// Per queue (a version), requests are grouped by signature and input shapes
// and dtypes (a "lane": only same-shaped rows can be concatenated). A string
// input (a queue's StringSignatures) is grouped by its logical shape: rows of
// different widths join in one batch, padded to the widest (strings::concat),
// and string outputs of a request split into pieces join the same way.
// - A lane's batch closes when it reaches max_batch_size or its oldest
//   request has waited batch_timeout_micros. With allowed_batch_sizes, a
//   batch is padded (repeating the last row) up to the next allowed size; the
//   padding rows are dropped from the outputs.
// - A request with more rows than max_batch_size is split into pieces, not
//   rejected; its outputs are concatenated back in order.
// - At most max_enqueued_batches batches wait per queue; beyond that the
//   request fails at once with ServingError RESOURCE_EXHAUSTED (HTTP 429)
//   instead of the queue growing.
// - A request whose deadline has passed when its batch starts fails with
//   DEADLINE_EXCEEDED and is not computed (deadlines are checked when a
//   batch forms, not by a timer: a request stuck behind busy threads learns
//   of its deadline when a thread reaches its lane).
// - Fairness: the batch threads take ready lanes (full, or timed out) in
//   round-robin order across every queue of the scheduler, so a busy model
//   cannot starve another one; within a lane requests are FIFO.
// Thread safety: every member is thread-safe. Time comes from a BatchClock
// (the steady clock unless a test injects a FakeBatchClock, fake_clock.h).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kiln/serving/core/servable.h"

namespace kiln::serving {

using Clock = std::chrono::steady_clock;
using Deadline = std::optional<Clock::time_point>;

// Unset max_batch_size and batch_timeout_micros take the defaults of the
// device the version computes on (batching_for_device below): a value
// someone set, in a parameters file or here, always wins.
struct BatchingOptions {
  std::optional<int64_t> max_batch_size;        // default: 32 on the CPU, 256 on a GPU
  std::optional<int64_t> batch_timeout_micros;  // default: 1000 on the CPU, 2000 on a GPU
  int64_t num_batch_threads = 2;
  int64_t max_enqueued_batches = 64;
  std::vector<int64_t> allowed_batch_sizes;  // ascending; last == max_batch_size
  bool pad_variable_length_inputs = false;   // accepted, not supported (throws if true)
  // kiln's: assemble each batch in page-locked (pinned) host memory, so its
  // copy to the GPU is asynchronous. batching_for_device sets it for a GPU;
  // needs LibTorch's CUDA build and a GPU.
  bool pin_batches = false;
  void validate() const;  // ValueError naming the field and value
  Json to_json() const;   // unset fields as null
};

// The defaults for a version on `device`. A CPU batch is worth closing
// early: a CPU's matrix product costs about the same per row at 32 rows as
// at 256, so waiting buys little. A GPU computes a batch of 256 rows of a
// Dense(4096) in about the time of one row (the launches dominate), so
// TF Serving's guidance for GPUs applies: a larger max_batch_size and a
// timeout of a few milliseconds, long enough for many clients' rows to
// gather, short enough to stay within a request's latency budget.
constexpr int64_t kCpuMaxBatchSize = 32;
constexpr int64_t kCpuBatchTimeoutMicros = 1000;
constexpr int64_t kGpuMaxBatchSize = 256;
constexpr int64_t kGpuBatchTimeoutMicros = 2000;

// `configured` with its unset max_batch_size / batch_timeout_micros filled
// in with the defaults of `device` (above; the CPU's for the CPU, a GPU's
// for any other device; with allowed_batch_sizes, the last of them is the
// max_batch_size), and pin_batches set when `device` is not the CPU.
// Pure: no device is touched, so it may be called for a device this
// machine lacks. The other fields are kept as they are.
BatchingOptions batching_for_device(const BatchingOptions& configured, const at::Device& device);

// TF Serving's batching_parameters text format:
//   max_batch_size { value: 128 }  batch_timeout_micros { value: 0 }
//   num_batch_threads { value: 8 } max_enqueued_batches { value: 100 }
//   allowed_batch_sizes: 32 allowed_batch_sizes: 128
// (a tensorflow.serving.BatchingParameters message, read by libprotobuf's
// TextFormat). ValueError "<source>: line L, column C: ..." on bad syntax or
// unknown fields; validate()'s errors on bad values.
BatchingOptions parse_batching_parameters(const std::string& text, const std::string& source = "batching parameters");

// Per-request times the scheduler measured (for metrics), microseconds.
struct BatchTiming {
  int64_t queue_us = 0;    // enqueue -> batch start
  int64_t compute_us = 0;  // the batch's compute
  int64_t batch_size = 0;  // rows in the batch that ran (with padding)
};

// What a blocking wrapper over an asynchronous call waits for: the callback
// (on another thread) set()s it once; the caller waits on cv until done.
template <class Timing>
struct AwaitedOutputs {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;         // guarded by mu
  std::exception_ptr error;  // guarded by mu
  TensorMap outputs;         // guarded by mu
  Timing timing;             // guarded by mu
  void set(std::exception_ptr e, TensorMap o, const Timing& t) {
    std::lock_guard<std::mutex> l(mu);
    error = e;
    outputs = std::move(o);
    timing = t;
    done = true;
    cv.notify_all();
  }
};

// The time source of a scheduler: what "now" is, and how a thread sleeps
// until a time passes or it is notified. Tests inject a FakeBatchClock
// (kiln/serving/batching/fake_clock.h) to move time by hand.
class BatchClock {
 public:
  virtual ~BatchClock() = default;
  virtual Clock::time_point now() const = 0;
  // Called with `lock` held on the mutex that guards what the caller waits
  // for; returns (with `lock` held again) once `cv` is notified or now()
  // reaches `until` (Clock::time_point::max(): no time limit). May return
  // early (spuriously): callers re-check their condition in a loop.
  virtual void wait_until(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, Clock::time_point until) = 0;
};
// The steady clock; lives for the whole process.
BatchClock& steady_batch_clock();

// One queue of a SharedBatchScheduler (a model version); opaque. The
// scheduler keeps its own reference; a removed queue refuses new requests.
struct BatchQueue;
using BatchQueuePtr = std::shared_ptr<BatchQueue>;

// The string tensors of each signature a queue serves, by signature name.
using StringSignatures = std::map<std::string, StringTensorNames>;
// Those of every signature in `signatures` (Servable::signatures()) that has any.
StringSignatures string_signatures(const Json& signatures);

class SharedBatchScheduler {
 public:
  using BatchFn = std::function<TensorMap(const std::string& signature, const TensorMap& batch)>;
  // The outputs, or the error (a ServingError with its code, or whatever the
  // batch function threw) with empty outputs. Must not throw (what it
  // throws is logged and dropped) and should not block: it runs on a batch
  // thread.
  using DoneFn = std::function<void(std::exception_ptr error, TensorMap outputs, const BatchTiming& timing)>;

  // Starts options.num_batch_threads threads (validated: ValueError). The
  // other fields are the defaults of add_queue(fn). `clock` is borrowed and
  // must outlive the scheduler; nullptr = steady_batch_clock().
  explicit SharedBatchScheduler(BatchingOptions options, BatchClock* clock = nullptr);
  // Stops and joins the threads (a running batch finishes first); requests
  // still waiting get UNAVAILABLE. No other member may run concurrently.
  ~SharedBatchScheduler();
  SharedBatchScheduler(const SharedBatchScheduler&) = delete;
  SharedBatchScheduler& operator=(const SharedBatchScheduler&) = delete;

  // A new queue whose batches `fn` computes, on the scheduler's threads
  // (one batch of a queue per thread at a time; several threads may run
  // batches of the same queue concurrently). `fn` may throw: every request
  // of that batch gets the exception. With queue_options, that queue uses
  // its max_batch_size, batch_timeout_micros, max_enqueued_batches,
  // allowed_batch_sizes and pin_batches (validated; num_batch_threads is
  // ignored). Unset fields take the CPU's defaults; call
  // batching_for_device first for a version on a GPU. `strings`: the
  // signatures' string inputs and outputs (string_signatures), whose rows
  // may differ in width.
  BatchQueuePtr add_queue(BatchFn fn);
  BatchQueuePtr add_queue(BatchingOptions queue_options, BatchFn fn, StringSignatures strings = {});
  // Removes `queue`: new requests to it fail with UNAVAILABLE, its waiting
  // requests get UNAVAILABLE (their callbacks run on the calling thread),
  // and it blocks until the queue's running batches have finished; after it
  // returns `fn` has been destroyed and is never called again. Idempotent.
  // Must not be called from a batch function (it would wait for itself);
  // calling it from a DoneFn is fine.
  void remove_queue(const BatchQueuePtr& queue);

  // Queues the request and returns; `done` runs exactly once: on the batch
  // thread that ran the request's (last) batch, or on the calling thread
  // before schedule() returns for an error found at once (INVALID_ARGUMENT:
  // no inputs, a scalar input, inputs that disagree on dim 0, zero rows;
  // DEADLINE_EXCEEDED: the deadline has already passed; RESOURCE_EXHAUSTED:
  // the queue is full; UNAVAILABLE: the queue was removed or the scheduler is
  // stopping), or on the thread that removes the queue.
  void schedule(const BatchQueuePtr& queue, const std::string& signature, TensorMap inputs, Deadline deadline,
                DoneFn done);
  // Blocking wrapper: schedule() and wait (until the deadline at most, on
  // the scheduler's clock). Throws what `done` would have received.
  TensorMap run(const BatchQueuePtr& queue, const std::string& signature, const TensorMap& inputs,
                Deadline deadline = std::nullopt, BatchTiming* timing = nullptr);

  const BatchingOptions& options() const { return options_; }
  // Batches waiting in `queue` (rows per lane rounded up to max_batch_size).
  int64_t enqueued_batches(const BatchQueuePtr& queue) const;

 private:
  struct Impl;
  BatchingOptions options_;
  std::unique_ptr<Impl> impl_;
};

// A SharedBatchScheduler with one queue: batching for one servable alone.
//
//   BatchScheduler s(opts, [&](const std::string& sig, const TensorMap& batch) {
//     return servable->predict(batch, sig); });
//   TensorMap out = s.run("serving_default", inputs, deadline);  // blocks
class BatchScheduler {
 public:
  using BatchFn = SharedBatchScheduler::BatchFn;
  using DoneFn = SharedBatchScheduler::DoneFn;
  BatchScheduler(BatchingOptions options, BatchFn fn, BatchClock* clock = nullptr);
  ~BatchScheduler();  // waiting requests get UNAVAILABLE
  BatchScheduler(const BatchScheduler&) = delete;
  BatchScheduler& operator=(const BatchScheduler&) = delete;

  // Blocks until the request's outputs are ready. Throws ServingError
  // (RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED, INVALID_ARGUMENT when inputs
  // disagree on dim 0) or whatever the batch function threw.
  TensorMap run(const std::string& signature, const TensorMap& inputs, Deadline deadline = std::nullopt,
                BatchTiming* timing = nullptr);
  // SharedBatchScheduler::schedule on the one queue.
  void schedule(const std::string& signature, TensorMap inputs, Deadline deadline, DoneFn done);

  const BatchingOptions& options() const { return scheduler_.options(); }
  int64_t enqueued_batches() const;

 private:
  SharedBatchScheduler scheduler_;
  BatchQueuePtr queue_;
};

}  // namespace kiln::serving
