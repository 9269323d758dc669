// Thread set-up, done once at start-up (the CLI, benchmarks and tests call
// configure_threads() before any tensor work).
//
// Intra-op threads default to the machine's cores (LibTorch's own default
// counts physical cores and can pick 1 on a 2-vCPU machine). OpenBLAS's
// pthread pool and LibTorch's OpenMP pool must not both spin up a thread per
// core: kiln gives OpenBLAS the same count and serialises it against OpenMP
// regions (see threads.cc). Override with --threads / KILN_NUM_THREADS.
#pragma once

namespace kiln {

struct ThreadConfig {
  int intra_op = 0;  // 0: the machine's cores, or KILN_NUM_THREADS if set
  int inter_op = 1;  // kiln's own pipelines use explicit threads
};

// Applies `cfg` (idempotent; the first call also sets inter-op threads, which
// LibTorch allows only once per process). Returns the intra-op count in force.
int configure_threads(ThreadConfig cfg = {});

// Number of intra-op threads in force.
int num_threads();

// The count OpenBLAS reports (0 if OpenBLAS is not loaded).
int blas_num_threads();

}  // namespace kiln
