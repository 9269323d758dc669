#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <future>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include "kiln/serving/batching/batching.h"
#include "kiln/serving/batching/fake_clock.h"
#include "kiln/serving/status.h"

// Every scheduler here runs on a FakeBatchClock: batch timeouts and
// deadlines pass only when a test advances the clock, never in real time.

namespace kiln::serving {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;

// Multiplies its input by `factor` and records the batch sizes it saw and the
// threads it ran on.
struct Recorder {
  explicit Recorder(float f = 2) : factor(f) {}
  float factor;
  std::mutex mu;
  std::vector<int64_t> sizes;         // guarded by mu
  std::set<std::thread::id> threads;  // guarded by mu
  BatchScheduler::BatchFn fn() {
    return [this](const std::string&, const TensorMap& in) {
      std::lock_guard<std::mutex> l(mu);
      sizes.push_back(in.at("x").size(0));
      threads.insert(std::this_thread::get_id());
      return TensorMap{{"y", in.at("x") * factor}};
    };
  }
  std::vector<int64_t> seen() {
    std::lock_guard<std::mutex> l(mu);
    return sizes;
  }
};

// One request's answer through a DoneFn: how often and on which thread it
// ran, and what it got.
struct Answer {
  std::mutex mu;
  std::condition_variable cv;
  int calls = 0;  // guarded by mu (and the rest)
  std::thread::id thread;
  std::exception_ptr error;
  TensorMap outputs;
  BatchTiming timing;
  SharedBatchScheduler::DoneFn fn() {
    return [this](std::exception_ptr e, TensorMap out, const BatchTiming& t) {
      std::lock_guard<std::mutex> l(mu);
      ++calls;
      thread = std::this_thread::get_id();
      error = e;
      outputs = std::move(out);
      timing = t;
      cv.notify_all();
    };
  }
  // Waits (a guard against a hang, not a timing) for the answer.
  bool wait() {
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, std::chrono::seconds(30), [&] { return calls > 0; });
  }
  int count() {
    std::lock_guard<std::mutex> l(mu);
    return calls;
  }
  Code code() {
    std::lock_guard<std::mutex> l(mu);
    if (!error) return Code::kOk;
    try {
      std::rethrow_exception(error);
    } catch (const ServingError& e) {
      return e.code();
    } catch (...) {
      return Code::kUnknown;
    }
  }
};

// Blocks every batch until released, to hold the batch threads busy.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;                // guarded by mu
  int entered = 0;                  // guarded by mu
  std::vector<std::string> order;   // guarded by mu: the tag of each batch, in the order they ran
  std::atomic<bool> exited{false};  // a batch returned
  BatchScheduler::BatchFn fn(std::string tag = "") {
    return [this, tag](const std::string&, const TensorMap& in) {
      {
        std::unique_lock<std::mutex> l(mu);
        ++entered;
        order.push_back(tag);
        cv.notify_all();
        cv.wait(l, [&] { return open; });
      }
      exited = true;
      return TensorMap{{"y", in.at("x").clone()}};
    };
  }
  void wait_entered(int n) {
    std::unique_lock<std::mutex> l(mu);
    ASSERT_TRUE(cv.wait_for(l, std::chrono::seconds(30), [&] { return entered >= n; }));
  }
  void release() {
    std::lock_guard<std::mutex> l(mu);
    open = true;
    cv.notify_all();
  }
};

BatchingOptions batching_options(int64_t max_batch_size, int64_t timeout_micros, int64_t threads = 1) {
  BatchingOptions o;
  o.max_batch_size = max_batch_size;
  o.batch_timeout_micros = timeout_micros;
  o.num_batch_threads = threads;
  return o;
}

TEST(BatchScheduler, SplitsARequestLargerThanMaxBatchSize) {
  FakeBatchClock clock;
  Recorder r;
  BatchScheduler s(batching_options(4, 0), r.fn(), &clock);
  auto x = at::arange(10 * 3, at::kFloat).reshape({10, 3});
  BatchTiming t;
  auto out = s.run("serving_default", {{"x", x}}, std::nullopt, &t);
  EXPECT_TRUE(at::equal(out.at("y"), x * 2));
  int64_t total = 0;
  for (auto n : r.seen()) {
    EXPECT_LE(n, 4);
    total += n;
  }
  EXPECT_EQ(total, 10);
  EXPECT_GE(t.batch_size, 2);
  EXPECT_LE(t.batch_size, 4);
}

