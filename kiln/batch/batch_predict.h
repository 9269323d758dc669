// Batch prediction over JSON Lines files, Vertex AI-style output shards.
//
//   BatchPredictOptions o;
//   o.model_dir = "models/fashion_mnist/3";
//   o.inputs = {"data/part-*.jsonl"};   // globs expand, sorted, in the given order
//   o.output_dir = "out";
//   BatchPredictReport r = batch_predict(o);
//
// Input: every non-blank line is one instance, as `kiln predict` reads it:
//   [0.1, ...]                        one-input models (a number nest)
//   {"inputs": [...]}                 the same, TF Serving-style
//   {"a": [...], "b": [...]}          named inputs (per the serving signature)
//   {"inputs": {"a": [...], ...}}     named inputs, TF Serving-style
// Lines are numbered across all inputs in order and cut into shards of
// `lines_per_shard` lines; shard k of N writes
//   prediction.results-0000k-of-0000N      {"instance": <line>, "prediction": <output>}
//   prediction.errors_stats-0000k-of-0000N {"file", "line", "instance", "error"}
// so concatenating the results shards in order gives the predictions in input
// order, and a bad line lands in the errors file without stopping the run.
//
// Crash safety: each shard is written whole (temporary name, fsync, rename);
// the results file is renamed last and marks the shard done. A re-run with the
// same inputs skips finished shards (their files are not touched) and removes
// temporary files a killed run left behind. An output directory holding
// shards of a different count is refused (ValueError naming the fix).
//
// Workers are threads; each loads the model once and takes the next undone
// shard. Thread safety: batch_predict() may run concurrently on distinct
// output directories.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::batch {

struct BatchPredictOptions {
  std::string model_dir;            // a model version directory
  std::vector<std::string> inputs;  // JSON Lines files or glob patterns
  std::string output_dir;           // created if missing
  int64_t workers = 1;              // threads, each with its own model
  int64_t batch_size = 64;          // instances per forward pass
  int64_t lines_per_shard = 10000;  // input lines per output shard
  void validate() const;            // ValueError naming the field and value
};

struct BatchPredictReport {
  int64_t num_shards = 0;
  int64_t shards_written = 0;  // this run
  int64_t shards_skipped = 0;  // already finished by an earlier run
  int64_t predictions = 0;     // in the shards written by this run
  int64_t errors = 0;          // in the shards written by this run
};

BatchPredictReport batch_predict(const BatchPredictOptions& options);

// "prediction.results-00003-of-00010"
std::string shard_file_name(const std::string& kind, int64_t shard, int64_t num_shards);

// Expands globs (sorted matches); NotFoundError for a pattern matching nothing.
std::vector<std::string> expand_inputs(const std::vector<std::string>& patterns);

}  // namespace kiln::batch
