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
// naming the variable and the fix.
#pragma once

#include <functional>
#include <optional>
#include <string>

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

// "node[01-04,07],other" -> "node01" (Slurm's compressed host lists).
std::string first_slurm_host(const std::string& nodelist);

}  // namespace kiln::distribute
