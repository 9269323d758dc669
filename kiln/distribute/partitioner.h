// Where a parameter-server job keeps its variables: how many shards each
// variable is split into (a Partitioner, as tf.distribute.experimental.
// partitioners) and which ps task holds each shard (place_variables).
//
//   MinSizePartitioner p({.min_shard_bytes = 256 << 10, .max_shards = 2});
//   auto placed = place_variables({{"emb/embeddings", {100000, 64}, at::kFloat},
//                                  {"dense/kernel", {64, 10}, at::kFloat}},
//                                 /*num_ps=*/2, &p);
//   // emb/embeddings -> part_0 on ps 0, part_1 on ps 1; dense/kernel on ps 0.
//
// Rules (TF's ParameterServerStrategy):
//   - variables split along axis 0 only; a shard holds a contiguous block of
//     rows, and the first (rows % shards) shards hold one row more;
//   - placement is round-robin over the ps tasks in creation order, one
//     step per shard: a counter c starts at 0, and each whole variable or
//     shard goes to ps (c mod num_ps), then c += 1;
//   - a sharded variable's shards are named "<path>/part_<i>"; a whole one
//     keeps its path;
//   - a scalar (rank 0) variable is never split.
// Pure functions: no process, no network; the same inputs give the same
// placement on every task, which is what lets workers find their variables.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/core/shape.h"

namespace kiln::distribute {

// Number of shards along axis 0 for a variable.
class Partitioner {
 public:
  virtual ~Partitioner() = default;
  // `shape` fully known; `element_bytes` the size of one element. At least
  // 1 and at most shape[0] (1 for a scalar).
  virtual int64_t num_shards(const Shape& shape, int64_t element_bytes) const = 0;
};

// tf.distribute.experimental.partitioners.FixedShardsPartitioner: `num_shards`
// shards (fewer when the variable has fewer rows).
struct FixedShardsPartitionerOptions {
  int64_t num_shards = 1;
  void validate() const;  // ValueError unless num_shards >= 1
};
class FixedShardsPartitioner : public Partitioner {
 public:
  explicit FixedShardsPartitioner(FixedShardsPartitionerOptions options);
  int64_t num_shards(const Shape& shape, int64_t element_bytes) const override;

 private:
  FixedShardsPartitionerOptions options_;
};

// tf.distribute.experimental.partitioners.MinSizePartitioner: as many shards
// as keep each at least `min_shard_bytes` (rounded up: ceil(bytes /
// min_shard_bytes)), at most `max_shards` and at most shape[0].
// MinSizePartitioner({.min_shard_bytes = 4, .max_shards = 2}) on a float32
// (6, 1) variable: 2 shards; with max_shards = 10: 6.
struct MinSizePartitionerOptions {
  int64_t min_shard_bytes = 256 << 10;
  int64_t max_shards = 1;
  void validate() const;  // ValueError unless both >= 1
};
class MinSizePartitioner : public Partitioner {
 public:
  explicit MinSizePartitioner(MinSizePartitionerOptions options);
  int64_t num_shards(const Shape& shape, int64_t element_bytes) const override;

 private:
  MinSizePartitionerOptions options_;
};

// tf.distribute.experimental.partitioners.MaxSizePartitioner: as few shards
// as keep each at most `max_shard_bytes` (a shard holds at least one row),
// capped by `max_shards` (0: no cap), which takes precedence.
struct MaxSizePartitionerOptions {
  int64_t max_shard_bytes = 0;
  int64_t max_shards = 0;  // 0: no cap
  void validate() const;   // ValueError unless max_shard_bytes >= 1 and max_shards >= 0
};
class MaxSizePartitioner : public Partitioner {
 public:
  explicit MaxSizePartitioner(MaxSizePartitionerOptions options);
  int64_t num_shards(const Shape& shape, int64_t element_bytes) const override;

 private:
  MaxSizePartitionerOptions options_;
};

// Rows of each of `num_shards` shards of `rows` rows: the first rows %
// num_shards shards one longer. {10, 3} -> {4, 3, 3}.
std::vector<int64_t> shard_rows(int64_t rows, int64_t num_shards);

// A variable to place: its path (unique), whole shape and dtype.
struct VariableToPlace {
  std::string path;
  Shape shape;
  at::ScalarType dtype = at::kFloat;
};

// One stored piece of a variable: the whole variable, or shard `index`.
struct PlacedShard {
  std::string path;  // "<variable>/part_<index>", or the variable's path when whole
  int64_t index = 0;
  int64_t row_offset = 0;  // first row of the variable it holds
  Shape shape;
  int ps = 0;  // the ps task (index into PsClusterSpec::ps) that holds it
};

struct PlacedVariable {
  std::string path;
  Shape shape;
  at::ScalarType dtype = at::kFloat;
  std::vector<PlacedShard> shards;  // one when not split, in row order
  bool sharded() const { return shards.size() > 1; }
};

// Places `vars` (in creation order) on `num_ps` ps tasks; `partitioner`
// null: no variable is split. ValueError for num_ps < 1, a duplicate path,
// a shape with an unknown or negative dimension.
std::vector<PlacedVariable> place_variables(const std::vector<VariableToPlace>& vars, int num_ps,
                                            const Partitioner* partitioner = nullptr);

}  // namespace kiln::distribute
