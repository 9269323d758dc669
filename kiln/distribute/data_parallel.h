// DataParallel: Keras 3's data-parallel distribution, one process per
// replica (rank). Set it before building the model; compile/fit/evaluate/
// predict then run unchanged:
//
//   kiln::set_distribution(std::make_shared<kiln::distribute::DataParallel>());
//   auto model = make_model();
//   model->compile(...);
//   model->fit({.x = {x}, .y = {y}, .batch_size = 256, .epochs = 5});
//
// Started under `kiln launch --nproc_per_node N` (or torchrun, a
// PyTorchJob/TFJob, srun: see cluster.h) the N processes form one job:
//   - the chief's (rank 0's) initial weights go to every rank when fit()
//     starts and again after a BackupAndRestore restore;
//   - `batch_size` is the global batch: every global batch is split by rows
//     across the ranks (rank r gets its r-th share, sizes differing by at
//     most one), so every rank runs the same number of steps and the
//     result matches one process with the same batch (a final batch with
//     fewer rows than ranks is dropped);
//   - gradients are averaged (weighted by each rank's rows) with a bucketed
//     all-reduce started from the backward pass as soon as a bucket's
//     gradients are ready, overlapping communication with computation;
//   - with zero_stage 1 or 2 the optimizer state (and at 2 the gradients)
//     is sharded across the ranks instead of replicated (ZeRO; see
//     DataParallelOptions::zero_stage and docs/DISTRIBUTED.md);
//   - metrics and the loss are reduced exactly (their sums and counts), and
//     validation is sharded and reduced the same way;
//   - only the chief prints progress and writes files (model directories,
//     ModelCheckpoint, BackupAndRestore, TensorBoard, CSVLogger).
// Without a cluster in the environment it is one replica and fit() is
// bit-identical to running with no distribution.
//
// Thread safety: as fit(): one training thread.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/json.h"
#include "kiln/core/variable.h"
#include "kiln/distribute/cluster.h"
#include "kiln/distribute/collectives.h"

namespace kiln::distribute {

struct DataParallelOptions {
  // The device of each process on a machine, by local rank modulo the list's
  // length ("cpu", "cuda", "cuda:N"; "cuda" alone is cuda:LOCAL_RANK, one
  // process per GPU); empty: kiln's default device (the process's GPU when
  // there is one, see kiln/core/device.h). TensorFlow's MirroredStrategy over
  // a machine's GPUs is `kiln launch --nproc_per_node N` with this empty.
  std::vector<std::string> devices;
  double bucket_cap_mb = 25;   // gradient all-reduce bucket size
  bool compress_bf16 = false;  // all-reduce gradients as bfloat16 (halves the bytes)
  // "data" (Keras's auto-shard): every rank reads the same global batches
  // and keeps its share of each. "off": the input is already per rank (e.g.
  // ds.shard(num_replicas(), replica_id()).batch(B / N)); the ranks stop
  // together at the shortest rank's end.
  std::string auto_shard = "data";
  double timeout_seconds = 0;  // collectives; 0: $KILN_COLLECTIVE_TIMEOUT or 300
  // Sharded optimizer state (ZeRO, as PyTorch's ZeroRedundancyOptimizer and
  // DeepSpeed): 0 off; 1: the trainable variables are split across the
  // ranks (whole variables, greedily by size), each rank updates only its
  // own and holds only their optimizer slots (and EMA averages), then every
  // owner broadcasts its new values; 2: as 1, and each gradient bucket is
  // reduced to its owner only, the others freeing theirs. The weights match
  // zero_stage 0 to float rounding (see docs/DISTRIBUTED.md).
  int zero_stage = 0;
  std::optional<ClusterSpec> cluster;  // default: resolve_cluster()
};

class DataParallel : public Distribution {
 public:
  explicit DataParallel(DataParallelOptions o = {});

  TensorLayout layout_for(const std::string& path, const Shape& shape) const override { return {}; }
  int num_replicas() const override { return cluster_.world_size; }
  at::Device device() const override { return device_ ? *device_ : default_device(); }
  int replica_id() const override { return cluster_.rank; }
  void all_reduce_sum(std::vector<at::Tensor>& tensors) const override;
  std::function<void()> all_reduce_sum_async(std::vector<at::Tensor>& tensors) const override;
  std::function<void()> reduce_sum_async(std::vector<at::Tensor>& tensors, int root) const override;
  void broadcast(std::vector<at::Tensor>& tensors, int root = 0) const override;
  void barrier() const override;
  GradientSync gradient_sync() const override;
  bool split_batches() const override { return o_.auto_shard != "off"; }

  const ClusterSpec& cluster() const { return cluster_; }
  const DataParallelOptions& options() const { return o_; }
  // Null for one replica.
  Collectives* collectives() const { return coll_.get(); }

 private:
  DataParallelOptions o_;
  ClusterSpec cluster_;
  std::vector<at::Device> devices_;   // o_.devices, resolved
  std::optional<at::Device> device_;  // this process's (unset: default_device())
  std::shared_ptr<Collectives> coll_;
};

// The distribution a job gets from its spec's "distribution" object
// ({"type": "data_parallel", "bucket_cap_mb": 25, "compress_bf16": false,
// "auto_shard": "data", "timeout_seconds": 300, "zero_stage": 0}), or, without one, DataParallel when the
// environment describes a job of several ranks; null otherwise.
std::shared_ptr<Distribution> distribution_from_config(const Json& cfg);

}  // namespace kiln::distribute
