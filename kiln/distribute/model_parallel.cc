#include "kiln/distribute/model_parallel.h"

#include <set>

#include "kiln/core/config_keys.h"
#include "kiln/core/error.h"
#include "kiln/core/random.h"

namespace kiln::distribute {
namespace {

std::string batch_axis(const LayoutMap& map, const std::optional<std::string>& asked) {
  const DeviceMesh& mesh = map.mesh();
  std::set<std::string> used;
  for (const auto& key : map.keys()) {
    const std::optional<TensorLayout> layout = map.get(key);  // (a temporary's member would dangle in the loop)
    for (const auto& a : layout->axes)
      if (!a.empty()) used.insert(a);
  }
  if (!asked) {
    for (const auto& a : mesh.axis_names())
      if (!used.count(a)) return a;
    return "";
  }
  if (asked->empty()) return "";
  mesh.axis(*asked);  // ValueError naming the mesh's axes
  if (used.count(*asked))
    throw ValueError("ModelParallel: batch_dim_name '" + *asked +
                     "' is also an axis the layout map shards variables over; kiln splits the batch and the "
                     "variables over different mesh axes: add a batch axis to the mesh (e.g. shape [2, N], axis "
                     "names [\"batch\", \"model\"]) or set batch_dim_name to \"\" for no data parallelism");
  return *asked;
}

}  // namespace

ModelParallel::ModelParallel(LayoutMap layout_map, std::optional<std::string> batch_dim_name, ModelParallelOptions o)
    : map_(std::move(layout_map)), o_(std::move(o)) {
  if (!(o_.bucket_cap_mb > 0))
    throw ValueError("ModelParallel: `bucket_cap_mb` must be > 0. Received: " + std::to_string(o_.bucket_cap_mb));
  if (o_.timeout_seconds < 0)
    throw ValueError("ModelParallel: `timeout_seconds` must be >= 0 (0: the default). Received: " +
                     std::to_string(o_.timeout_seconds));
  batch_dim_ = batch_axis(map_, batch_dim_name);
  cluster_ = o_.cluster ? *o_.cluster : resolve_cluster();
  const DeviceMesh& m = map_.mesh();
  if (cluster_.world_size != m.size())
    throw ValueError("ModelParallel: the device mesh has " + std::to_string(m.size()) + " devices but the job has " +
                     std::to_string(cluster_.world_size) + " processes (one per device); start " +
                     std::to_string(m.size()) + " (kiln launch --nproc_per_node " + std::to_string(m.size()) +
                     ") or change the mesh shape");
  coords_ = m.coordinates(cluster_.rank);
  if (!batch_dim_.empty()) {
    batch_size_ = static_cast<int>(m.axis_size(batch_dim_));
    batch_index_ = static_cast<int>(coords_[m.axis(batch_dim_)]);
  }
  if (cluster_.world_size == 1) return;
  all_ = Collectives::connect(cluster_, {.timeout_seconds = o_.timeout_seconds, .device = device()});
  // One group per mesh axis: the ranks that differ from this one only there.
  for (size_t a = 0; a < m.shape().size(); ++a) {
    if (m.shape()[a] == 1) continue;
    std::vector<int> ranks;
    std::string tag = m.axis_names()[a];
    for (int64_t k = 0; k < m.shape()[a]; ++k) {
      std::vector<int64_t> c = coords_;
      c[a] = k;
      int64_t r = 0;
      for (size_t i = 0; i < c.size(); ++i) r = r * m.shape()[i] + c[i];
      ranks.push_back(static_cast<int>(r));
    }
    for (size_t i = 0; i < coords_.size(); ++i) tag += "/" + (i == a ? std::string("*") : std::to_string(coords_[i]));
    groups_[m.axis_names()[a]] = all_->subgroup(ranks, tag);
  }
  // Every rank draws the same initial values (then keeps its shard), as
  // one process would: all take process 0's random state.
  share_random_state([this](std::vector<at::Tensor>& t) { all_->broadcast(t); }, cluster_.rank == 0);
}

TensorLayout ModelParallel::layout_for(const std::string& path, const Shape& shape) const {
  auto l = map_.get(path);
  if (!l) return {};
  mesh().check(shape, *l, "variable '" + path + "'");
  return *l;
}

at::Tensor ModelParallel::distribute_variable(const at::Tensor& value, const TensorLayout& layout) const {
  if (layout.replicated()) return value;
  const Shape shape(value.sizes().begin(), value.sizes().end());
  at::Tensor v = value;
  const auto ranges = mesh().shard_ranges(shape, layout, cluster_.rank);
  for (size_t d = 0; d < ranges.size(); ++d)
    v = v.narrow(static_cast<int64_t>(d), ranges[d].first, ranges[d].second - ranges[d].first);
  return v.clone();  // only the shard stays alive
}

Collectives* ModelParallel::group(const std::string& axis) const {
  auto it = groups_.find(axis);
  return it == groups_.end() ? nullptr : it->second.get();
}

void ModelParallel::all_reduce_sum(std::vector<at::Tensor>& tensors) const {
  if (Collectives* g = batch_dim_.empty() ? nullptr : group(batch_dim_)) g->all_reduce_sum(tensors);
}

std::function<void()> ModelParallel::all_reduce_sum_async(std::vector<at::Tensor>& tensors) const {
  Collectives* g = batch_dim_.empty() ? nullptr : group(batch_dim_);
  if (!g) return [] {};
  if (tensors.size() == 1 && tensors[0].is_contiguous()) return g->all_reduce_sum_async(tensors[0]);
  g->all_reduce_sum(tensors);
  return [] {};
}

void ModelParallel::broadcast(std::vector<at::Tensor>& tensors, int root) const {
  if (Collectives* g = batch_dim_.empty() ? nullptr : group(batch_dim_)) g->broadcast(tensors, root);
}

Distribution::GradientSync ModelParallel::gradient_sync() const {
  GradientSync g;
  g.bucket_bytes = static_cast<int64_t>(o_.bucket_cap_mb * (1 << 20));
  return g;
}

int64_t ModelParallel::mesh_axis_size(const std::string& axis) const { return mesh().axis_size(axis); }

int64_t ModelParallel::mesh_axis_index(const std::string& axis) const { return coords_[mesh().axis(axis)]; }

void ModelParallel::axis_all_reduce_sum(at::Tensor& t, const std::string& axis) const {
  Collectives* g = group(axis);
  if (!g) return;
  ++all_reduces_;
  // Gloo has no 16-bit float sums: those add up in float32 (as mixed
  // precision accumulates) and round once.
  const bool narrow = t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
  std::vector<at::Tensor> v = {narrow ? t.to(at::kFloat) : t};
  g->all_reduce_sum(v);
  if (narrow) t.copy_(v[0]);
}

at::Tensor ModelParallel::axis_all_gather(const at::Tensor& t, int64_t dim, const std::string& axis) const {
  Collectives* g = group(axis);
  if (!g) return t;
  ++all_gathers_;
  // A gather moves bytes only: 16-bit floats travel as int16.
  const bool narrow = t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
  std::vector<at::Tensor> parts = g->all_gather(narrow ? t.view(at::kShort) : t);
  if (narrow)
    for (auto& p : parts) p = p.view(t.scalar_type());
  return at::cat(parts, dim);
}

std::optional<TensorLayout> ModelParallel::output_layout(const std::string& layer_path) const {
  return map_.get(layer_path + "/output");
}

at::Tensor ModelParallel::gather_variable(const Variable& v) const {
  at::Tensor value = v.value().detach();
  const auto& axes = v.layout().axes;
  for (size_t d = 0; d < axes.size(); ++d)
    if (!axes[d].empty()) value = axis_all_gather(value, static_cast<int64_t>(d), axes[d]);
  return value;
}

std::vector<std::pair<int64_t, int64_t>> ModelParallel::variable_ranges(const Variable& v) const {
  if (!v.sharded()) return Distribution::variable_ranges(v);
  return mesh().shard_ranges(v.global_shape(), v.layout(), cluster_.rank);
}

void ModelParallel::barrier() const {
  if (all_) all_->barrier();
}

std::shared_ptr<Distribution> model_parallel_from_config(const Json& cfg) {
  check_config_keys(cfg, {"type", "mesh", "layout_map", "batch_dim_name", "timeout_seconds", "bucket_cap_mb"},
                    "distribution");
  const std::string example =
      " (e.g. \"mesh\": {\"shape\": [2], \"axis_names\": [\"model\"]}, \"layout_map\": {\"dense.*kernel\": [null, "
      "\"model\"]})";
  if (!cfg.contains("mesh") || !cfg["mesh"].is_object())
    throw ValueError("spec: a model_parallel distribution needs a `mesh` object" + example);
  const Json& mj = cfg["mesh"];
  check_config_keys(mj, {"shape", "axis_names", "devices"}, "distribution.mesh");
  if (!mj.contains("shape") || !mj.contains("axis_names"))
    throw ValueError("spec: distribution.mesh needs `shape` and `axis_names`" + example);
  DeviceMesh mesh(get_or<std::vector<int64_t>>(mj, "shape", {}), get_or<std::vector<std::string>>(mj, "axis_names", {}),
                  get_or<std::vector<std::string>>(mj, "devices", {}));
  LayoutMap map(mesh);
  const Json lm = cfg.value("layout_map", Json::object());
  if (!lm.is_object()) throw ValueError("spec: distribution.layout_map must be an object" + example);
  for (auto& [key, axes] : lm.items()) {
    if (!axes.is_array())
      throw ValueError("spec: distribution.layout_map[\"" + key + "\"] must be a list of mesh axis names or null" +
                       example);
    TensorLayout l;
    for (auto& a : axes) {
      if (!a.is_null() && !a.is_string())
        throw ValueError("spec: distribution.layout_map[\"" + key + "\"] must hold mesh axis names or null. Received " +
                         a.dump());
      l.axes.push_back(a.is_null() ? "" : a.get<std::string>());
    }
    map.set(key, l);
  }
  std::optional<std::string> batch;
  if (cfg.contains("batch_dim_name") && !cfg["batch_dim_name"].is_null())
    batch = get_or<std::string>(cfg, "batch_dim_name", "");
  ModelParallelOptions o;
  o.timeout_seconds = get_or<double>(cfg, "timeout_seconds", 0.0);
  o.bucket_cap_mb = get_or<double>(cfg, "bucket_cap_mb", 25.0);
  return std::make_shared<ModelParallel>(map, batch, o);
}

}  // namespace kiln::distribute
