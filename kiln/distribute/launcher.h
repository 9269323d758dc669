// The process launcher behind `kiln launch` (torchrun's job for kiln).
//
//   kiln launch --nproc_per_node 2 -- kiln train spec.json
//
//   kiln::distribute::LaunchOptions o;           // the same from C++
//   o.nproc_per_node = 2;
//   o.command = {"kiln", "train", "spec.json"};
//   int status = kiln::distribute::launch(o);    // 0: every rank exited 0
//
// launch() starts `nproc_per_node` copies of a program on this host, one per
// rank, and watches them:
//   - each rank gets torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
//     LOCAL_WORLD_SIZE, GROUP_RANK/NODE_RANK, GROUP_WORLD_SIZE, MASTER_ADDR,
//     MASTER_PORT, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS and
//     KILN_RESTART_COUNT) and a share of the host's cores (KILN_NUM_THREADS,
//     OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, MKL_NUM_THREADS), so ranks never
//     oversubscribe the host; the rest of the environment is the launcher's;
//   - every line a rank writes to stdout/stderr comes out of `out_fd`/`err_fd`
//     prefixed with "[rank<R>] " (whole lines, never mixed; a last line
//     without a newline gets one at EOF; a line longer than 64 KiB is cut
//     into 64 KiB lines);
//   - SIGINT, SIGTERM and SIGHUP sent to the launcher go to every rank's
//     process group; the ranks then get `grace_seconds` to exit before
//     SIGKILL, there is no restart, and launch() returns 128+signal;
//   - when a rank exits non-zero or is killed, the launcher prints one line
//     naming the rank and the cause,
//       kiln launch: rank 1 (pid 1234) exited with status 3; stopping the other ranks
//       kiln launch: rank 1 (pid 1234) was killed by signal 9 (SIGKILL); stopping the other ranks
//       kiln launch: rank 0 (pid 1234) could not run `prog`: No such file or directory (exit status 127)
//     stops the others (SIGTERM to each rank's process group, then SIGKILL
//     after `grace_seconds`) and, while restarts are left, starts the whole
//     group again ("kiln launch: restarting all ranks (restart 1 of K)";
//     elastic restart: every rank resumes from its checkpoint).
//
// Parameter-server mode (num_ps > 0; then num_workers >= 1, and
// nproc_per_node and nnodes stay 1):
//
//   kiln launch --num_ps 2 --num_workers 3 --max_restarts 3 -- kiln train spec.json
//
// launch() starts 1 chief, `num_workers` workers and `num_ps` ps tasks on
// this host, all running the same command, and watches them:
//   - each task gets TF_CONFIG in tf.distribute's format (compact JSON),
//       {"cluster":{"chief":["127.0.0.1:P0"],"worker":["127.0.0.1:P1",...],
//                   "ps":["127.0.0.1:Pk",...]},"task":{"type":"worker","index":0}}
//     with a free loopback port per task (all picked before any task starts;
//     a task keeps its port across restarts), KILN_RESTART_COUNT (its own
//     restarts) and the thread variables above: the chief and each worker
//     get threads_per_rank() threads, each ps task 1. None of torchrun's
//     variables is set (nor inherited), so kiln's resolvers see a
//     parameter-server task, never a data-parallel rank;
//   - output lines are prefixed "[chief0] ", "[worker1] ", "[ps0] ";
//   - a worker or ps task that exits non-zero or is killed is restarted
//     alone (same TF_CONFIG) while it has restarts left (`max_restarts` per
//     task), the others running on untouched:
//       kiln launch: worker 1 (pid 1234) was killed by signal 9 (SIGKILL); restarting it (restart 1 of 3)
//       kiln launch: ps 0 (pid 1234) exited with status 3; no restart left (--max_restarts 3); the job goes on without
//       it
//     one that exits 0 has finished and is not restarted;
//   - when the chief exits, however it does, the job is over: the other
//     tasks are stopped (SIGTERM, SIGKILL `grace_seconds` later; one line,
//     "kiln launch: chief 0 (pid 1234) exited with status 0; stopping the
//     other tasks", when some still ran) and launch() returns the chief's
//     exit status. The chief is never restarted. Signals to the launcher are
//     handled as above.
//
// Every task (rank) runs in its own process group (stopping it also stops
// what it started; whatever is left of its group when the task itself exits
// is killed), with stdin from /dev/null, SIGPIPE at its default and no file
// descriptors of the launcher's but 0-2. Tasks cannot outlive the launcher
// (PR_SET_PDEATHSIG: SIGKILL when the thread that called launch() ends).
// PROGRAM "kiln" is this executable (/proc/self/exe); any other name is
// looked up in PATH (execvp). A program that cannot be run exits 127.
//
// Return value (the `kiln launch` exit status): 0 when every rank exits 0;
// otherwise the first failing rank's exit status (128+signal if killed) once
// no restart is left; in parameter-server mode, the chief's exit status
// (128+signal if killed); 128+signal when the launcher was interrupted.
//
// Thread safety: launch() is not reentrant (it owns the process's SIGINT,
// SIGTERM, SIGHUP and SIGCHLD handlers while it runs, and restores the
// previous ones when it returns); a second concurrent call throws
// StateError. Everything it waits for is bounded: a task's group is
// SIGKILLed `grace_seconds` after it was asked to stop, and output of
// processes that escaped their task's group is read for at most 2 seconds
// after the last task exits.
#pragma once