TEST(BatchScheduler, PadsToAllowedBatchSizesAndDropsThePadding) {
  FakeBatchClock clock;
  Recorder r;
  BatchingOptions o = batching_options(8, 0);
  o.allowed_batch_sizes = {2, 8};
  BatchScheduler s(o, r.fn(), &clock);
  auto x = at::randn({3, 2});
  BatchTiming t;
  auto out = s.run("serving_default", {{"x", x}}, std::nullopt, &t);
  EXPECT_EQ(out.at("y").size(0), 3);
  EXPECT_TRUE(at::allclose(out.at("y"), x * 2));
  EXPECT_EQ(r.seen(), std::vector<int64_t>{8});
  EXPECT_EQ(t.batch_size, 8);
}

TEST(BatchScheduler, ConcurrentRequestsShareABatchAndGetTheirOwnRows) {
  FakeBatchClock clock;  // never advanced: the batch can only close by size
  Recorder r;
  BatchScheduler s(batching_options(64, 10000000), r.fn(), &clock);
  std::vector<std::future<bool>> fs;
  for (int i = 0; i < 8; ++i)
    fs.push_back(std::async(std::launch::async, [&s, i] {
      auto x = at::full({8, 2}, (float)i);
      auto out = s.run("serving_default", {{"x", x}});
      return at::equal(out.at("y"), x * 2);
    }));
  for (auto& f : fs) EXPECT_TRUE(f.get());
  EXPECT_EQ(r.seen(), std::vector<int64_t>{64});  // one full batch of 8 x 8 rows
}

TEST(BatchScheduler, AFullQueueAnswersResourceExhaustedAndADeadlineIsHonoured) {
  FakeBatchClock clock;
  Gate g;
  BatchingOptions o = batching_options(2, 0);
  o.max_enqueued_batches = 1;
  BatchScheduler s(o, g.fn(), &clock);
  auto x = at::ones({2, 1});
  auto running = std::async(std::launch::async, [&] { return s.run("sig", {{"x", x}}); });
  g.wait_entered(1);  // the only batch thread is busy now
  // One batch may wait; its caller gives up at its deadline (300 ms of fake time).
  auto waiting = std::async(std::launch::async, [&] {
    try {
      s.run("sig", {{"x", x}}, clock.now() + milliseconds(300));
      return Code::kOk;
    } catch (const ServingError& e) {
      return e.code();
    }
  });
  // Wait (with a deadline) until that request is queued and its caller sleeps.
  auto until = Clock::now() + std::chrono::seconds(30);
  while (s.enqueued_batches() < 1 && Clock::now() < until) std::this_thread::yield();
  ASSERT_EQ(s.enqueued_batches(), 1);
  ASSERT_TRUE(clock.wait_for_sleepers(1));
  try {
    s.run("sig", {{"x", x}});
    ADD_FAILURE() << "expected RESOURCE_EXHAUSTED";
  } catch (const ServingError& e) {
    EXPECT_EQ(e.code(), Code::kResourceExhausted);
    EXPECT_EQ(http_status(e.code()), 429);
  }
  clock.advance(milliseconds(299));
  ASSERT_TRUE(clock.wait_for_sleepers(1));  // still waiting at 299 ms
  EXPECT_EQ(waiting.wait_for(std::chrono::seconds(0)), std::future_status::timeout);
  clock.advance(milliseconds(1));
  EXPECT_EQ(waiting.get(), Code::kDeadlineExceeded);
  g.release();
  EXPECT_TRUE(at::equal(running.get().at("y"), x));
  // The expired request's batch forms now; it is dropped, not computed.
  ASSERT_TRUE(clock.wait_for_sleepers(1));
  EXPECT_EQ(s.enqueued_batches(), 0);
  {
    std::lock_guard<std::mutex> l(g.mu);
    EXPECT_EQ(g.entered, 1);
  }
  // A deadline already past is refused before queueing.
  try {
    s.run("sig", {{"x", x}}, clock.now() - milliseconds(1));
    ADD_FAILURE();
  } catch (const ServingError& e) {
    EXPECT_EQ(e.code(), Code::kDeadlineExceeded);
  }
}

