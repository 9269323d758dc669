#include "kiln/core/thread_pool.h"

#include <string>

#include "kiln/core/error.h"

namespace kiln {

ThreadPool::ThreadPool(ThreadPoolOptions options) {
  if (options.num_threads < 1)
    throw ValueError("ThreadPool: `num_threads` must be at least 1. Received: num_threads=" +
                     std::to_string(options.num_threads));
  workers_.reserve(options.num_threads);
  for (int i = 0; i < options.num_threads; ++i)
    workers_.emplace_back([this, on_start = options.on_thread_start] { run(on_start); });
}

ThreadPool::~ThreadPool() { shutdown(QueuedWork::kDiscard); }

void ThreadPool::enqueue(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopping_) throw StateError("ThreadPool: submit() after shutdown()");
    queue_.push_back(std::move(task));
  }
  work_cv_.notify_one();
}

void ThreadPool::shutdown(QueuedWork queued) {
  std::deque<std::function<void()>> dropped;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!stopping_) {
      stopping_ = true;
      discard_ = queued == QueuedWork::kDiscard;
    }
    if (discard_) dropped.swap(queue_);
  }
  work_cv_.notify_all();
  // Destroyed outside the lock: each drop breaks its future's promise.
  dropped.clear();
  idle_cv_.notify_all();
  std::lock_guard<std::mutex> j(join_mu_);
  for (auto& t : workers_)
    if (t.joinable()) t.join();
}

bool ThreadPool::wait_until_idle(Clock::time_point deadline) const {
  std::unique_lock<std::mutex> l(mu_);
  return idle_cv_.wait_until(l, deadline, [&] { return queue_.empty() && running_ == 0; });
}

void ThreadPool::run(const std::function<void()>& on_start) {
  if (on_start) on_start();
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    work_cv_.wait(l, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and nothing left to run
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    ++running_;
    l.unlock();
    task();  // submit() wraps tasks in packaged_task: exceptions go to the future
    task = nullptr;
    l.lock();
    --running_;
    idle_cv_.notify_all();
  }
}

}  // namespace kiln
