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
// batches as an uninterrupted one; iterator(epoch).skip_batches(k) resumes
// mid-epoch.
//
// Thread safety: a Dataset may be shared between threads; each iterator is
// used by one thread. prefetch and map(num_parallel_calls>1) run their own
// threads and stop them when the iterator is destroyed.
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

class DatasetIterator {
 public:
  virtual ~DatasetIterator() = default;
  // Next element, or nullopt at the end of the pass.
  virtual std::optional<Element> next() = 0;
};

constexpr int64_t kInfiniteCardinality = -1;
constexpr int64_t kUnknownCardinality = -2;

class DatasetNode;  // implementation detail (data/dataset.cc)

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

  Dataset map(std::function<Element(const Element&)> fn, int num_parallel_calls = 1) const;
  // Keras/tf.data: fills a buffer of `buffer_size` and samples from it.
  // seed unset: drawn from kiln's host RNG once (set_random_seed makes it
  // repeat). reshuffle_each_iteration: a different order each epoch.
  Dataset shuffle(int64_t buffer_size, std::optional<uint64_t> seed = std::nullopt,
                  bool reshuffle_each_iteration = true) const;
  // Stacks consecutive elements along a new dim 0.
  Dataset batch(int64_t batch_size, bool drop_remainder = false) const;
  Dataset unbatch() const;
  Dataset repeat(int64_t count = -1) const;  // -1: forever
  Dataset take(int64_t n) const;
  Dataset skip(int64_t n) const;
  // "" caches in memory after the first full pass; a path caches to that
  // file (written atomically at the end of the first full pass, read after).
  Dataset cache(const std::string& filename = "") const;
  // Produces up to `buffer_size` elements ahead on a background thread.
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

}  // namespace kiln