TEST(BatchScheduler, RejectsInputsThatDisagreeOnTheBatchSize) {
  FakeBatchClock clock;
  Recorder r;
  BatchScheduler s(BatchingOptions{}, r.fn(), &clock);
  TensorMap bad{{"x", at::ones({2, 1})}, {"z", at::ones({3, 1})}};
  try {
    s.run("sig", bad);
    ADD_FAILURE();
  } catch (const ServingError& e) {
    EXPECT_EQ(e.code(), Code::kInvalidArgument);
  }
  // Asynchronously: answered once, at once, on the calling thread.
  Answer a;
  s.schedule("sig", bad, std::nullopt, a.fn());
  EXPECT_EQ(a.count(), 1);
  EXPECT_EQ(a.thread, std::this_thread::get_id());
  EXPECT_EQ(a.code(), Code::kInvalidArgument);
  EXPECT_TRUE(r.seen().empty());
}

TEST(SharedBatchScheduler, ATimeoutClosesAPartialBatchWhenTheClockPassesItAndNotBefore) {
  FakeBatchClock clock;
  Recorder r;
  SharedBatchScheduler s(batching_options(8, 1000), &clock);
  auto q = s.add_queue(r.fn());
  Answer first, second;
  auto t0 = clock.now();
  s.schedule(q, "sig", {{"x", at::ones({1, 2})}}, std::nullopt, first.fn());
  clock.advance(microseconds(500));
  s.schedule(q, "sig", {{"x", at::full({2, 2}, 3.0f)}}, std::nullopt, second.fn());
  clock.advance(microseconds(499));
  // The batch thread looked at the queue at t0 + 999 us and sleeps again:
  // the oldest request has not waited 1000 us, so nothing ran.
  ASSERT_TRUE(clock.wait_for_sleepers(1));
  EXPECT_TRUE(r.seen().empty());
  EXPECT_EQ(first.count(), 0);
  EXPECT_EQ(s.enqueued_batches(q), 1);
  clock.advance(microseconds(1));  // t0 + 1000 us: the partial batch (3 of 8 rows) closes
  ASSERT_TRUE(first.wait());
  ASSERT_TRUE(second.wait());
  EXPECT_EQ(clock.now() - t0, microseconds(1000));
  EXPECT_EQ(r.seen(), std::vector<int64_t>{3});  // both requests, one batch
  EXPECT_EQ(first.code(), Code::kOk);
  EXPECT_TRUE(at::equal(first.outputs.at("y"), at::full({1, 2}, 2.0f)));
  EXPECT_TRUE(at::equal(second.outputs.at("y"), at::full({2, 2}, 6.0f)));
  EXPECT_EQ(first.timing.queue_us, 1000);  // fake time: exact
  EXPECT_EQ(second.timing.queue_us, 500);
  EXPECT_EQ(first.timing.compute_us, 0);
  EXPECT_EQ(first.timing.batch_size, 3);
  EXPECT_EQ(s.enqueued_batches(q), 0);
}

TEST(SharedBatchScheduler, ADeadlinePassingInTheQueueAnswersDeadlineExceededWithoutComputing) {
  FakeBatchClock clock;
  Recorder r;
  SharedBatchScheduler s(batching_options(8, 1000), &clock);
  auto q = s.add_queue(r.fn());
  Answer late, fine;
  s.schedule(q, "sig", {{"x", at::ones({1, 2})}}, clock.now() + microseconds(500), late.fn());
  s.schedule(q, "sig", {{"x", at::ones({1, 2})}}, clock.now() + microseconds(5000), fine.fn());
  clock.advance(microseconds(1000));
  ASSERT_TRUE(late.wait());
  ASSERT_TRUE(fine.wait());
  EXPECT_EQ(late.code(), Code::kDeadlineExceeded);
  EXPECT_TRUE(late.outputs.empty());
  EXPECT_EQ(fine.code(), Code::kOk);
  EXPECT_EQ(r.seen(), std::vector<int64_t>{1});  // only the live request was computed
  EXPECT_NE(late.thread, std::this_thread::get_id());
}

