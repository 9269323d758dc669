// Internal to kiln/data: the node graph behind Dataset. Not part of the
// public API; Dataset's methods are the way to build one.
//
// A node describes a transformation; make_iterator(key) starts a pass. `key`
// is the pass's identity: Dataset::iterator(epoch) passes the epoch, repeat()
// derives a distinct key per repetition. Shuffling draws its order from
// (seed, key) only, which is what makes passes repeatable.
//
// Row-indexed nodes: from_tensor_slices yields rows of fixed tensors, and
// shuffle/take/skip/shard/repeat(n) on top of it only reorder or select rows.
// Such nodes expose the tensors (row_source) and an IndexStream of row
// numbers, so shuffle moves int64 indices and batch() gathers a whole batch
// with index_select. Every row-indexed node yields exactly the same elements
// in the same order through make_iterator as through its index stream.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/data/dataset.h"

namespace kiln {

// Row numbers of one pass over a row-indexed node.
class IndexStream {
 public:
  virtual ~IndexStream() = default;
  virtual std::optional<int64_t> next() = 0;
  // Appends up to `max` indices to `out`; returns how many (0 at the end).
  virtual int64_t next_block(std::vector<int64_t>* out, int64_t max);
  // Skips up to `n` indices; returns how many.
  virtual int64_t skip(int64_t n);
};

class DatasetNode : public std::enable_shared_from_this<DatasetNode> {
 public:
  virtual ~DatasetNode() = default;
  virtual std::unique_ptr<data::DatasetIterator> make_iterator(uint64_t key) const = 0;
  virtual int64_t cardinality() const = 0;
  // True when a pass only reads tensors already in memory: no user code, no
  // I/O, nothing that blocks (from_tensors/from_tensor_slices under
  // shuffle/take/skip/shard/repeat/batch/unbatch/prefetch).
  virtual bool in_memory() const { return false; }

  // Row-indexed nodes: the tensors whose dim-0 rows this node yields, and the
  // row order of a pass. nullptr for other nodes.
  virtual const Element* row_source() const { return nullptr; }
  virtual std::unique_ptr<IndexStream> index_stream(uint64_t key) const { return nullptr; }

  template <class T>
  std::shared_ptr<const T> self() const {
    return std::static_pointer_cast<const T>(shared_from_this());
  }
};

using NodePtr = std::shared_ptr<const DatasetNode>;

// Iterates the rows of `source` in the order of `stream` (select views).
std::unique_ptr<data::DatasetIterator> make_row_iterator(NodePtr owner, const Element* source,
                                                         std::unique_ptr<IndexStream> stream);

// splitmix64 finaliser and a combiner for pass keys and seeds.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
inline uint64_t combine_keys(uint64_t a, uint64_t b) { return mix64(a ^ mix64(b)); }

// For kiln's pipeline threads (prefetch, parallel map): makes ATen ops run
// on the calling thread only, as tf.data's max_intra_op_parallelism=1 does.
// Without it each such thread starts its own OpenMP team as large as the
// main one, and on a small machine the teams spin against the training step.
void use_one_intra_op_thread_here();

// "[2, 3]" for error messages.
std::string shape_string(const at::Tensor& t);

// Element layout check used by batch(): ShapeError naming both shapes.
void check_same_structure(const Element& first, const Element& other, int64_t index_in_batch);

}  // namespace kiln

namespace kiln {

// Node constructors (dataset.cc, dataset_ops.cc, dataset_cache.cc,
// dataset_prefetch.cc). Arguments are validated by Dataset's methods.
NodePtr make_map_node(NodePtr input, std::function<Element(const Element&)> fn, int num_parallel_calls);
NodePtr make_shuffle_node(NodePtr input, int64_t buffer_size, uint64_t seed, bool reshuffle);
NodePtr make_batch_node(NodePtr input, int64_t batch_size, bool drop_remainder);
NodePtr make_unbatch_node(NodePtr input);
NodePtr make_repeat_node(NodePtr input, int64_t count);
NodePtr make_take_node(NodePtr input, int64_t n);
NodePtr make_skip_node(NodePtr input, int64_t n);
NodePtr make_shard_node(NodePtr input, int64_t num_shards, int64_t index);
// `device`: keep the in-memory cache there (filename empty).
NodePtr make_cache_node(NodePtr input, std::string filename, std::optional<at::Device> device = std::nullopt);
NodePtr make_prefetch_node(NodePtr input, int64_t buffer_size);

}  // namespace kiln
