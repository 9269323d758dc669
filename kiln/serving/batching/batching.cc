#include "kiln/serving/batching/batching.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "kiln/core/error.h"
#include "kiln/core/string_tensor.h"
#include "kiln/serving/codec/text_proto.h"
#include "kiln/serving/status.h"
#include "tensorflow_serving/servables/tensorflow/session_bundle_config.pb.h"

namespace kiln::serving {

void BatchingOptions::validate() const {
  auto positive = [](const char* n, int64_t v) {
    if (v < 1)
      throw ValueError(std::string("batching: `") + n + "` must be a positive integer. Received: " + n + "=" +
                       std::to_string(v));
  };
  if (max_batch_size) positive("max_batch_size", *max_batch_size);
  positive("num_batch_threads", num_batch_threads);
  positive("max_enqueued_batches", max_enqueued_batches);
  if (batch_timeout_micros && *batch_timeout_micros < 0)
    throw ValueError("batching: `batch_timeout_micros` must be >= 0. Received: " +
                     std::to_string(*batch_timeout_micros));
  if (pad_variable_length_inputs)
    throw ValueError("batching: `pad_variable_length_inputs` is not supported; set it to false");
  for (size_t i = 0; i < allowed_batch_sizes.size(); ++i) {
    positive("allowed_batch_sizes", allowed_batch_sizes[i]);
    if (i && allowed_batch_sizes[i] <= allowed_batch_sizes[i - 1])
      throw ValueError("batching: `allowed_batch_sizes` must be strictly increasing");
  }
  // Unset, max_batch_size becomes the last allowed size (batching_for_device).
  if (!allowed_batch_sizes.empty() && max_batch_size && allowed_batch_sizes.back() != *max_batch_size)
    throw ValueError("batching: the last of `allowed_batch_sizes` must equal max_batch_size (" +
                     std::to_string(*max_batch_size) + "). Received: " + std::to_string(allowed_batch_sizes.back()));
}

Json BatchingOptions::to_json() const {
  auto optional = [](const std::optional<int64_t>& v) { return v ? Json(*v) : Json(nullptr); };
  return Json{{"max_batch_size", optional(max_batch_size)},
              {"batch_timeout_micros", optional(batch_timeout_micros)},
              {"num_batch_threads", num_batch_threads},
              {"max_enqueued_batches", max_enqueued_batches},
              {"allowed_batch_sizes", allowed_batch_sizes},
              {"pad_variable_length_inputs", pad_variable_length_inputs},
              {"pin_batches", pin_batches}};
}

BatchingOptions batching_for_device(const BatchingOptions& configured, const at::Device& device) {
  BatchingOptions o = configured;
  const bool gpu = !device.is_cpu();
  if (!o.max_batch_size && !o.allowed_batch_sizes.empty()) o.max_batch_size = o.allowed_batch_sizes.back();
  if (!o.max_batch_size) o.max_batch_size = gpu ? kGpuMaxBatchSize : kCpuMaxBatchSize;
  if (!o.batch_timeout_micros) o.batch_timeout_micros = gpu ? kGpuBatchTimeoutMicros : kCpuBatchTimeoutMicros;
  if (gpu) o.pin_batches = true;
  return o;
}

BatchingOptions parse_batching_parameters(const std::string& text, const std::string& source) {
  tensorflow::serving::BatchingParameters p;
  parse_text_proto(text, source, &p);
  BatchingOptions o;
  if (p.has_max_batch_size()) o.max_batch_size = p.max_batch_size().value();
  if (p.has_batch_timeout_micros()) o.batch_timeout_micros = p.batch_timeout_micros().value();
  if (p.has_num_batch_threads()) o.num_batch_threads = p.num_batch_threads().value();
  if (p.has_max_enqueued_batches()) o.max_enqueued_batches = p.max_enqueued_batches().value();
  o.allowed_batch_sizes.assign(p.allowed_batch_sizes().begin(), p.allowed_batch_sizes().end());
  o.pad_variable_length_inputs = p.pad_variable_length_inputs();
  // thread_pool_name, enable_large_batch_splitting, max_execution_batch_size:
  // accepted for compatibility; kiln always splits large requests.
  o.validate();
  return o;
}

namespace batch_detail {

// One schedule() call; its pieces (max_batch_size rows each) are tasks.
struct Request {
  std::mutex mu;
  int remaining = 0;                     // guarded by mu; pieces not finished yet
  std::vector<TensorMap> outputs;        // guarded by mu; one per piece
  std::exception_ptr error;              // guarded by mu; the first piece's error
  BatchTiming timing;                    // guarded by mu; max over pieces
  SharedBatchScheduler::DoneFn done;     // guarded by mu; moved out by the last piece
  std::set<std::string> string_outputs;  // fixed at schedule(): joined with strings::concat
};

struct Task {
  std::shared_ptr<Request> request;
  size_t piece = 0;
  TensorMap inputs;
  int64_t rows = 0;
  Clock::time_point enqueued;
  Deadline deadline;
};

// The tasks of one queue with one signature and input shapes: only these can
// be concatenated into one batch.
struct Lane {
  BatchQueuePtr queue;
  std::string key;
  std::string signature;
  std::deque<Task> tasks;
  int64_t rows = 0;
};

// What a batch gave one task.
struct Outcome {
  TensorMap outputs;
  std::exception_ptr error;
  BatchTiming timing;
};

}  // namespace batch_detail

using batch_detail::Lane;
using batch_detail::Outcome;
using batch_detail::Request;
using batch_detail::Task;

// Everything but `o`, max_batch and timeout_micros (fixed at add_queue) is
// guarded by the scheduler's mutex.
struct BatchQueue {
  BatchingOptions o;                          // resolved: max_batch_size and batch_timeout_micros are set
  int64_t max_batch = 0, timeout_micros = 0;  // theirs, unpacked
  SharedBatchScheduler::BatchFn fn;
  StringSignatures strings;                                // fixed at add_queue
  std::map<std::string, std::list<Lane>::iterator> lanes;  // key -> its lane in the ring
  int64_t enqueued_batches = 0;                            // sum of batches_for(lane.rows)
  int64_t running = 0;                                     // batches on the threads now
  bool removed = false;

