// ThreadPool: kiln's one pool of worker threads (dataset map, batch
// prediction shards, tuning workers, the server's loader jobs).
//
// Contract:
//   - A fixed number of workers, started in the constructor; each runs
//     `on_thread_start` first (e.g. use_one_intra_op_thread_here).
//   - submit(f) queues f and returns a std::future of its result; an
//     exception f throws is stored in that future and rethrown by get().
//     Tasks start in submission order but finish in any order: callers that
//     need results in order keep the futures in order (the dataset map does).
//   - The queue is unbounded: every caller bounds its own work in flight
//     (the map keeps 2x workers, the others submit one task per worker).
//   - shutdown(kRun) runs what is queued, shutdown(kDiscard) drops it (each
//     dropped task's future reports std::future_error broken_promise); both
//     wait for running tasks and join the workers. Idempotent. The
//     destructor calls shutdown(kDiscard). submit() after shutdown throws
//     StateError.
//   - wait_until_idle(deadline): true once nothing is queued or running.
// Thread safety: every member may be called concurrently, and a task may
// submit more tasks; a task must not call shutdown() or destroy its pool.
//
//   ThreadPool pool(ThreadPoolOptions{.num_threads = 4});
//   std::future<int> f = pool.submit([] { return 6 * 7; });
//   int v = f.get();  // 42, or the task's exception
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace kiln {

struct ThreadPoolOptions {
  int num_threads = 1;                    // >= 1 (ValueError otherwise)
  std::function<void()> on_thread_start;  // run once in each worker, first
};

class ThreadPool {
 public:
  using Clock = std::chrono::steady_clock;
  enum class QueuedWork { kRun, kDiscard };

  explicit ThreadPool(ThreadPoolOptions options);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  template <class F>
  std::future<std::invoke_result_t<std::decay_t<F>>> submit(F&& f) {
    using R = std::invoke_result_t<std::decay_t<F>>;
    auto task = std::make_shared<std::packaged_task<R()>>(std::forward<F>(f));
    std::future<R> result = task->get_future();
    enqueue([task] { (*task)(); });
    return result;
  }

  void shutdown(QueuedWork queued = QueuedWork::kDiscard);

  // True once no task is queued or running (now or before `deadline`).
  bool wait_until_idle(Clock::time_point deadline) const;

  int num_threads() const { return static_cast<int>(workers_.size()); }

 private:
  void enqueue(std::function<void()> task);
  void run(const std::function<void()>& on_start);

  mutable std::mutex mu_;
  mutable std::condition_variable work_cv_;  // a task was queued, or stopping
  mutable std::condition_variable idle_cv_;  // a task finished
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  int64_t running_ = 0;                      // guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
  bool discard_ = false;                     // guarded by mu_
  std::mutex join_mu_;                       // one shutdown joins at a time
  std::vector<std::thread> workers_;         // fixed after the constructor
};

}  // namespace kiln
