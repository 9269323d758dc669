#include "kiln/serving/batching.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "kiln/core/error.h"
#include "kiln/serving/status.h"
#include "kiln/serving/text_proto.h"
#include "tensorflow_serving/servables/tensorflow/session_bundle_config.pb.h"

namespace kiln::serving {

void BatchingOptions::validate() const {
  auto positive = [](const char* n, int64_t v) {
    if (v < 1)
      throw ValueError(std::string("batching: `") + n + "` must be a positive integer. Received: " + n + "=" +
                       std::to_string(v));
  };
  positive("max_batch_size", max_batch_size);
  positive("num_batch_threads", num_batch_threads);
  positive("max_enqueued_batches", max_enqueued_batches);
  if (batch_timeout_micros < 0)
    throw ValueError("batching: `batch_timeout_micros` must be >= 0. Received: " +
                     std::to_string(batch_timeout_micros));
  if (pad_variable_length_inputs)
    throw ValueError("batching: `pad_variable_length_inputs` is not supported; set it to false");
  for (size_t i = 0; i < allowed_batch_sizes.size(); ++i) {
    positive("allowed_batch_sizes", allowed_batch_sizes[i]);
    if (i && allowed_batch_sizes[i] <= allowed_batch_sizes[i - 1])
      throw ValueError("batching: `allowed_batch_sizes` must be strictly increasing");
  }
  if (!allowed_batch_sizes.empty() && allowed_batch_sizes.back() != max_batch_size)
    throw ValueError("batching: the last of `allowed_batch_sizes` must equal max_batch_size (" +
                     std::to_string(max_batch_size) + "). Received: " + std::to_string(allowed_batch_sizes.back()));
}

Json BatchingOptions::to_json() const {
  return Json{{"max_batch_size", max_batch_size},           {"batch_timeout_micros", batch_timeout_micros},
              {"num_batch_threads", num_batch_threads},     {"max_enqueued_batches", max_enqueued_batches},
              {"allowed_batch_sizes", allowed_batch_sizes}, {"pad_variable_length_inputs", pad_variable_length_inputs}};
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

namespace {

struct Request {
  std::mutex mu;
  std::condition_variable cv;
  int remaining = 0;               // guarded by mu
  std::vector<TensorMap> outputs;  // guarded by mu; one per piece
  std::exception_ptr error;        // guarded by mu
  bool abandoned = false;          // guarded by mu; the caller gave up (deadline)
  BatchTiming timing;              // guarded by mu; max over pieces
};

struct Task {
  std::shared_ptr<Request> request;
  size_t piece = 0;
  TensorMap inputs;
  int64_t rows = 0;
  Clock::time_point enqueued;
  Deadline deadline;
};

struct Queue {
  std::string signature;
  std::deque<Task> tasks;
  int64_t rows = 0;
};

void finish(Task& t, TensorMap out, std::exception_ptr err, const BatchTiming& timing) {
  std::lock_guard<std::mutex> l(t.request->mu);
  if (err && !t.request->error) t.request->error = err;
  if (!err) t.request->outputs[t.piece] = std::move(out);
  t.request->timing.queue_us = std::max(t.request->timing.queue_us, timing.queue_us);
  t.request->timing.compute_us = std::max(t.request->timing.compute_us, timing.compute_us);
  t.request->timing.batch_size = std::max(t.request->timing.batch_size, timing.batch_size);
  if (--t.request->remaining == 0) t.request->cv.notify_all();
}

int64_t micros(Clock::duration d) { return std::chrono::duration_cast<std::chrono::microseconds>(d).count(); }

}  // namespace

struct BatchScheduler::Impl {
  BatchingOptions o;
  BatchFn fn;
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, Queue> queues;  // guarded by mu; key: signature + input shapes
  int64_t queued_rows = 0;              // guarded by mu
  bool stopping = false;                // guarded by mu
  std::vector<std::thread> threads;

  int64_t batches_for(int64_t rows) const { return (rows + o.max_batch_size - 1) / o.max_batch_size; }

  int64_t enqueued_batches_locked() const {
    int64_t n = 0;
    for (auto& [k, q] : queues) n += batches_for(q.rows);
    return n;
  }

  // A queue whose batch may close now, or nullptr and the time to look again.
  Queue* ready(Clock::time_point now, Clock::time_point* wake) {
    Queue* best = nullptr;
    for (auto& [k, q] : queues) {
      if (q.tasks.empty()) continue;
      auto due = q.tasks.front().enqueued + std::chrono::microseconds(o.batch_timeout_micros);
      if (q.rows >= o.max_batch_size || due <= now) {
        if (!best || q.tasks.front().enqueued < best->tasks.front().enqueued) best = &q;
      } else if (due < *wake) {
        *wake = due;
      }
    }
    return best;
  }

  void loop() {
    std::unique_lock<std::mutex> l(mu);
    for (;;) {
      if (stopping) return;
      auto now = Clock::now();
      auto wake = Clock::time_point::max();
      Queue* q = ready(now, &wake);
      if (!q) {
        if (wake == Clock::time_point::max())
          cv.wait(l);
        else
          cv.wait_until(l, wake);
        continue;
      }
      std::vector<Task> batch;
      int64_t rows = 0;
      while (!q->tasks.empty() && rows + q->tasks.front().rows <= o.max_batch_size) {
        Task t = std::move(q->tasks.front());
        q->tasks.pop_front();
        q->rows -= t.rows;
        queued_rows -= t.rows;
        rows += t.rows;
        batch.push_back(std::move(t));
      }
      std::string signature = q->signature;
      l.unlock();
      cv.notify_all();  // another thread may take the next batch
      run_batch(signature, batch);
      l.lock();
    }
  }

  void run_batch(const std::string& signature, std::vector<Task>& batch) {
    auto start = Clock::now();
    std::vector<Task*> live;
    for (auto& t : batch) {
      bool abandoned;
      {
        std::lock_guard<std::mutex> rl(t.request->mu);
        abandoned = t.request->abandoned || t.request->error != nullptr;
      }
      if (abandoned) {
        finish(t, {}, nullptr, {});
        continue;
      }
      if (t.deadline && *t.deadline <= start) {
        finish(t, {},
               std::make_exception_ptr(
                   ServingError(Code::kDeadlineExceeded, "deadline exceeded while the request waited for a batch")),
               {});
        continue;
      }
      live.push_back(&t);
    }
    if (live.empty()) return;
    int64_t rows = 0;
    for (auto* t : live) rows += t->rows;
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
      for (auto& [name, first] : live[0]->inputs) {
        std::vector<at::Tensor> parts;
        for (auto* t : live) parts.push_back(t->inputs.at(name));
        at::Tensor cat = parts.size() == 1 ? parts[0] : at::cat(parts, 0);
        if (padded > rows) {
          std::vector<int64_t> reps(cat.dim(), 1);
          reps[0] = padded - rows;
          cat = at::cat({cat, cat.narrow(0, rows - 1, 1).repeat(reps)}, 0);  // pad with the last row
        }
        in[name] = cat;
      }
      out = fn(signature, in);
      for (auto& [name, t] : out)
        if (t.dim() == 0 || t.size(0) != padded)
          throw ServingError(Code::kInternal, "batched output '" + name + "' does not have the batch size " +
                                                  std::to_string(padded) + " in dim 0");
    } catch (...) {
      err = std::current_exception();
    }
    BatchTiming timing;
    timing.compute_us = micros(Clock::now() - start);
    timing.batch_size = padded;
    int64_t offset = 0;
    for (auto* t : live) {
      timing.queue_us = micros(start - t->enqueued);
      TensorMap piece;
      if (!err)
        for (auto& [name, v] : out) piece[name] = v.narrow(0, offset, t->rows);
      offset += t->rows;
      finish(*t, std::move(piece), err, timing);
    }
  }
};

BatchScheduler::BatchScheduler(BatchingOptions options, BatchFn fn)
    : options_(std::move(options)), impl_(std::make_unique<Impl>()) {
  options_.validate();
  impl_->o = options_;
  impl_->fn = std::move(fn);
  for (int64_t i = 0; i < options_.num_batch_threads; ++i) impl_->threads.emplace_back([this] { impl_->loop(); });
}

BatchScheduler::~BatchScheduler() {
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  for (auto& t : impl_->threads) t.join();
  for (auto& [k, q] : impl_->queues)
    for (auto& t : q.tasks)
      finish(t, {}, std::make_exception_ptr(ServingError(Code::kUnavailable, "the batch scheduler is shutting down")),
             {});
}

int64_t BatchScheduler::enqueued_batches() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->enqueued_batches_locked();
}