  int64_t batches_for(int64_t rows) const { return (rows + max_batch - 1) / max_batch; }
  const StringTensorNames& strings_of(const std::string& signature) const {
    static const StringTensorNames kNone;
    auto it = strings.find(signature);
    return it == strings.end() ? kNone : it->second;
  }
};

namespace {

int64_t batch_micros(Clock::duration d) { return std::chrono::duration_cast<std::chrono::microseconds>(d).count(); }

std::exception_ptr batch_error(Code code, const std::string& message) {
  return std::make_exception_ptr(ServingError(code, message));
}

void call_done(SharedBatchScheduler::DoneFn& done, std::exception_ptr error, TensorMap outputs,
               const BatchTiming& timing) {
  try {
    done(error, std::move(outputs), timing);
  } catch (const std::exception& e) {
    spdlog::error("serving: a batch request's callback threw (dropped): {}", e.what());
  } catch (...) {
    spdlog::error("serving: a batch request's callback threw (dropped)");
  }
  done = nullptr;  // release what it holds (a servable handle) now, not when the task goes
}

// Records one piece's outcome; the last piece joins the outputs and calls done.
void finish_task(Task& t, Outcome outcome) {
  Request& r = *t.request;
  SharedBatchScheduler::DoneFn done;
  std::vector<TensorMap> outputs;
  std::exception_ptr error;
  BatchTiming timing;
  {
    std::lock_guard<std::mutex> l(r.mu);
    if (outcome.error && !r.error) r.error = outcome.error;
    if (!outcome.error) r.outputs[t.piece] = std::move(outcome.outputs);
    r.timing.queue_us = std::max(r.timing.queue_us, outcome.timing.queue_us);
    r.timing.compute_us = std::max(r.timing.compute_us, outcome.timing.compute_us);
    r.timing.batch_size = std::max(r.timing.batch_size, outcome.timing.batch_size);
    if (--r.remaining > 0) return;
    done = std::move(r.done);
    outputs = std::move(r.outputs);
    error = r.error;
    timing = r.timing;
  }
  TensorMap joined;
  if (!error) {
    try {
      if (outputs.size() == 1) {
        joined = std::move(outputs[0]);
      } else {
        for (auto& [name, first] : outputs[0]) {
          std::vector<at::Tensor> parts;
          for (auto& o : outputs) parts.push_back(o.at(name));
          joined[name] = r.string_outputs.count(name) ? strings::concat(parts) : at::cat(parts, 0);
        }
      }
    } catch (...) {
      error = std::current_exception();
      joined.clear();
    }
  }
  call_done(done, error, std::move(joined), timing);
}

// The requests' rows as one batch of `padded` rows (the last row repeated
// past `rows`). Pinned: in page-locked host memory (LibTorch's caching host
// allocator), the destination of the concatenation itself, so the copy to
// the GPU that follows is asynchronous and no extra host copy is made.
at::Tensor assemble_batch(const std::vector<at::Tensor>& parts, int64_t rows, int64_t padded, bool pinned) {
  if (pinned && parts[0].is_cpu() && !(parts.size() == 1 && padded == rows && parts[0].is_pinned())) {
    std::vector<int64_t> sizes = parts[0].sizes().vec();
    sizes[0] = padded;
    at::Tensor batch = at::empty(sizes, parts[0].options().pinned_memory(true));
    at::Tensor head = batch.narrow(0, 0, rows);
    if (parts.size() == 1)
      head.copy_(parts[0]);
    else
      at::cat_out(head, parts, 0);
    if (padded > rows) {
      at::Tensor tail = batch.narrow(0, rows, padded - rows);
      tail.copy_(batch.narrow(0, rows - 1, 1).expand_as(tail));  // pad with the last row
    }
    return batch;
  }
  at::Tensor cat = parts.size() == 1 ? parts[0] : at::cat(parts, 0);
  if (padded > rows) {
    std::vector<int64_t> reps(cat.dim(), 1);
    reps[0] = padded - rows;
    cat = at::cat({cat, cat.narrow(0, rows - 1, 1).repeat(reps)}, 0);  // pad with the last row
  }
  return cat;
}

class SteadyBatchClock final : public BatchClock {
 public:
  Clock::time_point now() const override { return Clock::now(); }
  void wait_until(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, Clock::time_point until) override {
    if (until == Clock::time_point::max())
      cv.wait(lock);
    else
      cv.wait_until(lock, until);
  }
};

}  // namespace

BatchClock& steady_batch_clock() {
  static auto* clock = new SteadyBatchClock;  // never destroyed: schedulers may outlive static destruction
  return *clock;
}

struct SharedBatchScheduler::Impl {
  BatchClock* clock = nullptr;
  std::mutex mu;
  std::condition_variable cv;          // idle batch threads wait on it (through the clock)
  std::condition_variable drained_cv;  // remove_queue waits on it for running batches
  std::list<Lane> ring;                // guarded by mu; every non-empty lane, in round-robin order
  std::list<Lane>::iterator next;      // guarded by mu; where the next search starts (end: begin)
  bool stopping = false;               // guarded by mu
  std::vector<std::thread> threads;

