#include "kiln/core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <stdexcept>
#include <thread>

#include "kiln/core/error.h"

namespace kiln {
namespace {

constexpr auto kLongWait = std::chrono::seconds(30);  // only a hang reaches it

TEST(ThreadPool, RunsEveryTaskAndReturnsResults) {
  ThreadPool pool(ThreadPoolOptions{.num_threads = 3});
  EXPECT_EQ(pool.num_threads(), 3);
  std::vector<std::future<int>> results;
  for (int i = 0; i < 100; ++i) results.push_back(pool.submit([i] { return i * i; }));
  std::multiset<int> got;  // completion order is not assumed; futures keep submission order
  for (int i = 0; i < 100; ++i) {
    int v = results[i].get();
    EXPECT_EQ(v, i * i);
    got.insert(v);
  }
  EXPECT_EQ(got.size(), 100u);
}

TEST(ThreadPool, ExceptionsReachTheCaller) {
  ThreadPool pool(ThreadPoolOptions{.num_threads = 2});
  auto bad = pool.submit([]() -> int { throw ValueError("bad element 3"); });
  auto good = pool.submit([] { return 1; });
  try {
    bad.get();
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_STREQ(e.what(), "bad element 3");
  }
  EXPECT_EQ(good.get(), 1);  // the worker survived the exception
  EXPECT_EQ(pool.submit([] { return 2; }).get(), 2);
}

TEST(ThreadPool, OnThreadStartRunsOncePerWorker) {
  std::atomic<int> started{0};
  {
    ThreadPool pool(ThreadPoolOptions{.num_threads = 4, .on_thread_start = [&] { ++started; }});
    pool.shutdown(ThreadPool::QueuedWork::kRun);
  }
  EXPECT_EQ(started.load(), 4);
}

TEST(ThreadPool, ShutdownRunsQueuedWork) {
  ThreadPool pool(ThreadPoolOptions{.num_threads = 1});
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  auto blocker = pool.submit([open] { open.wait(); });
  std::atomic<int> ran{0};
  std::vector<std::future<void>> queued;
  for (int i = 0; i < 10; ++i) queued.push_back(pool.submit([&] { ++ran; }));
  gate.set_value();
  pool.shutdown(ThreadPool::QueuedWork::kRun);
  EXPECT_EQ(ran.load(), 10);
  for (auto& f : queued) EXPECT_NO_THROW(f.get());
  EXPECT_THROW(pool.submit([] {}), StateError);
}

TEST(ThreadPool, ShutdownDiscardsQueuedWork) {
  ThreadPool pool(ThreadPoolOptions{.num_threads = 1});
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  std::promise<void> running;
  auto blocker = pool.submit([open, &running] {
    running.set_value();
    open.wait();
    return 7;
  });
  running.get_future().wait();  // the only worker is busy: the rest stays queued
  std::atomic<int> ran{0};
  std::vector<std::future<void>> queued;
  for (int i = 0; i < 10; ++i) queued.push_back(pool.submit([&] { ++ran; }));
  std::thread stopper([&] { pool.shutdown(ThreadPool::QueuedWork::kDiscard); });
  // The queue is dropped before shutdown waits for the running task.
  ASSERT_EQ(queued.back().wait_for(kLongWait), std::future_status::ready);
  gate.set_value();
  stopper.join();
  EXPECT_EQ(blocker.get(), 7);  // the running task finished
  EXPECT_EQ(ran.load(), 0);
  for (auto& f : queued) {
    try {
      f.get();
      ADD_FAILURE() << "a discarded task ran";
    } catch (const std::future_error& e) {
      EXPECT_EQ(e.code(), std::future_errc::broken_promise);
    }
  }
}

TEST(ThreadPool, DestructorWithQueuedWorkDoesNotHang) {
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  std::future<void> queued;
  {
    ThreadPool pool(ThreadPoolOptions{.num_threads = 1});
    pool.submit([open] { open.wait(); });
    queued = pool.submit([] {});
    gate.set_value();
  }
  // Either it ran before the destructor took the queue, or it was dropped.
  ASSERT_EQ(queued.wait_for(std::chrono::seconds(0)), std::future_status::ready);
}

TEST(ThreadPool, WaitUntilIdle) {
  ThreadPool pool(ThreadPoolOptions{.num_threads = 2});
  EXPECT_TRUE(pool.wait_until_idle(ThreadPool::Clock::now()));
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  auto f = pool.submit([open] { open.wait(); });
  EXPECT_FALSE(pool.wait_until_idle(ThreadPool::Clock::now()));
  gate.set_value();
  EXPECT_TRUE(pool.wait_until_idle(ThreadPool::Clock::now() + kLongWait));
  f.get();
}

TEST(ThreadPool, TasksMaySubmitTasks) {
  ThreadPool pool(ThreadPoolOptions{.num_threads = 1});  // one worker: the inner task waits its turn
  auto outer = pool.submit([&pool] { return pool.submit([] { return 5; }); });
  std::future<int> inner = outer.get();
  EXPECT_EQ(inner.get(), 5);
}

TEST(ThreadPool, RejectsNoWorkers) {
  try {
    ThreadPool pool(ThreadPoolOptions{.num_threads = 0});
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("num_threads=0"), std::string::npos) << e.what();
  }
}

TEST(ThreadPool, ConcurrentSubmitters) {
  ThreadPool pool(ThreadPoolOptions{.num_threads = 3});
  std::atomic<int> sum{0};
  std::vector<std::thread> submitters;
  std::vector<std::vector<std::future<void>>> futures(4);
  for (int t = 0; t < 4; ++t)
    submitters.emplace_back([&, t] {
      for (int i = 0; i < 250; ++i) futures[t].push_back(pool.submit([&] { ++sum; }));
    });
  for (auto& s : submitters) s.join();
  for (auto& fs : futures)
    for (auto& f : fs) f.get();
  EXPECT_EQ(sum.load(), 1000);
}

}  // namespace
}  // namespace kiln
