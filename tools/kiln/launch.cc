// kiln launch: starts the ranks of a distributed job on this host, as
// torchrun does (kiln/distribute/launcher.h; docs/DISTRIBUTED.md).
//
//   kiln launch --nproc_per_node N [--nnodes M --node_rank R --master_addr A
//               --master_port P] [--max_restarts K] [--threads_per_rank T]
//               [--grace_seconds S] -- PROGRAM ARGS...
//   kiln launch --num_ps P --num_workers W [--max_restarts K]
//               [--threads_per_rank T] [--grace_seconds S] -- PROGRAM ARGS...
//
// Everything after `--` is the program and its arguments, passed on
// verbatim (kiln parses none of it). The exit status is the launcher's:
// 0 when every rank exited 0, else the failing rank's (128+signal if it was
// killed); with --num_ps the chief's; 128+signal when the launcher was
// interrupted, 2 for bad options.
#include <algorithm>
#include <memory>

#include "kiln/core/error.h"
#include "kiln/distribute/launcher.h"
#include "tools/kiln/cli.h"

namespace kiln::cli {

Command add_launch_command(CLI::App& app) {
  auto o = std::make_shared<distribute::LaunchOptions>();
  auto status = std::make_shared<int>(0);
  CLI::App* sub = app.add_subcommand(
      "launch",
      "Start the ranks of a distributed job on this host (torchrun): kiln launch --nproc_per_node 2 -- kiln "
      "train spec.json; or a parameter-server job: kiln launch --num_ps 1 --num_workers 2 -- kiln train "
      "spec.json");
  // torchrun spells them both ways.
  sub->add_option("--nproc_per_node,--nproc-per-node", o->nproc_per_node, "Ranks on this host (1..1024)")
      ->capture_default_str();
  sub->add_option("--nnodes", o->nnodes, "Hosts in the job (each runs one kiln launch)")->capture_default_str();
  sub->add_option("--node_rank,--node-rank", o->node_rank,
                  "This host's index, 0..nnodes-1; its ranks are "
                  "node_rank*nproc_per_node + 0..nproc_per_node-1")
      ->capture_default_str();
  sub->add_option("--master_addr,--master-addr", o->master_addr, "Address of rank 0's host (MASTER_ADDR)")
      ->capture_default_str();
  sub->add_option("--master_port,--master-port", o->master_port, "Port of the rendezvous on it (MASTER_PORT)")
      ->capture_default_str();
  sub->add_option("--max_restarts,--max-restarts", o->max_restarts,
                  "Restarts of the whole group after a rank fails (with --num_ps: of each failed worker or ps "
                  "task alone; KILN_RESTART_COUNT tells them)")
      ->capture_default_str();
  sub->add_option("--threads_per_rank,--threads-per-rank", o->threads_per_rank,
                  "Intra-op and BLAS threads per rank (0: this host's cores / nproc_per_node)")
      ->capture_default_str();
  sub->add_option("--grace_seconds,--grace-seconds", o->grace_seconds,
                  "Seconds a rank has to exit after SIGTERM before SIGKILL")
      ->capture_default_str();
  sub->add_option("--num_ps,--num-ps", o->num_ps,
                  "Parameter-server mode: ps tasks to start, with 1 chief and --num_workers workers, each given "
                  "TF_CONFIG (0..64; 0: ranks)")
      ->capture_default_str();
  sub->add_option("--num_workers,--num-workers", o->num_workers,
                  "Workers besides the chief, with --num_ps (1..1024); a failed worker or ps task restarts alone")
      ->capture_default_str();
  sub->add_option("program", o->command, "After `--`: PROGRAM ARGS... (PROGRAM \"kiln\" is this kiln)");

  Command c;
  c.app = sub;
  c.exit_status = status;
  c.run = [o, sub, status] {
    // CLI11 keeps the `--` it met in remaining(); without it the program's
    // own options would have been taken for kiln's.
    auto rest = sub->remaining();
    if (!o->command.empty() && std::find(rest.begin(), rest.end(), "--") == rest.end())
      throw ValueError("kiln launch: put the program after `--` (received `" + o->command[0] +
                       "` before it), e.g. kiln launch --nproc_per_node 2 -- kiln train spec.json");
    *status = distribute::launch(*o);
  };
  return c;
}

}  // namespace kiln::cli
