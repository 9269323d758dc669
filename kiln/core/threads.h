// Thread set-up, done once at start-up (the CLI, benchmarks and tests call
// configure_threads() before any tensor work).
//
// Measured on this 2-core machine (784-256-256-10 MLP, one epoch of
// hand-written LibTorch steps; see docs/PERFORMANCE.md):
//   OpenMP 2 + OpenBLAS 2, OpenMP threads spinning (libgomp default)  3.2 s
//   OpenMP 2 + OpenBLAS 1                                             1.0 s
//   OpenMP 2 + OpenBLAS 2, OMP_WAIT_POLICY=PASSIVE                    0.88 s
// OpenBLAS's pthread pool and libgomp's spinning pool fight for the same
// cores. So kiln sizes intra-op threads to the machine's cores (LibTorch's
// own default counts physical cores and picks 1 on a 2-vCPU machine) and
// gives OpenBLAS the same count only when OpenMP threads sleep while idle
// (OMP_WAIT_POLICY=PASSIVE); otherwise OpenBLAS gets one thread. MKL (the
// pip wheel's BLAS) runs on OpenMP's threads and needs no such sizing. libgomp
// reads that variable once at load, so executables call
// prepare_thread_environment(argv) first thing in main(): it re-executes the
// program once with OMP_WAIT_POLICY=PASSIVE unless the user set it.
// Override the count with --threads / KILN_NUM_THREADS.
#pragma once

namespace kiln {

struct ThreadConfig {
  int intra_op = 0;  // 0: KILN_NUM_THREADS if set, else the machine's cores
  int inter_op = 1;  // kiln's own pipelines use explicit threads
};

enum class ThreadProfile {
  kDefault,
  // A server: OpenBLAS's idle workers also sleep at once
  // (OPENBLAS_THREAD_TIMEOUT=4, i.e. 2^4 cycles). By default each spins
  // ~2^28 cycles calling sched_yield() after every product, which in a
  // server takes the cores from the request threads: 16% of `kiln serve`'s
  // CPU under REST load; the MNIST MLP served 18,200 -> 20,300 requests/s
  // with it. In a tight training or benchmark loop the spinning pays (the
  // in-process batch-32 bound drops 231k -> 133k rows/s without it), so
  // only servers use this profile.
  kServing,
};

// Re-executes the current program with OMP_WAIT_POLICY=PASSIVE (and the
// profile's variables) where they are unset; returns normally when all are
// set already, or if exec fails. libgomp and OpenBLAS read them once at
// load. Call before anything starts threads.
void prepare_thread_environment(char** argv, ThreadProfile profile = ThreadProfile::kDefault);

// Applies `cfg`. Returns the intra-op count in force.
int configure_threads(ThreadConfig cfg = {});

// Number of intra-op threads in force.
int num_threads();

// The BLAS that LibTorch's float products run on, read from LibTorch's own
// build settings (BLAS_INFO): OpenBLAS (a pthread pool of its own beside
// OpenMP's, which kiln sizes) or MKL (the pip wheel's and pytorch.org's
// LibTorch: it runs on OpenMP's threads, so it cannot oversubscribe, but it
// keeps a count of its own that at::set_num_threads sets and that
// omp_set_num_threads does not change; kiln's per-thread caps set MKL's
// count for the thread too).
enum class BlasLibrary { kOpenBlas, kMkl, kOther };
BlasLibrary blas_library();
// "OpenBLAS", "MKL" or what BLAS_INFO names.
const char* blas_library_name();

// The thread count the BLAS reports: OpenBLAS's pool, MKL's for the calling
// thread; 0 if neither is loaded.
int blas_num_threads();

// True when libgomp's idle threads sleep (OMP_WAIT_POLICY=PASSIVE).
bool omp_threads_passive();

// Sets the calling thread's OpenMP count (ATen's parallel ops, oneDNN) and,
// with MKL, MKL's count for the thread, to n >= 1; other threads keep theirs. ATen gives a thread the global count on
// its first parallel call, so this lets it do that first. Returns the count
// before, or 0 where LibTorch has no OpenMP (then nothing changes).
int set_thread_intra_op_threads(int n);

// Caps the intra-op threads of the tensor work the calling thread does until
// destroyed, then restores the counts. n >= 1; a cap at or above the count in
// force changes nothing.
//   { IntraOpThreadCap one(1); y = model.predict_on_batch(x); }
// OpenMP's count is the calling thread's own (set_thread_intra_op_threads).
// OpenBLAS's pthread pool has one count for the process: a product another
// thread starts meanwhile may also run on fewer threads (slower, never wrong).
// Work that never calls OpenBLAS (oneDNN's int8 GEMM) passes Blas::kLeave
// and caps OpenMP only.
class IntraOpThreadCap {
 public:
  enum class Blas { kCap, kLeave };
  explicit IntraOpThreadCap(int n, Blas blas = Blas::kCap);
  ~IntraOpThreadCap();
  IntraOpThreadCap(const IntraOpThreadCap&) = delete;
  IntraOpThreadCap& operator=(const IntraOpThreadCap&) = delete;

 private:
  int omp_before_ = 0;         // 0: OpenMP's count unchanged
  int blas_before_ = 0;        // 0: OpenBLAS's count unchanged
  int mkl_local_before_ = -1;  // -1: MKL's count for this thread unchanged
};

}  // namespace kiln