TensorMap BatchScheduler::run(const std::string& signature, const TensorMap& inputs, Deadline deadline,
                              BatchTiming* timing) {
  if (inputs.empty()) throw ServingError(Code::kInvalidArgument, "a request needs at least one input tensor");
  int64_t rows = -1;
  std::string key = signature;
  for (auto& [name, t] : inputs) {
    if (!t.defined() || t.dim() == 0)
      throw ServingError(Code::kInvalidArgument, "batching needs a batch dimension: input '" + name + "' is a scalar");
    if (rows >= 0 && t.size(0) != rows)
      throw ServingError(Code::kInvalidArgument, "inputs disagree on the batch size (dim 0): " + std::to_string(rows) +
                                                     " vs " + std::to_string(t.size(0)) + " for '" + name + "'");
    rows = t.size(0);
    key += "|" + name + ":" + std::to_string((int)t.scalar_type());
    for (int64_t d = 1; d < t.dim(); ++d) key += "," + std::to_string(t.size(d));
  }
  if (rows == 0) throw ServingError(Code::kInvalidArgument, "a request needs at least one row (dim 0 is 0)");
  auto req = std::make_shared<Request>();
  int64_t m = options_.max_batch_size;
  int64_t pieces = (rows + m - 1) / m;
  req->remaining = (int)pieces;
  req->outputs.resize(pieces);
  auto now = Clock::now();
  if (deadline && *deadline <= now)
    throw ServingError(Code::kDeadlineExceeded, "deadline exceeded before the request was queued");
  bool wake = true;
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    if (impl_->stopping) throw ServingError(Code::kUnavailable, "the batch scheduler is shutting down");
    auto& q = impl_->queues[key];
    int64_t after = impl_->enqueued_batches_locked() - impl_->batches_for(q.rows) + impl_->batches_for(q.rows + rows);
    if (after > options_.max_enqueued_batches)
      throw ServingError(Code::kResourceExhausted, "the batch queue is full (max_enqueued_batches=" +
                                                       std::to_string(options_.max_enqueued_batches) +
                                                       "); retry later");
    q.signature = signature;
    // Wake the batch threads only when this can change what they do: the
    // queue was empty (a new timeout to wait for) or a batch is now full.
    // Requests in between join the batch without a wake-up each (a thread
    // busy running a batch re-checks the queues under the lock when it ends).
    wake = q.rows == 0 || q.rows + rows >= m;
    for (int64_t p = 0; p < pieces; ++p) {
      Task t;
      t.request = req;
      t.piece = p;
      t.rows = std::min(m, rows - p * m);
      for (auto& [name, v] : inputs) t.inputs[name] = pieces == 1 ? v : v.narrow(0, p * m, t.rows);
      t.enqueued = now;
      t.deadline = deadline;
      q.tasks.push_back(std::move(t));
    }
    q.rows += rows;
    impl_->queued_rows += rows;
  }
  if (wake) impl_->cv.notify_all();
  std::unique_lock<std::mutex> rl(req->mu);
  if (deadline) {
    if (!req->cv.wait_until(rl, *deadline, [&] { return req->remaining == 0; })) {
      req->abandoned = true;
      throw ServingError(Code::kDeadlineExceeded, "deadline exceeded while waiting for the batch");
    }
  } else {
    req->cv.wait(rl, [&] { return req->remaining == 0; });
  }
  if (req->error) std::rethrow_exception(req->error);
  if (timing) *timing = req->timing;
  if (pieces == 1) return std::move(req->outputs[0]);
  TensorMap out;
  for (auto& [name, first] : req->outputs[0]) {
    std::vector<at::Tensor> parts;
    for (auto& o : req->outputs) parts.push_back(o.at(name));
    out[name] = at::cat(parts, 0);
  }
  return out;
}

}  // namespace kiln::serving
