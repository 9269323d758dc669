#include "kiln/serving/core/compute_pool.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kiln/core/error.h"

namespace kiln::serving {
namespace {

// A gate tasks wait on until the test opens it (30 s: a guard against a
// hang, not a timing).
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;  // guarded by mu
  int waiting = 0;    // guarded by mu: tasks blocked here
  void pass() {
    std::unique_lock<std::mutex> l(mu);
    ++waiting;
    cv.notify_all();
    cv.wait_for(l, std::chrono::seconds(30), [&] { return open; });
  }
  bool wait_for_waiting(int n) {
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, std::chrono::seconds(30), [&] { return waiting >= n; });
  }
  void release() {
    std::lock_guard<std::mutex> l(mu);
    open = true;
    cv.notify_all();
  }
};

TEST(ComputePool, RunsTasksInSubmissionOrderOffTheCallersThread) {
  ComputePool pool(ComputePoolOptions{.num_threads = 1});
  Gate gate;
  std::mutex mu;
  std::vector<int> order;  // guarded by mu
  std::thread::id ran_on;
  ASSERT_EQ(pool.submit([&] {
    ran_on = std::this_thread::get_id();
    gate.pass();
  }),
            ComputePool::Submit::kQueued);
  ASSERT_TRUE(gate.wait_for_waiting(1));
  for (int i = 0; i < 100; ++i)
    ASSERT_EQ(pool.submit([&, i] {
      std::lock_guard<std::mutex> l(mu);
      order.push_back(i);
    }),
              ComputePool::Submit::kQueued);
  gate.release();
  pool.stop();
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
  EXPECT_NE(ran_on, std::this_thread::get_id());
}

TEST(ComputePool, StopRunsEveryQueuedTaskThenRefusesNewOnes) {
  ComputePool pool(ComputePoolOptions{.num_threads = 1});
  Gate gate;
  std::atomic<int> ran{0};
  ASSERT_EQ(pool.submit([&] {
    gate.pass();
    ++ran;
  }),
            ComputePool::Submit::kQueued);
  ASSERT_TRUE(gate.wait_for_waiting(1));  // in flight
  for (int i = 0; i < 10; ++i) ASSERT_EQ(pool.submit([&] { ++ran; }), ComputePool::Submit::kQueued);
  // stop() while a task runs and ten wait: it returns once all eleven ran.
  auto stopped = std::async(std::launch::async, [&] { pool.stop(); });
  // Submits race with stop(): each is either queued (and must run) or refused
  // (and must not); stop() refuses them once it has begun.
  int queued_late = 0;
  auto refused_task = std::make_shared<int>(0);
  for (;;) {
    ComputePool::Submit s = pool.submit([&, refused_task] { ++ran; });
    if (s == ComputePool::Submit::kStopped) break;
    if (s == ComputePool::Submit::kFull) {  // stop() has not begun yet, and the queue is full: not run either
      std::this_thread::yield();
      continue;
    }
    ++queued_late;
  }
  gate.release();
  stopped.get();
  EXPECT_EQ(ran.load(), 11 + queued_late);
  EXPECT_EQ(refused_task.use_count(), 1);  // the refused task (and its captures) is gone, unrun
  EXPECT_EQ(pool.submit([&] { ++ran; }), ComputePool::Submit::kStopped);
  pool.stop();  // idempotent
  EXPECT_EQ(ran.load(), 11 + queued_late);
}

TEST(ComputePool, AFullQueueRefusesTheTaskAndDestroysIt) {
  ComputePool pool(ComputePoolOptions{.num_threads = 1, .max_queued = 2});
  Gate gate;
  std::atomic<int> ran{0};
  ASSERT_EQ(pool.submit([&] { gate.pass(); }), ComputePool::Submit::kQueued);
  ASSERT_TRUE(gate.wait_for_waiting(1));  // running: not counted as queued
  EXPECT_EQ(pool.submit([&] { ++ran; }), ComputePool::Submit::kQueued);
  EXPECT_EQ(pool.submit([&] { ++ran; }), ComputePool::Submit::kQueued);
  auto capture = std::make_shared<int>(0);
  EXPECT_EQ(pool.submit([&ran, capture] { ++ran; }), ComputePool::Submit::kFull);
  EXPECT_EQ(capture.use_count(), 1);
  gate.release();
  pool.stop();
  EXPECT_EQ(ran.load(), 2);
}

TEST(ComputePool, ThreadsRunTasksAtTheSameTime) {
  ComputePool pool(ComputePoolOptions{.num_threads = 2});
  Gate gate;
  // Each task waits until both have started: with one thread at a time
  // the first would never see the second.
  std::atomic<int> saw_both{0};
  for (int i = 0; i < 2; ++i)
    ASSERT_EQ(pool.submit([&] {
      gate.pass();
      if (gate.wait_for_waiting(2)) ++saw_both;
    }),
              ComputePool::Submit::kQueued);
  ASSERT_TRUE(gate.wait_for_waiting(2));
  gate.release();
  pool.stop();
  EXPECT_EQ(saw_both.load(), 2);
  EXPECT_EQ(pool.num_threads(), 2);
}

TEST(ComputePool, WorkersUseTheirOwnIntraOpThreadCount) {
  const int before = at::get_num_threads();
  ComputePool pool(ComputePoolOptions{.num_threads = 1, .intra_op_threads = 1});
  std::promise<int> seen;
  ASSERT_EQ(pool.submit([&] { seen.set_value(at::get_num_threads()); }), ComputePool::Submit::kQueued);
  EXPECT_EQ(seen.get_future().get(), 1);
  EXPECT_EQ(at::get_num_threads(), before);  // the caller's count is its own
}

TEST(ComputePool, RejectsInvalidOptionsNamingTheValue) {
  try {
    ComputePool pool(ComputePoolOptions{.num_threads = 0});
    ADD_FAILURE();
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("num_threads=0"), std::string::npos);
  }
  EXPECT_THROW(ComputePool(ComputePoolOptions{.max_queued = 0}), ValueError);
  EXPECT_THROW(ComputePool(ComputePoolOptions{.intra_op_threads = 0}), ValueError);
}

}  // namespace
}  // namespace kiln::serving