TEST(SharedBatchScheduler, QueuesOfTwoVersionsShareTheThreadsAndBothAreServed) {
  FakeBatchClock clock;
  Recorder v1(2), v2(3);
  SharedBatchScheduler s(batching_options(4, 0, /*threads=*/1), &clock);
  auto q1 = s.add_queue(v1.fn());
  BatchingOptions small = batching_options(2, 0);  // a queue's own options
  auto q2 = s.add_queue(small, v2.fn());
  std::vector<std::unique_ptr<Answer>> a1, a2;
  for (int i = 0; i < 5; ++i) {
    a1.push_back(std::make_unique<Answer>());
    a2.push_back(std::make_unique<Answer>());
    s.schedule(q1, "sig", {{"x", at::full({3, 2}, (float)i)}}, std::nullopt, a1.back()->fn());
    s.schedule(q2, "sig", {{"x", at::full({3, 2}, (float)i)}}, std::nullopt, a2.back()->fn());
  }
  std::set<std::thread::id> answered_on;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(a1[i]->wait());
    ASSERT_TRUE(a2[i]->wait());
    ASSERT_EQ(a1[i]->code(), Code::kOk);
    ASSERT_EQ(a2[i]->code(), Code::kOk);
    EXPECT_TRUE(at::equal(a1[i]->outputs.at("y"), at::full({3, 2}, 2.0f * i)));
    EXPECT_TRUE(at::equal(a2[i]->outputs.at("y"), at::full({3, 2}, 3.0f * i)));
    answered_on.insert(a1[i]->thread);
    answered_on.insert(a2[i]->thread);
  }
  // One batch thread served both queues (and ran every callback).
  ASSERT_EQ(v1.threads.size(), 1u);
  EXPECT_EQ(v1.threads, v2.threads);
  EXPECT_EQ(answered_on, v1.threads);
  EXPECT_NE(*v1.threads.begin(), std::this_thread::get_id());
  for (auto n : v2.seen()) EXPECT_LE(n, 2);  // q2's max_batch_size, not the scheduler's 4
  for (auto n : v1.seen()) EXPECT_EQ(n, 3);  // 3 rows: one request per batch of at most 4
}

TEST(SharedBatchScheduler, RoundRobinKeepsABusyQueueFromStarvingAnother) {
  FakeBatchClock clock;
  Gate g;
  BatchingOptions o = batching_options(2, 0);
  o.max_enqueued_batches = 100;
  SharedBatchScheduler s(o, &clock);
  auto busy = s.add_queue(g.fn("busy"));
  auto quiet = s.add_queue(g.fn("quiet"));
  std::vector<std::unique_ptr<Answer>> answers;
  auto send = [&](const BatchQueuePtr& q) {
    answers.push_back(std::make_unique<Answer>());
    s.schedule(q, "sig", {{"x", at::ones({2, 1})}}, std::nullopt, answers.back()->fn());
  };
  send(busy);
  g.wait_entered(1);                       // the one thread runs busy's first batch
  for (int i = 0; i < 4; ++i) send(busy);  // four more full batches wait, older than...
  send(quiet);                             // ...quiet's one
  g.release();
  for (auto& a : answers) {
    ASSERT_TRUE(a->wait());
    EXPECT_EQ(a->code(), Code::kOk);
  }
  std::lock_guard<std::mutex> l(g.mu);
  ASSERT_EQ(g.order.size(), 6u);
  auto pos = std::find(g.order.begin(), g.order.end(), "quiet") - g.order.begin();
  // Round-robin: quiet waits behind at most one more busy batch (oldest-first
  // would serve it last, at 5).
  EXPECT_LE(pos, 2);
}

