// A BatchClock for tests (TF Serving's FakeClockEnv): time moves only when
// the test calls advance(), so timeouts and deadlines are tested without
// real sleeps and without races.
//
//   FakeBatchClock clock;
//   SharedBatchScheduler s(opts, &clock);     // batch_timeout_micros = 1000
//   s.schedule(q, "sig", inputs, std::nullopt, done);
//   clock.advance(std::chrono::microseconds(999));
//   ASSERT_TRUE(clock.wait_for_sleepers(1));  // the batch thread saw t+999 us and sleeps again
//   // ... nothing ran yet ...
//   clock.advance(std::chrono::microseconds(1));  // now the batch closes
//
// wait_for_sleepers(n) returns once n threads sleep in wait_until() having
// entered it after the last advance(): a thread that sleeps again after
// an advance() has seen the new time (its wait would have returned at once
// otherwise) and everything that happened before the advance().
// Thread-safe. The clock must outlive the schedulers that use it.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "kiln/serving/batching/batching.h"

namespace kiln::serving {

class FakeBatchClock final : public BatchClock {
 public:
  explicit FakeBatchClock(Clock::time_point start = Clock::time_point(std::chrono::hours(1))) : now_(start) {}

  Clock::time_point now() const override {
    std::lock_guard<std::mutex> l(mu_);
    return now_;
  }

  void wait_until(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, Clock::time_point until) override {
    Sleeper s{lock.mutex(), &cv};
    {
      std::lock_guard<std::mutex> l(mu_);
      if (now_ >= until) return;
      s.generation = generation_;
      sleepers_.push_back(&s);
      changed_.notify_all();
    }
    cv.wait(lock);  // registered under `lock`: an advance() after this cannot be missed
    // Unregister without holding `lock` (advance() takes it to notify), and
    // only once no advance() is still notifying this sleeper.
    lock.unlock();
    {
      std::unique_lock<std::mutex> l(mu_);
      changed_.wait(l, [&] { return s.pins == 0; });
      sleepers_.erase(std::find(sleepers_.begin(), sleepers_.end(), &s));
    }
    lock.lock();
  }

  // Moves time forward and wakes every sleeper to look at the new time.
  void advance(Clock::duration d) {
    std::vector<Sleeper*> wake;
    {
      std::lock_guard<std::mutex> l(mu_);
      now_ += d;
      ++generation_;
      for (auto* s : sleepers_) {
        ++s->pins;
        wake.push_back(s);
      }
    }
    for (auto* s : wake) {
      { std::lock_guard<std::mutex> l(*s->mu); }  // the sleeper is inside cv.wait() or past it
      s->cv->notify_all();
      std::lock_guard<std::mutex> l(mu_);
      --s->pins;
      changed_.notify_all();
    }
  }

  // True once `n` threads sleep here that entered after the last advance();
  // false after `timeout_seconds` of real time (a test failure, not a wait).
  bool wait_for_sleepers(size_t n, double timeout_seconds = 30) {
    std::unique_lock<std::mutex> l(mu_);
    return changed_.wait_for(l, std::chrono::duration<double>(timeout_seconds), [&] {
      return (size_t)std::count_if(sleepers_.begin(), sleepers_.end(),
                                   [&](Sleeper* s) { return s->generation == generation_; }) >= n;
    });
  }

 private:
  struct Sleeper {
    std::mutex* mu;
    std::condition_variable* cv;
    int64_t generation = 0;
    int pins = 0;  // guarded by FakeBatchClock::mu_; advance() calls notifying it
  };
  mutable std::mutex mu_;
  std::condition_variable changed_;
  Clock::time_point now_;           // guarded by mu_
  int64_t generation_ = 0;          // guarded by mu_; advance() calls so far
  std::vector<Sleeper*> sleepers_;  // guarded by mu_
};

}  // namespace kiln::serving
