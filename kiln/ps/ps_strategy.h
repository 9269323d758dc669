// Parameter-server training (TF's ParameterServerStrategy with a
// ClusterCoordinator): the same fit() and `kiln train` spec, run by every
// task of a TF_CONFIG cluster with "chief", "worker" and "ps" lists.
//
//   set_distribution(std::make_shared<ps::ParameterServerStrategy>(
//       ps::ParameterServerStrategyOptions{.mode = "sync", .backup_workers = 1}));
//   model->compile(...);
//   model->fit(args);   // what it does depends on this task's role
//
//   spec: "distribution": {"type": "parameter_server", "mode": "async" | "sync",
//                          "backup_workers": 1, "partitioner": {...},
//                          "worker_timeout_seconds": 10, "ps_timeout_seconds": 60,
//                          "checkpoint_steps": 0}
//
// What fit() does on each task (one fit() per job):
//   ps      serves its share of the variables (kiln/ps/parameter_server.h)
//           with the compiled optimizer until the chief ends the job; the
//           data is not read.
//   worker  reads its shard of the training data (every num_workers-th
//           example from its index; datasets through Dataset::shard), and
//           for each step the chief hands it: pulls the variables, runs the
//           train step on its next batch (its own shuffle; its data repeats
//           as long as steps come), pushes the gradients to the ps tasks
//           (and non-trainable values such as moving statistics, last
//           writer wins) and reports its metrics. A heartbeat goes to the
//           chief twice a second.
//   chief   places the variables (round-robin, or split by the partitioner),
//           creates them on the ps tasks from its own initial values, and
//           coordinates (kiln/ps/coordinator.h): each epoch is
//           steps_per_epoch steps (default: the training data's batches,
//           i.e. one pass over the data; sync: that divided by the N
//           gradients a global step averages), handed to whichever worker
//           asks. Its callbacks see every finished step (on_train_batch_end
//           with the workers' summed metrics) and every epoch; at each
//           epoch's end it pulls the variables into its model, runs
//           validation and on_epoch_end, so ModelCheckpoint and the model
//           fit() leaves behind are ordinary Keras models. It alone writes
//           files.
// Modes:
//   async   every push is applied as it arrives; gradients may be computed
//           from variables other workers have updated since (staleness,
//           reported per step and in the summary).
//   sync    each global step averages the first N = num_workers -
//           backup_workers workers' gradients; the backup workers'
//           (stragglers') gradients of that step are dropped.
// Fault tolerance:
//   - a worker that dies (silent for worker_timeout_seconds, or restarted:
//     it rejoins at once) has its unfinished steps given to the others;
//   - a ps task that dies (unreachable, or answering with a new
//     incarnation): the chief stops handing out steps, waits up to
//     ps_timeout_seconds for every ps task to answer, puts its last
//     checkpoint back on all of them and continues from that checkpoint's
//     step (the steps since are done again);
//   - the chief checkpoints in memory after the variables are created, at
//     each epoch's end and every checkpoint_steps steps (0: epochs only),
//     waiting for the steps in flight first.
//   The chief's own death ends the job (as TF: restart it, with
//   BackupAndRestore for the model's weights).
// At the end the chief prints one summary line:
//   "Parameter servers: async, 3 workers, 2 ps: 240 steps, 3 rescheduled,
//    1 worker lost (1 restart), 0 ps restores, 0 failed, 0 dropped, max staleness 4"
// and the tensor bytes moved per worker step:
//   "Parameter servers: per worker step: 203.5 KB pulled, 198.8 KB pushed; 768 worker steps in 4.2 s"
//
// Thread safety: as fit().
#pragma once

#include <memory>
#include <string>

#include "kiln/core/json.h"
#include "kiln/core/variable.h"
#include "kiln/distribute/cluster.h"
#include "kiln/ps/coordinator.h"
#include "kiln/training/fit_runner.h"

namespace kiln {
class Optimizer;
}  // namespace kiln

namespace kiln::ps {

struct ParameterServerStrategyOptions {
  // The job's tasks; default: resolve_ps_cluster() (TF_CONFIG).
  std::optional<distribute::PsClusterSpec> cluster;
  std::string mode = "async";  // "async" or "sync"
  int backup_workers = 0;      // sync: N = num_workers - backup_workers
  // null: whole variables, round-robin; else {"type": "min_size",
  // "min_shard_bytes": B, "max_shards": S} | {"type": "max_size",
  // "max_shard_bytes": B, "max_shards": S} | {"type": "fixed", "num_shards": S}.
  Json partitioner;
  double worker_timeout_seconds = 10;
  double ps_timeout_seconds = 60;
  int64_t checkpoint_steps = 0;
  void validate() const;  // ValueError naming the field
};

// What the chief saw, for tests and the summary line.
struct ParameterServerTrainingStats {
  SchedulerStats scheduler;
  int64_t ps_restores = 0;
  int64_t checkpoints = 0;
  // Tensor bytes the workers pulled from and pushed to the ps tasks, per
  // step (sync: per worker step), since the last ps restart.
  double bytes_pulled_per_step = 0;
  double bytes_pushed_per_step = 0;
  int64_t worker_steps = 0;  // steps the workers ran (sync: stragglers' and failed ones included)
  double train_seconds = 0;  // from the first epoch's start to the last one's end
};

class ParameterServerStrategy : public Distribution, public FitRunner {
 public:
  // ValueError for bad options or a TF_CONFIG without ps tasks.
  explicit ParameterServerStrategy(ParameterServerStrategyOptions options = {});

  const distribute::PsClusterSpec& cluster() const { return cluster_; }
  const ParameterServerStrategyOptions& options() const { return options_; }
  // The chief's figures after fit().
  const ParameterServerTrainingStats& stats() const { return stats_; }

  // Distribution: every task holds whole variables on its CPU; the chief is
  // process 0 (it prints and writes files), workers 1.., ps tasks after.
  TensorLayout layout_for(const std::string& path, const Shape& shape) const override { return {}; }
  int process_index() const override;

  History run_fit(models::Model& model, const FitArgs& args) override;

  // A ps task's whole job (what fit() does on one): serve with `optimizer`
  // until the chief ends the job. `kiln train` calls it without building the
  // model or reading the data.
  void serve(const Optimizer& optimizer);

 private:
  History run_chief(models::Model& model, const FitArgs& args);
  void run_worker(models::Model& model, const FitArgs& args);

  ParameterServerStrategyOptions options_;
  distribute::PsClusterSpec cluster_;
  ParameterServerTrainingStats stats_;
};

// The spec's "distribution" object of type "parameter_server" (ValueError
// naming an unknown key or a bad value).
std::shared_ptr<ParameterServerStrategy> parameter_server_from_config(const Json& cfg);

}  // namespace kiln::ps