  Impl() : next(ring.end()) {}

  void erase_lane(std::list<Lane>::iterator it) {  // under mu
    it->queue->lanes.erase(it->key);
    if (next == it)
      next = ring.erase(it);
    else
      ring.erase(it);
  }

  // The first lane from `next` on whose batch may close now (full, or its
  // oldest task waited the timeout), or end() and the time to look again.
  std::list<Lane>::iterator ready(Clock::time_point now, Clock::time_point* wake) {  // under mu
    auto it = next == ring.end() ? ring.begin() : next;
    for (size_t i = 0, n = ring.size(); i < n; ++i) {
      const BatchQueue& q = *it->queue;
      auto due = it->tasks.front().enqueued + std::chrono::microseconds(q.timeout_micros);
      if (it->rows >= q.max_batch || due <= now) return it;
      *wake = std::min(*wake, due);
      if (++it == ring.end()) it = ring.begin();
    }
    return ring.end();
  }

  void loop() {
    std::unique_lock<std::mutex> l(mu);
    while (!stopping) {
      auto wake = Clock::time_point::max();
      auto it = ready(clock->now(), &wake);
      if (it == ring.end()) {
        clock->wait_until(l, cv, wake);
        continue;
      }
      BatchQueuePtr q = it->queue;
      std::string signature = it->signature;
      std::vector<Task> batch;
      int64_t rows = 0, before = it->rows;
      while (!it->tasks.empty() && rows + it->tasks.front().rows <= q->max_batch) {
        rows += it->tasks.front().rows;
        batch.push_back(std::move(it->tasks.front()));
        it->tasks.pop_front();
      }
      it->rows -= rows;
      q->enqueued_batches += q->batches_for(it->rows) - q->batches_for(before);
      next = std::next(it);  // round-robin: the next search starts after this lane
      if (it->tasks.empty()) erase_lane(it);
      ++q->running;
      bool more = !ring.empty();
      l.unlock();
      if (more) cv.notify_one();  // an idle thread may take the next batch
      std::vector<Outcome> outcomes = run_batch(*q, signature, batch);
      l.lock();
      if (--q->running == 0 && q->removed) drained_cv.notify_all();
      l.unlock();
      for (size_t i = 0; i < batch.size(); ++i) finish_task(batch[i], std::move(outcomes[i]));
      batch.clear();
      q.reset();
      l.lock();
    }
  }

