// The chief's step bookkeeping (StepScheduler), driven with a made-up clock:
// who gets which step, what happens to the steps of a worker that dies or
// restarts, and when a synchronous step is done.
#include "kiln/ps/coordinator.h"

#include <gtest/gtest.h>

#include <set>

#include "kiln/core/error.h"
#include "kiln/testing/expect_error.h"

namespace kiln {
namespace {

using ps::StepScheduler;
using ps::Work;

const ps::SteadyTime t0{};
ps::SteadyTime at(double seconds) {
  return t0 + std::chrono::duration_cast<ps::SteadyTime::duration>(std::chrono::duration<double>(seconds));
}

TEST(StepScheduler, AsyncStepsGoToWhoeverAsksAndEachIsDoneOnce) {
  StepScheduler s({.num_workers = 2, .worker_timeout_seconds = 5});
  EXPECT_EQ(s.next_work("worker:0", 1, at(0)).kind, Work::Kind::kWait);  // paused until a run starts
  s.start(3);
  std::set<int64_t> ids;
  Work a = s.next_work("worker:0", 1, at(0)), b = s.next_work("worker:1", 2, at(0));
  Work c = s.next_work("worker:0", 1, at(0));
  for (const Work& w : {a, b, c}) {
    EXPECT_EQ(w.kind, Work::Kind::kStep);
    ids.insert(w.step_id);
  }
  EXPECT_EQ(ids.size(), 3u);
  EXPECT_EQ(s.next_work("worker:1", 2, at(0)).kind, Work::Kind::kWait);  // all handed out
  EXPECT_TRUE(s.report("worker:0", 1, a.step_id, true, false, 2, at(1)).completed);
  EXPECT_FALSE(s.report("worker:0", 1, a.step_id, true, false, 0, at(1)).counted);  // a duplicate
  EXPECT_TRUE(s.report("worker:1", 2, b.step_id, true, false, 0, at(1)).completed);
  EXPECT_FALSE(s.run_done());
  EXPECT_TRUE(s.report("worker:0", 1, c.step_id, true, false, 5, at(1)).completed);
  EXPECT_TRUE(s.run_done());
  EXPECT_EQ(s.stats().steps_done, 3);
  EXPECT_EQ(s.stats().max_staleness, 5);
  s.finish();
  EXPECT_EQ(s.next_work("worker:0", 1, at(2)).kind, Work::Kind::kDone);
  EXPECT_FALSE(s.all_workers_done());  // worker:1 has not been told
  EXPECT_EQ(s.next_work("worker:1", 2, at(2)).kind, Work::Kind::kDone);
  EXPECT_TRUE(s.all_workers_done());
}

TEST(StepScheduler, ASilentWorkersStepsAreRescheduledAfterTheTimeout) {
  StepScheduler s({.num_workers = 2, .worker_timeout_seconds = 5});
  s.start(4);
  Work a = s.next_work("worker:0", 1, at(0));
  Work b = s.next_work("worker:1", 2, at(0));
  s.heartbeat("worker:1", 2, at(4));
  EXPECT_TRUE(s.expire(at(5)).empty());  // 5 s is not longer than the timeout
  const auto lost = s.expire(at(5.5));   // worker:0 silent for 5.5 s, worker:1 for 1.5 s
  EXPECT_EQ(lost, (std::vector<std::string>{"worker:0"}));
  EXPECT_EQ(s.stats().rescheduled, 1);
  EXPECT_EQ(s.stats().workers_lost, 1);
  // worker:0's step goes to worker:1 (the lowest id first).
  Work again = s.next_work("worker:1", 2, at(6));
  EXPECT_EQ(again.step_id, a.step_id);
  // A late report of the lost worker still counts when it comes first ...
  EXPECT_TRUE(s.report("worker:0", 1, a.step_id, true, false, 0, at(7)).completed);
  // ... and then the second report of that step does not.
  EXPECT_FALSE(s.report("worker:1", 2, a.step_id, true, false, 0, at(7)).counted);
  EXPECT_TRUE(s.report("worker:1", 2, b.step_id, true, false, 0, at(7)).completed);
  const auto msgs = s.take_messages();
  ASSERT_GE(msgs.size(), 2u);
  EXPECT_EQ(msgs[0], "worker:0 silent for 5 s");
  EXPECT_EQ(msgs[1], "worker:0 lost; 1 of its steps rescheduled");
}

TEST(StepScheduler, ARestartedWorkerRejoinsAndItsOldStepsAreRescheduledAtOnce) {
  StepScheduler s({.num_workers = 2, .worker_timeout_seconds = 60});
  s.start(3);
  Work a = s.next_work("worker:1", 11, at(0));
  // The same worker, a new process: no timeout to wait for.
  Work b = s.next_work("worker:1", 12, at(1));
  EXPECT_EQ(b.step_id, a.step_id);  // its old step first
  EXPECT_EQ(s.stats().rescheduled, 1);
  EXPECT_EQ(s.stats().worker_restarts, 1);
  EXPECT_EQ(s.stats().workers_lost, 1);
  EXPECT_EQ(s.take_messages(),
            (std::vector<std::string>{"worker:1 lost; 1 of its steps rescheduled", "worker:1 restarted and rejoined"}));
}

TEST(StepScheduler, AFailedStepIsScheduledAgainAndPauseForgetsTheRun) {
  StepScheduler s({.num_workers = 1});
  s.start(2);
  Work a = s.next_work("worker:0", 1, at(0));
  EXPECT_FALSE(s.report("worker:0", 1, a.step_id, false, false, 0, at(0)).counted);  // a ps was down
  EXPECT_EQ(s.stats().failed, 1);
  Work again = s.next_work("worker:0", 1, at(0));
  EXPECT_EQ(again.step_id, a.step_id);
  s.pause();  // the chief restores a checkpoint
  EXPECT_EQ(s.next_work("worker:0", 1, at(0)).kind, Work::Kind::kWait);
  EXPECT_FALSE(s.report("worker:0", 1, again.step_id, true, false, 0, at(0)).counted);  // forgotten
  s.start(1);
  Work fresh = s.next_work("worker:0", 1, at(0));
  EXPECT_NE(fresh.step_id, a.step_id);  // ids are never reused
  EXPECT_TRUE(s.report("worker:0", 1, fresh.step_id, true, false, 0, at(0)).completed);
  EXPECT_TRUE(s.run_done());
}

TEST(StepScheduler, ASyncStepIsDoneAfterNReportsAndTheBackupWorkersAreStragglers) {
  StepScheduler s({.num_workers = 3, .sync = true, .replicas_to_aggregate = 2});
  s.start(2, /*first_sync_step=*/7);
  Work a = s.next_work("worker:0", 1, at(0)), b = s.next_work("worker:1", 2, at(0)),
       c = s.next_work("worker:2", 3, at(0));
  for (const Work& w : {a, b, c}) {
    EXPECT_EQ(w.kind, Work::Kind::kStep);
    EXPECT_EQ(w.sync_step, 7);
    EXPECT_TRUE(w.sync);
    EXPECT_EQ(w.replicas_to_aggregate, 2);
  }
  EXPECT_EQ(s.next_work("worker:0", 1, at(0)).kind, Work::Kind::kWait);  // one item per worker
  EXPECT_FALSE(s.report("worker:1", 2, b.step_id, true, false, 0, at(1)).completed);
  // A push dropped by some ps task counts toward N: that task had applied the step.
  auto second = s.report("worker:0", 1, a.step_id, true, /*dropped=*/true, 0, at(1));
  EXPECT_TRUE(second.completed);
  EXPECT_FALSE(second.counted);  // its metrics are not the step's
  EXPECT_EQ(s.sync_step(), 8);
  Work next = s.next_work("worker:0", 1, at(1));
  EXPECT_EQ(next.sync_step, 8);
  // The straggler of step 7 reports late: nothing completes.
  EXPECT_FALSE(s.report("worker:2", 3, c.step_id, true, true, 0, at(2)).completed);
  EXPECT_EQ(s.stats().dropped, 2);
  Work d = s.next_work("worker:2", 3, at(2));
  EXPECT_TRUE(s.report("worker:0", 1, next.step_id, true, false, 0, at(3)).counted);
  EXPECT_TRUE(s.report("worker:2", 3, d.step_id, true, false, 0, at(3)).completed);
  EXPECT_TRUE(s.run_done());
  EXPECT_EQ(s.sync_step(), 9);
}

TEST(StepScheduler, BadOptionsNameTheField) {
  expect_error<ValueError>([] { StepScheduler s({.num_workers = 0}); }, {"at least one worker"});
  expect_error<ValueError>([] { StepScheduler s({.num_workers = 2, .sync = true, .replicas_to_aggregate = 3}); },
                           {"replicas_to_aggregate=3", "backup_workers"});
  expect_error<ValueError>([] { StepScheduler s({.num_workers = 1, .worker_timeout_seconds = 0}); },
                           {"worker_timeout_seconds"});
}

}  // namespace
}  // namespace kiln
