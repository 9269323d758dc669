// Dataset: an input pipeline in the style of tf.data.
//
//   auto ds = Dataset::from_tensor_slices({x, y})
//                 .shuffle(10000, /*seed=*/42)
//                 .batch(128)
//                 .prefetch(2);
//   for (int epoch = 0; epoch < 10; ++epoch) {
//     auto it = ds.iterator(epoch);
//     while (auto batch = it->next()) { /* (*batch)[0] is x, [1] is y */ }
//   }
//
// A Dataset is an immutable description (cheap to copy); iterator(epoch)
// starts a pass. An element is a vector of tensors: (x), (x, y) or
// (x, y, sample_weight). Passes are deterministic: shuffle order depends on
// (seed, epoch) only, so a resumed run (BackupAndRestore) sees the same
// batches as an uninterrupted one; iterator(epoch)->skip_batches(k) resumes
// mid-epoch.
//
// Elements may share memory with the tensors the dataset was built from
// (slices are views, as tensor[i] is): treat them as read-only.
//
// Errors: ValueError for invalid arguments (named with the value received),
// ShapeError when batch() meets elements of different shapes, FormatError for
// a corrupt cache file; an exception thrown by a map function or generator
// reaches the caller of next() (through prefetch too), in element order.
//
// Cost: from_tensor_slices(...) followed by any of shuffle/take/skip/shard/
// repeat(n) and then batch() gathers each batch with one index_select per
// tensor (or a narrow view when the rows are consecutive) instead of stacking
// rows one by one; shuffling then moves indices, not tensors.
//
// Thread safety: a Dataset may be shared between threads; each iterator is
// used by one thread. prefetch and map(num_parallel_calls>1) run their own
// threads and stop (join) them when the iterator is destroyed, even mid-pass.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kiln {

using Element = std::vector<at::Tensor>;

namespace data {

class DatasetIterator {
 public:
  virtual ~DatasetIterator() = default;
  // Next element, or nullopt at the end of the pass.
  virtual std::optional<Element> next() = 0;
  // Advances past up to `n` elements (batches, for a batched dataset) without
  // returning them; returns how many were skipped (fewer at the end of the
  // pass). Map functions are not called for skipped elements (unless a
  // cache() above them must see every element), and a batched in-memory
  // pipeline skips without gathering, so resuming is cheap.
  virtual int64_t skip_batches(int64_t n);
};

}  // namespace data

constexpr int64_t kInfiniteCardinality = -1;
constexpr int64_t kUnknownCardinality = -2;
// tf.data.AUTOTUNE for num_parallel_calls (the machine's cores) and prefetch
// buffer sizes (2).
constexpr int64_t kAutotune = -1;

class DatasetNode;  // implementation detail (kiln/data/dataset_node.h)

namespace data {

class Dataset {
 public:
  // One element made of `tensors`.
  static Dataset from_tensors(const Element& tensors);
  // Elements are slices along dim 0 of each tensor (all the same length;
  // ValueError names the lengths otherwise).
  static Dataset from_tensor_slices(const Element& tensors);
  // Elements from a generator function (returns nullopt at the end).
  static Dataset from_generator(std::function<std::function<std::optional<Element>()>()> make,
                                int64_t cardinality = kUnknownCardinality);

  // fn applied to each element. num_parallel_calls > 1 (or kAutotune) runs fn
  // on that many worker threads; the output keeps the input order. fn must be
  // thread-safe then.
  Dataset map(std::function<Element(const Element&)> fn, int num_parallel_calls = 1) const;
  // Keras/tf.data: fills a buffer of `buffer_size` and samples from it
  // (the first element out is one of the first buffer_size in; buffer_size >=
  // cardinality is a full uniform shuffle). seed unset: drawn from kiln's
  // host RNG once, here (set_random_seed makes it repeat).
  // reshuffle_each_iteration: a different order each epoch (and each
  // repetition under repeat()); false: the same order every epoch.
  // The order depends only on (seed, epoch).
  Dataset shuffle(int64_t buffer_size, std::optional<uint64_t> seed = std::nullopt,
                  bool reshuffle_each_iteration = true) const;
  // Stacks consecutive elements along a new dim 0; the last batch is smaller
  // unless drop_remainder. Elements must have equal shapes and dtypes
  // (ShapeError naming both shapes otherwise).
  Dataset batch(int64_t batch_size, bool drop_remainder = false) const;
  // Splits each element along dim 0 (all its tensors must agree on dim 0).
  Dataset unbatch() const;
  // The input `count` times; -1: forever. A pass of an empty input ends the
  // repetition instead of spinning.
  Dataset repeat(int64_t count = -1) const;
  Dataset take(int64_t n) const;  // the first n elements; -1: all
  Dataset skip(int64_t n) const;  // all but the first n; -1: none left
  // "" caches in memory after the first full pass; a path caches to that
  // file, written atomically (temp + fsync + rename) at the end of the first
  // full pass, read by every later pass. A pass stopped early caches nothing.
  // The file is kiln's own format ("KILNDSC1" header, sizes, CRC-32 of the
  // body); a corrupt or truncated file raises FormatError naming it. As in
  // tf.data, a cache holds the first pass's order: shuffle after cache().
  Dataset cache(const std::string& filename = "") const;
  // cache() in a device's memory: the first full pass's elements are kept
  // on `device` ("": kiln's default device, the GPU where there is one), so
  // later passes hand fit() batches already there (no host-to-device copy:
  // the pipeline's prefetch passes them through). For a dataset that fits
  // in the GPU's memory; on the CPU it is cache(). ValueError naming the
  // devices there are for a device this machine lacks.
  Dataset cache_on_device(const std::string& device = "") const;
  // Produces up to `buffer_size` (kAutotune: 2) elements ahead on a
  // background thread started by the first next(). Exception: an in-memory
  // pipeline (from_tensors/from_tensor_slices under shuffle/take/skip/shard/
  // repeat/batch/unbatch only) when ATen's intra-op threads already use every
  // core is produced in next() instead: it never waits on I/O, and a thread
  // could only take cycles from the caller's own.
  Dataset prefetch(int64_t buffer_size = 1) const;
  // Every num_shards-th element starting at index.
  Dataset shard(int64_t num_shards, int64_t index) const;

  // A new pass; `epoch` seeds reshuffling.
  std::unique_ptr<DatasetIterator> iterator(int64_t epoch = 0) const;
  // Number of elements of one pass, kInfiniteCardinality or kUnknownCardinality.
  int64_t cardinality() const;

  explicit Dataset(std::shared_ptr<const DatasetNode> node) : node_(std::move(node)) {}
  const std::shared_ptr<const DatasetNode>& node() const { return node_; }

 private:
  std::shared_ptr<const DatasetNode> node_;
};

}  // namespace data

}  // namespace kiln

#define KILN_LEGACY_DATA_DATASET_H
#include "kiln/data/legacy_names.h"