TEST(SharedBatchScheduler, DoneRunsExactlyOnceOnABatchThreadOrInlineForImmediateErrors) {
  FakeBatchClock clock;
  Recorder r;
  BatchingOptions o = batching_options(4, 0);
  o.max_enqueued_batches = 1;
  SharedBatchScheduler s(o, &clock);
  auto ok = s.add_queue(r.fn());
  auto throws = s.add_queue(
      [](const std::string&, const TensorMap&) -> TensorMap { throw std::runtime_error("the model failed"); });
  Answer computed, failed;
  s.schedule(ok, "sig", {{"x", at::ones({2, 1})}}, std::nullopt, computed.fn());
  s.schedule(throws, "sig", {{"x", at::ones({2, 1})}}, std::nullopt, failed.fn());
  ASSERT_TRUE(computed.wait());
  ASSERT_TRUE(failed.wait());
  EXPECT_EQ(computed.code(), Code::kOk);
  EXPECT_NE(computed.thread, std::this_thread::get_id());
  EXPECT_EQ(failed.code(), Code::kUnknown);  // the model's own exception, passed through
  EXPECT_NE(failed.thread, std::this_thread::get_id());
  try {
    std::rethrow_exception(failed.error);
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "the model failed");
  }
  // Errors found at once are answered before schedule() returns, on the caller.
  struct Case {
    TensorMap inputs;
    Deadline deadline;
    Code code;
  };
  std::vector<Case> cases{{{}, std::nullopt, Code::kInvalidArgument},
                          {{{"x", at::ones({})}}, std::nullopt, Code::kInvalidArgument},
                          {{{"x", at::ones({0, 1})}}, std::nullopt, Code::kInvalidArgument},
                          {{{"x", at::ones({1, 1})}}, clock.now(), Code::kDeadlineExceeded},
                          {{{"x", at::ones({9, 1})}}, std::nullopt, Code::kResourceExhausted}};  // 3 batches > 1
  for (auto& c : cases) {
    Answer a;
    s.schedule(ok, "sig", c.inputs, c.deadline, a.fn());
    EXPECT_EQ(a.count(), 1);
    EXPECT_EQ(a.thread, std::this_thread::get_id());
    EXPECT_EQ(a.code(), c.code);
  }
  s.remove_queue(throws);
  Answer removed;
  s.schedule(throws, "sig", {{"x", at::ones({1, 1})}}, std::nullopt, removed.fn());
  EXPECT_EQ(removed.count(), 1);
  EXPECT_EQ(removed.code(), Code::kUnavailable);
  ASSERT_TRUE(clock.wait_for_sleepers(1));  // everything settled: no second call anywhere
  EXPECT_EQ(computed.count(), 1);
  EXPECT_EQ(failed.count(), 1);
}

TEST(SharedBatchScheduler, RemovingAQueueAnswersItsWaitingRequestsUnavailableAndWaitsForItsRunningBatch) {
  FakeBatchClock clock;
  Gate g;
  Recorder r;
  SharedBatchScheduler s(batching_options(4, 0), &clock);
  auto running = s.add_queue(g.fn());
  auto waiting = s.add_queue(r.fn());
  Answer first, queued;
  s.schedule(running, "sig", {{"x", at::ones({1, 1})}}, std::nullopt, first.fn());
  g.wait_entered(1);  // the only thread is busy: the next request waits
  s.schedule(waiting, "sig", {{"x", at::ones({1, 1})}}, std::nullopt, queued.fn());
  EXPECT_EQ(s.enqueued_batches(waiting), 1);
  s.remove_queue(waiting);  // nothing of it runs: returns at once
  EXPECT_EQ(queued.count(), 1);
  EXPECT_EQ(queued.code(), Code::kUnavailable);
  EXPECT_EQ(queued.thread, std::this_thread::get_id());
  EXPECT_EQ(s.enqueued_batches(waiting), 0);
  s.remove_queue(waiting);  // idempotent
  // Removing the queue whose batch runs returns only after that batch.
  auto removing = std::async(std::launch::async, [&] {
    s.remove_queue(running);
    return g.exited.load();
  });
  g.release();
  EXPECT_TRUE(removing.get());
  ASSERT_TRUE(first.wait());
  EXPECT_EQ(first.code(), Code::kOk);
  EXPECT_TRUE(r.seen().empty());  // the removed queue's function never ran
}

TEST(SharedBatchScheduler, TheDestructorAnswersWaitingRequestsUnavailable) {
  FakeBatchClock clock;  // not advanced: the request waits for its timeout forever
  Recorder r;
  Answer a;
  {
    SharedBatchScheduler s(batching_options(8, 1000), &clock);
    auto q = s.add_queue(r.fn());
    s.schedule(q, "sig", {{"x", at::ones({1, 1})}}, std::nullopt, a.fn());
    ASSERT_TRUE(clock.wait_for_sleepers(1));
  }
  EXPECT_EQ(a.count(), 1);
  EXPECT_EQ(a.code(), Code::kUnavailable);
  EXPECT_TRUE(r.seen().empty());
}

}  // namespace
}  // namespace kiln::serving
