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
// Each rank runs in its own process group (stopping a rank also stops what
// it started; whatever is left of a rank's group when the rank itself exits
// is killed), with stdin from /dev/null, SIGPIPE at its default and no file
// descriptors of the launcher's but 0-2. Ranks cannot outlive the launcher
// (PR_SET_PDEATHSIG: SIGKILL when the thread that called launch() ends).
// PROGRAM "kiln" is this executable (/proc/self/exe); any other name is
// looked up in PATH (execvp). A program that cannot be run exits 127.
//
// Return value (the `kiln launch` exit status): 0 when every rank exits 0;
// otherwise the first failing rank's exit status (128+signal if killed) once
// no restart is left, or 128+signal when the launcher was interrupted.
//
// Thread safety: launch() is not reentrant (it owns the process's SIGINT,
// SIGTERM, SIGHUP and SIGCHLD handlers while it runs, and restores the
// previous ones when it returns); a second concurrent call throws
// StateError. Everything it waits for is bounded: a rank's group is
// SIGKILLed `grace_seconds` after it was asked to stop, and output of
// processes that escaped their rank's group is read for at most 2 seconds
// after the last rank exits.
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
  int max_restarts = 0;     // 0 .. 1000000
  // Intra-op + BLAS threads per rank; 0: the host's cores / nproc_per_node
  // (at least 1).
  int threads_per_rank = 0;
  double grace_seconds = 10;  // SIGTERM -> SIGKILL when stopping ranks; 0 .. 86400
  // PROGRAM ARGS...; "kiln" as PROGRAM means this kiln executable.
  std::vector<std::string> command;
  // Where the prefixed lines and the launcher's own lines go (the launcher's
  // stdout/stderr by default). Borrowed; launch() writes whole lines.
  int out_fd = 1;
  int err_fd = 2;
};

// Throws ValueError naming the bad field, its value and the allowed range.
void validate(const LaunchOptions& o);

// Cores this process may run on (sched_getaffinity; else
// std::thread::hardware_concurrency), at least 1.
int available_cores();

// The threads each rank gets: o.threads_per_rank, or available_cores() /
// o.nproc_per_node when that is 0, at least 1.
int threads_per_rank(const LaunchOptions& o);

// Validates `o` (ValueError naming the bad field and its range), runs the
// group until every rank exits 0 (returns 0) or it fails with no restart left
// (returns the failing rank's exit status, 128+signal if killed, or 1 when a
// rank could not be started), or the launcher is interrupted (128+signal).
// Throws IOError when the launcher cannot set itself up (no pipe).
int launch(const LaunchOptions& o);

}  // namespace kiln::distribute
