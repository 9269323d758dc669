// ComputePool: the threads that run unbatched predictions (ServerCore with
// batching off), so that the front ends' I/O and polling threads only parse,
// hand over and answer. Without it a request that lands on an I/O thread
// busy computing another request waits for that compute, and a model run
// with N intra-op threads per I/O thread oversubscribes the cores.
//
//   ComputePool pool(ComputePoolOptions{.num_threads = 2, .max_queued = 1024});
//   if (!pool.submit([req] { run(req); }))   // full or stopped: not run
//     answer(req, RESOURCE_EXHAUSTED);
//   pool.stop();                              // runs what is queued, joins
//
// Contract:
//   - num_threads workers start in the constructor; each sets its own
//     intra-op (OpenMP) thread count to intra_op_threads before its first
//     task: the pool's threads are the parallelism (N requests at once on N
//     cores), not N x intra-op threads.
//   - submit(task) queues `task` and returns kQueued; kFull when max_queued
//     tasks already wait (not counting running ones), kStopped after stop().
//     A task that is not queued is destroyed before submit returns, unrun:
//     the caller answers its request itself.
//   - Tasks start in submission order (FIFO); with one thread they also
//     finish in it.
//   - A task must not throw: one that does terminates the process (a task
//     carries a request whose `done` must run exactly once, so it catches
//     its own errors and reports them through `done`).
//   - stop(): later submits return kStopped; every task queued before it
//     still runs (each holds a request waiting for its answer), then the
//     workers join. Idempotent; the destructor calls it.
// Thread safety: every member may be called concurrently, and a task may
// submit more tasks; a task must not call stop() or destroy its pool.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln::serving {

struct ComputePoolOptions {
  int num_threads = 2;        // >= 1 (ValueError otherwise)
  int64_t max_queued = 1024;  // tasks waiting beyond this: kFull; >= 1
  int intra_op_threads = 1;   // OpenMP threads per worker; >= 1
  void validate() const;
};

class ComputePool {
 public:
  enum class Submit { kQueued, kFull, kStopped };

  explicit ComputePool(ComputePoolOptions options);
  ~ComputePool();  // stop()s
  ComputePool(const ComputePool&) = delete;
  ComputePool& operator=(const ComputePool&) = delete;

  Submit submit(std::function<void()> task);
  void stop();

  int num_threads() const { return static_cast<int>(workers_.size()); }

 private:
  void run();

  const ComputePoolOptions options_;
  std::mutex mu_;
  std::condition_variable cv_;               // a task was queued, or stopping
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
  std::mutex join_mu_;                       // one stop() joins at a time
  std::vector<std::thread> workers_;         // fixed after the constructor
};

}  // namespace kiln::serving
