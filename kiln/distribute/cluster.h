// Who this process is in a multi-process job: the one cluster resolver.
//
// resolve_cluster() reads, in this order, the first source present:
//   1. torchrun's variables (what `kiln launch`, torchrun and a Kubernetes
//      PyTorchJob set): RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
//      MASTER_ADDR, MASTER_PORT;
//   2. TF_CONFIG (a TFJob, or tf.distribute's own convention):
//      {"cluster": {"chief": ["host:port"], "worker": ["host:port", ...]},
//       "task": {"type": "worker", "index": 0}}. The chief is rank 0, then
//      the workers in order (without a chief, worker 0 is rank 0); the
//      master is rank 0's address. LOCAL_RANK counts earlier tasks on the
//      same host;
//   3. Slurm's (srun): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
//      SLURM_NTASKS_PER_NODE (or SLURM_TASKS_PER_NODE), the first host of
//      SLURM_JOB_NODELIST (or SLURM_NODELIST) as the master, MASTER_PORT if
//      set (else 29500);
//   4. none: one process (rank 0 of 1).
// Bad values (a RANK that is not an integer, a rank outside the world, a
// TF_CONFIG that is not JSON or names an unknown task) are one ValueError
// naming the variable and the fix. A TF_CONFIG that lists "ps" tasks is a
// parameter-server job: resolve_cluster() refuses it (a ps task has no
// data-parallel rank) and resolve_ps_cluster() reads it.
//
// resolve_ps_cluster(): the role-aware view of a parameter-server job, as
// tf.distribute's ParameterServerStrategy reads TF_CONFIG:
//   {"cluster": {"chief": ["h0:2222"], "worker": ["h1:2222", "h2:2222"],
//                "ps": ["h3:2222", "h4:2222"], "evaluator": ["h5:2222"]},
//    "task": {"type": "ps", "index": 1}}
// "ps" and "worker" must list at least one task each; "chief" at most one
// (optional); "evaluator" (optional) takes no part in training, and an
// evaluator task only learns the addresses. Every address is "host:port" and
// no two tasks share one.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace kiln::distribute {

struct ClusterSpec {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source = "none";  // "torchrun", "TF_CONFIG", "slurm" or "none"
};

// Reads the variables through `getenv` (std::getenv by default).
using GetEnv = std::function<std::optional<std::string>(const std::string&)>;
ClusterSpec resolve_cluster(const GetEnv& getenv = {});

// A parameter-server job from TF_CONFIG (see the top of this file).
struct PsClusterSpec {
  std::string task_type;  // "chief", "worker", "ps" or "evaluator"
  int task_index = 0;
  // "host:port" of each task, in TF_CONFIG's order.
  std::vector<std::string> chief;  // empty or one
  std::vector<std::string> worker;
  std::vector<std::string> ps;
  std::vector<std::string> evaluator;

  int num_ps() const { return static_cast<int>(ps.size()); }
  int num_workers() const { return static_cast<int>(worker.size()); }
  bool is_chief() const { return task_type == "chief"; }
  bool is_worker() const { return task_type == "worker"; }
  bool is_ps() const { return task_type == "ps"; }
  bool is_evaluator() const { return task_type == "evaluator"; }
  // This task's own "host:port" (what a ps task serves on).
  const std::string& address() const;
};

// ValueError when TF_CONFIG is unset or lists no "ps" tasks (naming the fix),
// or for a malformed cluster or task.
PsClusterSpec resolve_ps_cluster(const GetEnv& getenv = {});
// Whether TF_CONFIG is set and its cluster lists "ps" tasks (no validation
// beyond that; malformed JSON is false).
bool is_ps_cluster(const GetEnv& getenv = {});

// "node[01-04,07],other" -> "node01" (Slurm's compressed host lists).
std::string first_slurm_host(const std::string& nodelist);

}  // namespace kiln::distribute
