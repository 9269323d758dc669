// Automatic batching (TF Serving's BasicBatchScheduler semantics): requests
// that arrive close together for the same servable version and signature
// are concatenated along dim 0, run once, and split back.
//
//   BatchScheduler s(opts, [&](const std::string& sig, const TensorMap& batch) {
//     return servable->predict(batch, sig); });
//   TensorMap out = s.run("serving_default", inputs, deadline);  // blocks
//
// - A batch closes when it reaches max_batch_size or its oldest request has
//   waited batch_timeout_micros. With allowed_batch_sizes, a batch is padded
//   (repeating the last row) up to the next allowed size; the padding rows
//   are dropped from the outputs.
// - A request with more rows than max_batch_size is split into pieces, not
//   rejected; its outputs are concatenated back in order.
// - At most max_enqueued_batches batches wait; beyond that run() throws
//   ServingError RESOURCE_EXHAUSTED at once (HTTP 429) instead of growing.
// - A request whose deadline passes before its batch starts throws
//   DEADLINE_EXCEEDED and is not computed.
// Thread-safe. num_batch_threads threads run batches; the destructor drains
// nothing: waiting requests get UNAVAILABLE.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/serving/servable.h"

namespace kiln::serving {

using Clock = std::chrono::steady_clock;
using Deadline = std::optional<Clock::time_point>;

struct BatchingOptions {
  int64_t max_batch_size = 32;
  int64_t batch_timeout_micros = 1000;
  int64_t num_batch_threads = 2;
  int64_t max_enqueued_batches = 64;
  std::vector<int64_t> allowed_batch_sizes;  // ascending; last == max_batch_size
  bool pad_variable_length_inputs = false;   // accepted, not supported (throws if true)
  void validate() const;                     // ValueError naming the field and value
  Json to_json() const;
};

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

class BatchScheduler {
 public:
  using BatchFn = std::function<TensorMap(const std::string& signature, const TensorMap& batch)>;
  BatchScheduler(BatchingOptions options, BatchFn fn);
  ~BatchScheduler();
  BatchScheduler(const BatchScheduler&) = delete;
  BatchScheduler& operator=(const BatchScheduler&) = delete;

  // Blocks until the request's outputs are ready. Throws ServingError
  // (RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED, INVALID_ARGUMENT when inputs
  // disagree on dim 0) or whatever the batch function threw.
  TensorMap run(const std::string& signature, const TensorMap& inputs, Deadline deadline = std::nullopt,
                BatchTiming* timing = nullptr);

  const BatchingOptions& options() const { return options_; }
  int64_t enqueued_batches() const;

 private:
  struct Impl;
  BatchingOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::serving