  std::vector<Outcome> run_batch(BatchQueue& q, const std::string& signature, std::vector<Task>& batch) {
    std::vector<Outcome> outcomes(batch.size());
    const BatchingOptions& o = q.o;
    auto start = clock->now();
    std::vector<size_t> live;
    for (size_t i = 0; i < batch.size(); ++i) {
      Task& t = batch[i];
      bool failed;
      {
        std::lock_guard<std::mutex> rl(t.request->mu);
        failed = t.request->error != nullptr;  // another piece failed: the request has its answer
      }
      if (failed) continue;
      if (t.deadline && *t.deadline <= start) {
        outcomes[i].error =
            batch_error(Code::kDeadlineExceeded, "deadline exceeded while the request waited for a batch");
        continue;
      }
      live.push_back(i);
    }
    if (live.empty()) return outcomes;
    int64_t rows = 0;
    for (size_t i : live) rows += batch[i].rows;
    int64_t padded = rows;
    for (auto s : o.allowed_batch_sizes)
      if (s >= rows) {
        padded = s;
        break;
      }
    TensorMap out;
    std::exception_ptr err;
    try {
      TensorMap in;
      const std::set<std::string>& string_inputs = q.strings_of(signature).inputs;
      for (auto& [name, first] : batch[live[0]].inputs) {
        std::vector<at::Tensor> parts;
        for (size_t i : live) parts.push_back(batch[i].inputs.at(name));
        // Rows of one width, joined below like any tensor (pinned or not).
        if (string_inputs.count(name)) parts = strings::pad_to_widest(parts);
        in[name] = assemble_batch(parts, rows, padded, o.pin_batches);
      }
      out = q.fn(signature, in);
      for (auto& [name, t] : out)
        if (t.dim() == 0 || t.size(0) != padded)
          throw ServingError(Code::kInternal, "batched output '" + name + "' does not have the batch size " +
                                                  std::to_string(padded) + " in dim 0");
    } catch (...) {
      err = std::current_exception();
    }
    BatchTiming timing;
    timing.compute_us = batch_micros(clock->now() - start);
    timing.batch_size = padded;
    int64_t offset = 0;
    for (size_t i : live) {
      Outcome& oc = outcomes[i];
      oc.timing = timing;
      oc.timing.queue_us = batch_micros(start - batch[i].enqueued);
      oc.error = err;
      if (!err)
        for (auto& [name, v] : out) oc.outputs[name] = v.narrow(0, offset, batch[i].rows);
      offset += batch[i].rows;
    }
    return outcomes;
  }
};

SharedBatchScheduler::SharedBatchScheduler(BatchingOptions options, BatchClock* clock)
    : options_(std::move(options)), impl_(std::make_unique<Impl>()) {
  options_.validate();
  impl_->clock = clock ? clock : &steady_batch_clock();
  for (int64_t i = 0; i < options_.num_batch_threads; ++i) impl_->threads.emplace_back([this] { impl_->loop(); });
}

SharedBatchScheduler::~SharedBatchScheduler() {
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  for (auto& t : impl_->threads) t.join();
  std::vector<Task> waiting;
  for (auto& lane : impl_->ring) {
    lane.queue->lanes.clear();
    lane.queue->enqueued_batches = 0;
    for (auto& t : lane.tasks) waiting.push_back(std::move(t));
  }
  impl_->ring.clear();
  for (auto& t : waiting)
    finish_task(t, {{}, batch_error(Code::kUnavailable, "the batch scheduler is shutting down"), {}});
}

BatchQueuePtr SharedBatchScheduler::add_queue(BatchFn fn) { return add_queue(options_, std::move(fn)); }

StringSignatures string_signatures(const Json& signatures) {
  StringSignatures out;
  if (!signatures.is_object()) return out;
  for (auto& [name, sig] : signatures.items())
    if (StringTensorNames n = string_tensor_names(signatures, name); !n.empty()) out[name] = std::move(n);
  return out;
}

BatchQueuePtr SharedBatchScheduler::add_queue(BatchingOptions queue_options, BatchFn fn, StringSignatures strings) {
  queue_options.validate();
  if (!fn) throw ValueError("batching: add_queue needs a batch function");
  auto q = std::make_shared<BatchQueue>();
  // Unset fields: the CPU's defaults, unless the caller filled them for its device.
  q->o = batching_for_device(queue_options, at::Device(at::kCPU));
  q->max_batch = *q->o.max_batch_size;
  q->timeout_micros = *q->o.batch_timeout_micros;
  q->fn = std::move(fn);
  q->strings = std::move(strings);
  return q;
}

void SharedBatchScheduler::remove_queue(const BatchQueuePtr& q) {
  if (!q) return;
  std::vector<Task> waiting;
  BatchFn fn;
  {
    std::unique_lock<std::mutex> l(impl_->mu);
    q->removed = true;
    std::vector<std::list<Lane>::iterator> lanes;
    for (auto& [key, it] : q->lanes) lanes.push_back(it);
    for (auto it : lanes) {
      for (auto& t : it->tasks) waiting.push_back(std::move(t));
      impl_->erase_lane(it);
    }
    q->enqueued_batches = 0;
    impl_->drained_cv.wait(l, [&] { return q->running == 0; });
    fn = std::move(q->fn);
    q->fn = nullptr;
  }
  fn = nullptr;  // destroyed here, outside the lock
  for (auto& t : waiting)
    finish_task(
        t, {{}, batch_error(Code::kUnavailable, "the model version is unloading: its batch queue was removed"), {}});
}

void SharedBatchScheduler::schedule(const BatchQueuePtr& queue, const std::string& signature, TensorMap inputs,
                                    Deadline deadline, DoneFn done) {
  auto fail = [&](Code code, const std::string& message) { call_done(done, batch_error(code, message), {}, {}); };
  if (!queue) return fail(Code::kInternal, "batching: schedule() got no queue");
  if (inputs.empty()) return fail(Code::kInvalidArgument, "a request needs at least one input tensor");
  int64_t rows = -1;
  std::string key = signature;
  const StringTensorNames& strings = queue->strings_of(signature);
  for (auto& [name, t] : inputs) {
    // A string tensor's last dimension is its width, which may differ between requests of one lane.
    const int64_t width_dims = strings.inputs.count(name) ? 1 : 0;
    if (!t.defined() || t.dim() <= width_dims)
      return fail(Code::kInvalidArgument, "batching needs a batch dimension: input '" + name + "' is a scalar");
    if (rows >= 0 && t.size(0) != rows)
      return fail(Code::kInvalidArgument, "inputs disagree on the batch size (dim 0): " + std::to_string(rows) +
                                              " vs " + std::to_string(t.size(0)) + " for '" + name + "'");
    rows = t.size(0);
    key += "|" + name + ":" + std::to_string((int)t.scalar_type()) + (width_dims ? "s" : "");
    for (int64_t d = 1; d < t.dim() - width_dims; ++d) key += "," + std::to_string(t.size(d));
  }
  if (rows == 0) return fail(Code::kInvalidArgument, "a request needs at least one row (dim 0 is 0)");
  const BatchingOptions& o = queue->o;
  auto now = impl_->clock->now();
  if (deadline && *deadline <= now)
    return fail(Code::kDeadlineExceeded, "deadline exceeded before the request was queued");
  int64_t m = queue->max_batch;
  int64_t pieces = (rows + m - 1) / m;
  auto req = std::make_shared<Request>();
  req->remaining = (int)pieces;
  req->outputs.resize(pieces);
  req->done = std::move(done);
  req->string_outputs = strings.outputs;
  std::vector<Task> tasks;
  for (int64_t p = 0; p < pieces; ++p) {
    Task t;
    t.request = req;
    t.piece = p;
    t.rows = std::min(m, rows - p * m);
    for (auto& [name, v] : inputs) t.inputs[name] = pieces == 1 ? v : v.narrow(0, p * m, t.rows);
    t.enqueued = now;
    t.deadline = deadline;
    tasks.push_back(std::move(t));
  }
  inputs.clear();
  std::exception_ptr refused;
  bool wake = false;
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    auto found = queue->lanes.find(key);
    int64_t before = found == queue->lanes.end() ? 0 : found->second->rows;
    int64_t after = queue->enqueued_batches - queue->batches_for(before) + queue->batches_for(before + rows);
    if (impl_->stopping) {
      refused = batch_error(Code::kUnavailable, "the batch scheduler is shutting down");
    } else if (queue->removed) {
      refused = batch_error(Code::kUnavailable, "the model version is unloading: its batch queue was removed");
    } else if (after > o.max_enqueued_batches) {
      refused = batch_error(Code::kResourceExhausted, "the batch queue is full (max_enqueued_batches=" +
                                                          std::to_string(o.max_enqueued_batches) + "); retry later");
    } else {
      std::list<Lane>::iterator lane;
      if (found != queue->lanes.end()) {
        lane = found->second;
      } else {
        // A new lane goes last in the current round (just before the cursor).
        lane = impl_->ring.insert(impl_->next, Lane{queue, key, signature, {}, 0});
        queue->lanes[key] = lane;
      }
      for (auto& t : tasks) lane->tasks.push_back(std::move(t));
      lane->rows += rows;
      queue->enqueued_batches = after;
      // Wake a batch thread only when this can change what it does: the lane
      // was empty (a new timeout to wait for) or a batch is now full.
      // Requests in between join the batch without a wake-up each (a thread
      // busy running a batch re-checks the lanes when it ends).
      wake = before == 0 || before + rows >= m;
    }
  }
  if (refused) {
    // Nothing was queued: the one request's callback answers now.
    call_done(req->done, refused, {}, {});
    return;
  }
  if (wake) impl_->cv.notify_one();
}

