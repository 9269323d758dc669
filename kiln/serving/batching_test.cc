#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>

#include "kiln/serving/batching.h"
#include "kiln/serving/status.h"

namespace kiln::serving {
namespace {

// Doubles its input and records the batch sizes it saw.
struct Recorder {
  std::mutex mu;
  std::vector<int64_t> sizes;
  BatchScheduler::BatchFn fn() {
    return [this](const std::string&, const TensorMap& in) {
      std::lock_guard<std::mutex> l(mu);
      sizes.push_back(in.at("x").size(0));
      return TensorMap{{"y", in.at("x") * 2}};
    };
  }
};

TEST(BatchScheduler, SplitsARequestLargerThanMaxBatchSize) {
  Recorder r;
  BatchingOptions o;
  o.max_batch_size = 4;
  o.batch_timeout_micros = 0;
  o.num_batch_threads = 1;
  BatchScheduler s(o, r.fn());
  auto x = at::arange(10 * 3, at::kFloat).reshape({10, 3});
  BatchTiming t;
  auto out = s.run("serving_default", {{"x", x}}, std::nullopt, &t);
  EXPECT_TRUE(at::equal(out.at("y"), x * 2));
  int64_t total = 0;
  for (auto n : r.sizes) {
    EXPECT_LE(n, 4);
    total += n;
  }
  EXPECT_EQ(total, 10);
}

TEST(BatchScheduler, PadsToAllowedBatchSizesAndDropsThePadding) {
  Recorder r;
  BatchingOptions o;
  o.max_batch_size = 8;
  o.allowed_batch_sizes = {2, 8};
  o.batch_timeout_micros = 0;
  o.num_batch_threads = 1;
  BatchScheduler s(o, r.fn());
  auto x = at::randn({3, 2});
  auto out = s.run("serving_default", {{"x", x}});
  EXPECT_EQ(out.at("y").size(0), 3);
  EXPECT_TRUE(at::allclose(out.at("y"), x * 2));
  ASSERT_EQ(r.sizes.size(), 1u);
  EXPECT_EQ(r.sizes[0], 8);
}

TEST(BatchScheduler, ConcurrentRequestsShareABatchAndGetTheirOwnRows) {
  Recorder r;
  BatchingOptions o;
  o.max_batch_size = 64;
  o.batch_timeout_micros = 10000000;  // 10 s: the batch closes when full (8 x 8 rows)
  o.num_batch_threads = 1;
  BatchScheduler s(o, r.fn());
  std::vector<std::future<bool>> fs;
  for (int i = 0; i < 8; ++i)
    fs.push_back(std::async(std::launch::async, [&s, i] {
      auto x = at::full({8, 2}, (float)i);
      auto out = s.run("serving_default", {{"x", x}});
      return at::equal(out.at("y"), x * 2);
    }));
  for (auto& f : fs) EXPECT_TRUE(f.get());
  ASSERT_FALSE(r.sizes.empty());
  EXPECT_EQ(r.sizes[0], 64);  // one full batch, closed by size, not by the timeout
}

// Blocks every batch until released, to fill the queue deterministically.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  int entered = 0;
  BatchScheduler::BatchFn fn() {
    return [this](const std::string&, const TensorMap& in) {
      std::unique_lock<std::mutex> l(mu);
      ++entered;
      cv.notify_all();
      cv.wait(l, [&] { return open; });
      return TensorMap{{"y", in.at("x").clone()}};
    };
  }
  void wait_entered(int n) {
    std::unique_lock<std::mutex> l(mu);
    ASSERT_TRUE(cv.wait_for(l, std::chrono::seconds(10), [&] { return entered >= n; }));
  }
  void release() {
    std::lock_guard<std::mutex> l(mu);
    open = true;
    cv.notify_all();
  }
};

TEST(BatchScheduler, AFullQueueAnswersResourceExhaustedAndADeadlineIsHonoured) {
  Gate g;
  BatchingOptions o;
  o.max_batch_size = 2;
  o.batch_timeout_micros = 0;
  o.num_batch_threads = 1;
  o.max_enqueued_batches = 1;
  BatchScheduler s(o, g.fn());
  auto x = at::ones({2, 1});
  auto running = std::async(std::launch::async, [&] { return s.run("sig", {{"x", x}}); });
  g.wait_entered(1);  // the only batch thread is busy now
  // One batch may wait; its caller gives up after its deadline.
  auto waiting = std::async(std::launch::async, [&] {
    try {
      s.run("sig", {{"x", x}}, Clock::now() + std::chrono::milliseconds(300));
      return Code::kOk;
    } catch (const ServingError& e) {
      return e.code();
    }
  });
  // Wait (with a deadline) until that request is queued.
  auto until = Clock::now() + std::chrono::seconds(10);
  while (s.enqueued_batches() < 1 && Clock::now() < until) std::this_thread::yield();
  ASSERT_EQ(s.enqueued_batches(), 1);
  try {
    s.run("sig", {{"x", x}});
    ADD_FAILURE() << "expected RESOURCE_EXHAUSTED";
  } catch (const ServingError& e) {
    EXPECT_EQ(e.code(), Code::kResourceExhausted);
    EXPECT_EQ(http_status(e.code()), 429);
  }
  EXPECT_EQ(waiting.get(), Code::kDeadlineExceeded);
  g.release();
  EXPECT_TRUE(at::equal(running.get().at("y"), x));
  // A deadline already past is refused before queueing.
  try {
    s.run("sig", {{"x", x}}, Clock::now() - std::chrono::milliseconds(1));
    ADD_FAILURE();
  } catch (const ServingError& e) {
    EXPECT_EQ(e.code(), Code::kDeadlineExceeded);
  }
}

TEST(BatchScheduler, RejectsInputsThatDisagreeOnTheBatchSize) {
  Recorder r;
  BatchScheduler s(BatchingOptions{}, r.fn());
  try {
    s.run("sig", {{"x", at::ones({2, 1})}, {"z", at::ones({3, 1})}});
    ADD_FAILURE();
  } catch (const ServingError& e) {
    EXPECT_EQ(e.code(), Code::kInvalidArgument);
  }
}

}  // namespace
}  // namespace kiln::serving
