#include "kiln/serving/core/compute_pool.h"

#include <string>

#include "kiln/core/error.h"
#include "kiln/core/threads.h"

namespace kiln::serving {
namespace {

// A task that throws breaks the pool's promise that its request is
// answered: terminate loudly rather than lose the answer.
void run_task(const std::function<void()>& task) noexcept { task(); }

}  // namespace

void ComputePoolOptions::validate() const {
  if (num_threads < 1)
    throw ValueError("ComputePool: `num_threads` must be at least 1. Received: num_threads=" +
                     std::to_string(num_threads));
  if (max_queued < 1)
    throw ValueError("ComputePool: `max_queued` must be at least 1. Received: max_queued=" +
                     std::to_string(max_queued));
  if (intra_op_threads < 1)
    throw ValueError("ComputePool: `intra_op_threads` must be at least 1. Received: intra_op_threads=" +
                     std::to_string(intra_op_threads));
}

ComputePool::ComputePool(ComputePoolOptions options) : options_(options) {
  options_.validate();
  workers_.reserve(options_.num_threads);
  for (int i = 0; i < options_.num_threads; ++i) workers_.emplace_back([this] { run(); });
}

ComputePool::~ComputePool() { stop(); }

ComputePool::Submit ComputePool::submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopping_) return Submit::kStopped;
    if (static_cast<int64_t>(queue_.size()) >= options_.max_queued) return Submit::kFull;
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
  return Submit::kQueued;
}

void ComputePool::stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  std::lock_guard<std::mutex> j(join_mu_);
  for (auto& t : workers_)
    if (t.joinable()) t.join();
}

void ComputePool::run() {
  set_thread_intra_op_threads(options_.intra_op_threads);  // this worker's own count
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    cv_.wait(l, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and every queued task has run
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    l.unlock();
    run_task(task);
    task = nullptr;  // the request's captures (handle, inputs) go before the next wait
    l.lock();
  }
}

}  // namespace kiln::serving
