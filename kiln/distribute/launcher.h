// The process launcher behind `kiln launch` (torchrun's job for kiln).
//
// launch() starts `nproc_per_node` copies of a program on this host, one per
// rank, and watches them:
//   - each rank gets torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
//     LOCAL_WORLD_SIZE, GROUP_RANK/NODE_RANK, MASTER_ADDR, MASTER_PORT,
//     TORCHELASTIC_RESTART_COUNT and KILN_RESTART_COUNT) and a share of the
//     host's cores (KILN_NUM_THREADS, OMP_NUM_THREADS, OPENBLAS_NUM_THREADS,
//     MKL_NUM_THREADS), so ranks never oversubscribe the host;
//   - every line a rank writes to stdout/stderr comes out of the launcher's
//     stdout/stderr prefixed with "[rank<R>] " (whole lines, never mixed);
//   - SIGINT, SIGTERM and SIGHUP sent to the launcher go to every rank;
//   - when a rank exits non-zero or is killed, the launcher prints one line
//     naming the rank and the cause, stops the others (SIGTERM, then SIGKILL
//     after `grace_seconds`) and, while restarts are left, starts the whole
//     group again (elastic restart: every rank resumes from its checkpoint).
// Ranks cannot outlive the launcher (PR_SET_PDEATHSIG).
//
// Thread safety: launch() is not reentrant (it owns the process's signal
// handlers while it runs).
#pragma once

#include <string>
#include <vector>

namespace kiln::distribute {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;  // 0 .. nnodes-1; ranks here are node_rank*nproc_per_node + local
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int max_restarts = 0;
  // Intra-op + BLAS threads per rank; 0: the host's cores / nproc_per_node
  // (at least 1).
  int threads_per_rank = 0;
  double grace_seconds = 10;  // SIGTERM -> SIGKILL when stopping ranks
  // PROGRAM ARGS...; "kiln" as PROGRAM means this kiln executable.
  std::vector<std::string> command;
  // Where the prefixed lines go (the launcher's stdout/stderr by default).
  int out_fd = 1;
  int err_fd = 2;
};

// Validates `o` (ValueError naming the bad field and its range), runs the
// group until every rank exits 0 (returns 0) or it fails with no restart left
// (returns the failing rank's exit status, 128+signal if killed, or 1).
int launch(const LaunchOptions& o);

}  // namespace kiln::distribute
