#include "kiln/distribute/data_parallel.h"

#include "kiln/core/config_keys.h"
#include "kiln/core/error.h"
#include "kiln/core/json.h"
#include "kiln/distribute/model_parallel.h"

namespace kiln::distribute {

DataParallel::DataParallel(DataParallelOptions o) : o_(std::move(o)) {
  for (auto& d : o_.devices) devices_.push_back(resolve_device(d, "DataParallel: devices"));
  if (!(o_.bucket_cap_mb > 0))
    throw ValueError("DataParallel: `bucket_cap_mb` must be > 0. Received: bucket_cap_mb=" +
                     std::to_string(o_.bucket_cap_mb));
  if (o_.auto_shard != "data" && o_.auto_shard != "off")
    throw ValueError("DataParallel: `auto_shard` must be \"data\" or \"off\". Received: auto_shard=" + o_.auto_shard);
  if (o_.timeout_seconds < 0)
    throw ValueError("DataParallel: `timeout_seconds` must be >= 0 (0: the default). Received: " +
                     std::to_string(o_.timeout_seconds));
  if (o_.zero_stage < 0 || o_.zero_stage > 2)
    throw ValueError(
        "DataParallel: `zero_stage` must be 0 (off), 1 (shard the optimizer state) or 2 (shard the "
        "optimizer state and the gradients). Received: zero_stage=" +
        std::to_string(o_.zero_stage));
  cluster_ = o_.cluster ? *o_.cluster : resolve_cluster();
  if (!devices_.empty()) device_ = devices_[cluster_.local_rank % devices_.size()];
  if (cluster_.world_size > 1)
    coll_ = Collectives::connect(cluster_, {.timeout_seconds = o_.timeout_seconds, .device = device()});
}

void DataParallel::all_reduce_sum(std::vector<at::Tensor>& tensors) const {
  if (coll_) coll_->all_reduce_sum(tensors);
}

std::function<void()> DataParallel::all_reduce_sum_async(std::vector<at::Tensor>& tensors) const {
  if (!coll_) return [] {};
  if (tensors.size() == 1 && tensors[0].is_contiguous()) return coll_->all_reduce_sum_async(tensors[0]);
  all_reduce_sum(tensors);
  return [] {};
}

std::function<void()> DataParallel::reduce_sum_async(std::vector<at::Tensor>& tensors, int root) const {
  if (!coll_) return [] {};
  if (tensors.size() == 1 && tensors[0].is_contiguous()) return coll_->reduce_sum_async(tensors[0], root);
  all_reduce_sum(tensors);
  return [] {};
}

void DataParallel::broadcast(std::vector<at::Tensor>& tensors, int root) const {
  if (coll_) coll_->broadcast(tensors, root);
}

void DataParallel::barrier() const {
  if (coll_) coll_->barrier();
}

Distribution::GradientSync DataParallel::gradient_sync() const {
  GradientSync g;
  g.bucket_bytes = static_cast<int64_t>(o_.bucket_cap_mb * (1 << 20));
  g.compress_bf16 = o_.compress_bf16;
  g.zero_stage = o_.zero_stage;
  return g;
}

std::shared_ptr<Distribution> distribution_from_config(const Json& cfg) {
  if (cfg.is_null()) {
    ClusterSpec c = resolve_cluster();
    if (c.world_size > 1) return std::make_shared<DataParallel>(DataParallelOptions{.cluster = c});
    return nullptr;
  }
  if (!cfg.is_object()) throw ValueError("spec: `distribution` must be an object like {\"type\": \"data_parallel\"}");
  if (cfg.value("type", Json()) == "model_parallel") return model_parallel_from_config(cfg);
  check_config_keys(
      cfg, {"type", "bucket_cap_mb", "compress_bf16", "auto_shard", "timeout_seconds", "devices", "zero_stage"},
      "distribution");
  const std::string type = get_or<std::string>(cfg, "type", "");
  if (type == "none") return nullptr;
  if (type != "data_parallel")
    throw ValueError(
        "spec: distribution `type` must be \"data_parallel\", \"model_parallel\" or \"none\". Received: type=" +
        cfg.value("type", Json()).dump());
  DataParallelOptions o;
  o.bucket_cap_mb = get_or<double>(cfg, "bucket_cap_mb", 25.0);
  o.compress_bf16 = get_or<bool>(cfg, "compress_bf16", false);
  o.timeout_seconds = get_or<double>(cfg, "timeout_seconds", 0.0);
  o.auto_shard = get_or<std::string>(cfg, "auto_shard", "data");
  o.devices = get_or<std::vector<std::string>>(cfg, "devices", {});
  if (cfg.contains("zero_stage") && !cfg["zero_stage"].is_null()) {
    const Json& z = cfg["zero_stage"];
    if (!z.is_number_integer())
      throw ValueError("spec: distribution `zero_stage` must be 0, 1 or 2. Received: zero_stage=" + z.dump());
    o.zero_stage = z.get<int>();
  }
  return std::make_shared<DataParallel>(o);
}

}  // namespace kiln::distribute