TensorMap SharedBatchScheduler::run(const BatchQueuePtr& queue, const std::string& signature, const TensorMap& inputs,
                                    Deadline deadline, BatchTiming* timing) {
  auto r = std::make_shared<AwaitedOutputs<BatchTiming>>();
  schedule(queue, signature, inputs, deadline, [r](std::exception_ptr error, TensorMap outputs, const BatchTiming& t) {
    r->set(error, std::move(outputs), t);
  });
  std::unique_lock<std::mutex> l(r->mu);
  while (!r->done) {
    // Past the deadline the caller gives up; the request stays queued and
    // is dropped (not computed) when its batch forms.
    if (deadline && impl_->clock->now() >= *deadline)
      throw ServingError(Code::kDeadlineExceeded, "deadline exceeded while waiting for the batch");
    impl_->clock->wait_until(l, r->cv, deadline.value_or(Clock::time_point::max()));
  }
  if (r->error) std::rethrow_exception(r->error);
  if (timing) *timing = r->timing;
  return std::move(r->outputs);
}

int64_t SharedBatchScheduler::enqueued_batches(const BatchQueuePtr& queue) const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return queue ? queue->enqueued_batches : 0;
}

BatchScheduler::BatchScheduler(BatchingOptions options, BatchFn fn, BatchClock* clock)
    : scheduler_(std::move(options), clock), queue_(scheduler_.add_queue(std::move(fn))) {}

BatchScheduler::~BatchScheduler() = default;

TensorMap BatchScheduler::run(const std::string& signature, const TensorMap& inputs, Deadline deadline,
                              BatchTiming* timing) {
  return scheduler_.run(queue_, signature, inputs, deadline, timing);
}

void BatchScheduler::schedule(const std::string& signature, TensorMap inputs, Deadline deadline, DoneFn done) {
  scheduler_.schedule(queue_, signature, std::move(inputs), deadline, std::move(done));
}

int64_t BatchScheduler::enqueued_batches() const { return scheduler_.enqueued_batches(queue_); }

}  // namespace kiln::serving