#include <string>
#include <vector>

namespace kiln::distribute {

struct LaunchOptions {
  int nproc_per_node = 1;  // 1 .. 1024 ranks on this host
  int nnodes = 1;          // 1 .. 65536 hosts
  int node_rank = 0;       // 0 .. nnodes-1; ranks here are node_rank*nproc_per_node + local
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;  // 1 .. 65535
  // 0 .. 1000000: restarts of the whole group; in parameter-server mode,
  // of each worker and ps task alone.
  int max_restarts = 0;
  // Intra-op + BLAS threads per rank (per chief and worker in
  // parameter-server mode); 0: the host's cores / nproc_per_node, or
  // / (1 + num_workers) in parameter-server mode (at least 1).
  int threads_per_rank = 0;
  double grace_seconds = 10;  // SIGTERM -> SIGKILL when stopping tasks; 0 .. 86400
  // Parameter-server mode: num_ps (0 .. 64) > 0 selects it and starts
  // 1 chief + num_workers (1 .. 1024) workers + num_ps ps tasks; 0: ranks.
  int num_ps = 0;
  int num_workers = 0;
  // PROGRAM ARGS...; "kiln" as PROGRAM means this kiln executable.
  std::vector<std::string> command;
  // Where the prefixed lines and the launcher's own lines go (the launcher's
  // stdout/stderr by default). Borrowed; launch() writes whole lines.
  int out_fd = 1;
  int err_fd = 2;
};

// Throws ValueError naming the bad field, its value and the allowed range
// (or the two fields that do not go together: num_ps with nproc_per_node or
// nnodes other than 1, num_workers without num_ps).
void validate(const LaunchOptions& o);

// Cores this process may run on (sched_getaffinity; else
// std::thread::hardware_concurrency), at least 1.
int available_cores();

// The threads each rank (each chief and worker) gets: o.threads_per_rank,
// or when that is 0 available_cores() / o.nproc_per_node (/ (1 +
// o.num_workers) when o.num_ps > 0), at least 1.
int threads_per_rank(const LaunchOptions& o);

// Validates `o` (ValueError naming the bad field and its range), runs the
// group until every rank exits 0 (returns 0) or it fails with no restart left
// (returns the failing rank's exit status, 128+signal if killed, or 1 when a
// rank could not be started), or the launcher is interrupted (128+signal).
// In parameter-server mode: until the chief exits (returns its exit status).
// Throws IOError when the launcher cannot set itself up (no pipe, no free
// port).
int launch(const LaunchOptions& o);

}  // namespace kiln::distribute
