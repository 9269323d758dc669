// ModelParallel: Keras 3's model-parallel distribution. Variables are
// sharded over the axes of a DeviceMesh as a LayoutMap says; one process per
// mesh device (rank r is the device at row-major coordinates r). Set it
// before building the model; nothing else in the code changes:
//
//   DeviceMesh mesh({2, 2}, {"batch", "model"});
//   LayoutMap map(mesh);
//   map.set("dense.*kernel", {"", "model"});   // column-parallel
//   map.set("dense.*bias", {"model"});
//   kiln::set_distribution(std::make_shared<ModelParallel>(map, "batch"));
//   auto model = make_model();                 // each rank holds only its shards
//   model->compile(...);
//   model->fit(...);
//
// Started under `kiln launch --nproc_per_node 4` (or torchrun, srun...):
//   - each rank creates every variable's initial value (the same on every
//     rank: the ranks share rank 0's random state from construction) and
//     keeps only its shard, so the weights per rank fall with the mesh;
//   - the layers compute with the fewest collectives (see
//     kiln/layers/sharded_kernel.h): column-/row-parallel Dense and
//     EinsumDense, vocabulary- or feature-sharded Embedding; anything
//     without a layout is replicated;
//   - the batch is split over the `batch_dim_name` axis as DataParallel
//     splits it over its ranks (the ranks of one model replica see the same
//     rows), and gradients are averaged over that axis only: a sharded
//     variable's gradient is complete on the rank that holds the shard, and
//     a replicated one's is the same on every rank of a model replica;
//   - process 0 alone prints and writes files; saving gathers the sharded
//     variables first (every rank takes part), so a model directory or a
//     checkpoint holds whole variables and loads into any mesh.
//
// batch_dim_name: the mesh axis the batch is split over. Unset: the first
// mesh axis that no layout in the map uses (Keras takes the first axis;
// kiln does not split the batch over an axis that also shards variables),
// or none. "" : no data parallelism. ValueError when it names an axis a
// layout uses, or no axis of the mesh.
//
// Thread safety: as fit(): one training thread.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/json.h"
#include "kiln/core/variable.h"
#include "kiln/distribute/cluster.h"
#include "kiln/distribute/collectives.h"
#include "kiln/distribute/layout.h"

namespace kiln::distribute {

struct ModelParallelOptions {
  double bucket_cap_mb = 25;           // gradient all-reduce buckets over the batch axis
  double timeout_seconds = 0;          // collectives; 0: $KILN_COLLECTIVE_TIMEOUT or 300
  std::optional<ClusterSpec> cluster;  // default: resolve_cluster()
};

class ModelParallel : public Distribution {
 public:
  ModelParallel(LayoutMap layout_map, std::optional<std::string> batch_dim_name = std::nullopt,
                ModelParallelOptions o = {});

  TensorLayout layout_for(const std::string& path, const Shape& shape) const override;
  at::Tensor distribute_variable(const at::Tensor& value, const TensorLayout& layout) const override;

  int num_replicas() const override { return batch_size_; }
  int replica_id() const override { return batch_index_; }
  int process_index() const override { return cluster_.rank; }
  void all_reduce_sum(std::vector<at::Tensor>& tensors) const override;
  std::function<void()> all_reduce_sum_async(std::vector<at::Tensor>& tensors) const override;
  void broadcast(std::vector<at::Tensor>& tensors, int root = 0) const override;
  GradientSync gradient_sync() const override;

  int64_t mesh_axis_size(const std::string& axis) const override;
  int64_t mesh_axis_index(const std::string& axis) const override;
  void axis_all_reduce_sum(at::Tensor& t, const std::string& axis) const override;
  at::Tensor axis_all_gather(const at::Tensor& t, int64_t dim, const std::string& axis) const override;
  std::optional<TensorLayout> output_layout(const std::string& layer_path) const override;
  at::Tensor gather_variable(const Variable& v) const override;
  std::vector<std::pair<int64_t, int64_t>> variable_ranges(const Variable& v) const override;
  void barrier() const override;

  // How many all-reduces and all-gathers the layers ran along mesh axes so
  // far (the layers' collectives; not the gradient sync over the batch axis).
  struct AxisCollectives {
    int64_t all_reduces = 0, all_gathers = 0;
  };
  AxisCollectives axis_collectives() const { return {all_reduces_, all_gathers_}; }

  const LayoutMap& layout_map() const { return map_; }
  const DeviceMesh& mesh() const { return map_.mesh(); }
  const std::string& batch_dim_name() const { return batch_dim_; }
  const ClusterSpec& cluster() const { return cluster_; }

 private:
  // The group along `axis` (null when this process is alone on it).
  Collectives* group(const std::string& axis) const;

  LayoutMap map_;
  std::string batch_dim_;
  ModelParallelOptions o_;
  ClusterSpec cluster_;
  std::vector<int64_t> coords_;
  int batch_size_ = 1, batch_index_ = 0;
  std::shared_ptr<Collectives> all_;
  std::map<std::string, std::shared_ptr<Collectives>> groups_;  // by mesh axis
  mutable std::atomic<int64_t> all_reduces_{0}, all_gathers_{0};
};

// The ModelParallel a spec's "distribution" object describes:
// {"type": "model_parallel", "mesh": {"shape": [2, 2], "axis_names": ["batch", "model"]},
//  "layout_map": {"dense.*kernel": ["", "model"], ...}, "batch_dim_name": "batch",
//  "timeout_seconds": 300}; null entries in a layout are "" (replicated), as Keras's None.
std::shared_ptr<Distribution> model_parallel_from_config(const Json& cfg);

}  // namespace kiln::distribute
