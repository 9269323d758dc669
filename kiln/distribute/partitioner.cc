#include "kiln/distribute/partitioner.h"

#include <set>

#include "kiln/core/error.h"
#include "kiln/core/json_limits.h"

namespace kiln::distribute {
namespace {

int64_t total_bytes(const Shape& shape, int64_t element_bytes) {
  int64_t n = element_bytes;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

void FixedShardsPartitionerOptions::validate() const {
  if (num_shards < 1)
    throw ValueError("FixedShardsPartitioner: `num_shards` must be a positive integer. Received: num_shards=" +
                     std::to_string(num_shards));
}

FixedShardsPartitioner::FixedShardsPartitioner(FixedShardsPartitionerOptions options) : options_(options) {
  options_.validate();
}

int64_t FixedShardsPartitioner::num_shards(const Shape& shape, int64_t) const {
  if (shape.empty()) return 1;
  return std::max<int64_t>(1, std::min(options_.num_shards, shape[0]));
}

void MinSizePartitionerOptions::validate() const {
  if (min_shard_bytes < 1)
    throw ValueError("MinSizePartitioner: `min_shard_bytes` must be a positive integer. Received: min_shard_bytes=" +
                     std::to_string(min_shard_bytes));
  if (max_shards < 1)
    throw ValueError("MinSizePartitioner: `max_shards` must be a positive integer. Received: max_shards=" +
                     std::to_string(max_shards));
}

MinSizePartitioner::MinSizePartitioner(MinSizePartitionerOptions options) : options_(options) { options_.validate(); }

int64_t MinSizePartitioner::num_shards(const Shape& shape, int64_t element_bytes) const {
  if (shape.empty()) return 1;
  const int64_t bytes = total_bytes(shape, element_bytes);
  const int64_t by_size = (bytes + options_.min_shard_bytes - 1) / options_.min_shard_bytes;
  return std::max<int64_t>(1, std::min({shape[0], options_.max_shards, by_size}));
}

void MaxSizePartitionerOptions::validate() const {
  if (max_shard_bytes < 1)
    throw ValueError("MaxSizePartitioner: `max_shard_bytes` must be a positive integer. Received: max_shard_bytes=" +
                     std::to_string(max_shard_bytes));
  if (max_shards < 0)
    throw ValueError(
        "MaxSizePartitioner: `max_shards` must be 0 (no cap) or a positive integer. Received: "
        "max_shards=" +
        std::to_string(max_shards));
}

MaxSizePartitioner::MaxSizePartitioner(MaxSizePartitionerOptions options) : options_(options) { options_.validate(); }

int64_t MaxSizePartitioner::num_shards(const Shape& shape, int64_t element_bytes) const {
  if (shape.empty() || shape[0] == 0) return 1;
  const int64_t row_bytes = total_bytes(Shape(shape.begin() + 1, shape.end()), element_bytes);
  const int64_t rows_per_shard = row_bytes > 0 ? std::max<int64_t>(1, options_.max_shard_bytes / row_bytes) : shape[0];
  int64_t n = (shape[0] + rows_per_shard - 1) / rows_per_shard;
  if (options_.max_shards > 0) n = std::min(n, options_.max_shards);
  return std::max<int64_t>(1, n);
}

std::vector<int64_t> shard_rows(int64_t rows, int64_t num_shards) {
  if (num_shards < 1)
    throw ValueError("shard_rows: `num_shards` must be positive. Received: " + std::to_string(num_shards));
  std::vector<int64_t> out(num_shards, rows / num_shards);
  for (int64_t i = 0; i < rows % num_shards; ++i) ++out[i];
  return out;
}

std::vector<PlacedVariable> place_variables(const std::vector<VariableToPlace>& vars, int num_ps,
                                            const Partitioner* partitioner) {
  if (num_ps < 1)
    throw ValueError("place_variables: the job needs at least one ps task. Received: num_ps=" + std::to_string(num_ps));
  std::vector<PlacedVariable> out;
  std::set<std::string> seen;
  int64_t counter = 0;
  for (const auto& v : vars) {
    if (!seen.insert(v.path).second)
      throw ValueError("place_variables: two variables share the path " + text_excerpt(v.path));
    for (int64_t d : v.shape)
      if (d < 0)
        throw ValueError("place_variables: variable " + text_excerpt(v.path) + " has shape " +
                         shape_to_string(v.shape) + "; every dimension must be known");
    PlacedVariable p{v.path, v.shape, v.dtype, {}};
    const int64_t n =
        partitioner ? std::max<int64_t>(1, partitioner->num_shards(v.shape, c10::elementSize(v.dtype))) : 1;
    if (n == 1 || v.shape.empty() || v.shape[0] < 2) {
      p.shards.push_back({v.path, 0, 0, v.shape, static_cast<int>(counter++ % num_ps)});
    } else {
      int64_t offset = 0;
      const auto rows = shard_rows(v.shape[0], std::min(n, v.shape[0]));
      for (size_t i = 0; i < rows.size(); ++i) {
        Shape s = v.shape;
        s[0] = rows[i];
        p.shards.push_back({v.path + "/part_" + std::to_string(i), static_cast<int64_t>(i), offset, s,
                            static_cast<int>(counter++ % num_ps)});
        offset += rows[i];
      }
    }
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace kiln::distribute
