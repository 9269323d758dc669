// The chief's side of parameter-server training (TF's ClusterCoordinator):
// it hands steps to the workers, collects what they report, and gives the
// steps of a worker that died to the others.
//
//   StepScheduler: the bookkeeping alone (no threads, no network; every call
//                  takes the time, so tests drive it with a made-up clock);
//   Coordinator:   a gRPC CoordinatorService
//                  (proto/kiln/ps/parameter_server.proto) around a
//                  StepScheduler, serving on the chief's TF_CONFIG address;
//                  the chief's training loop reads its events.
//
// Asynchronous runs: `steps` steps, each handed to whichever worker asks
// first; a step is done when its worker reports it.
//
// Synchronous runs (the seeds' backup workers): each global step is offered
// to every worker (num_workers items); it is done once
// `replicas_to_aggregate` (N) of them are reported, and the next one opens.
// The ps tasks drop the late gradients of the other k = num_workers - N
// (stragglers). Because N pushes of the step have returned from every ps
// task, each task has taken N of them or dropped one after applying the
// step (so a report counts whether its push was taken or dropped; the ps
// tasks may disagree on which N they took): the next step's pulls see the
// update.
//
// Workers: a worker is known by name ("worker:2") and incarnation (random
// per process). A worker silent for `worker_timeout_seconds` (no GetWork,
// ReportStep or Heartbeat) is lost, and so is an old incarnation once a new
// one of the same name calls in (a restarted worker rejoins at once): the
// steps it held and had not reported go back to the queue ("rescheduled").
// A step reported by a worker taken for lost still counts if nobody else
// finished it first; a report for a step already done is ignored.
//
// A failed step (the worker could not pull or push: a ps task is down) goes
// back to the queue. pause() (the chief restores a checkpoint) forgets every
// step of the run and answers WAIT until the next start().
//
// Thread safety: StepScheduler is not thread-safe; Coordinator locks around
// it and may be called from any thread.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace grpc {
class Server;
}  // namespace grpc

namespace kiln::ps {

using SteadyTime = std::chrono::steady_clock::time_point;

struct SchedulerOptions {
  int num_workers = 1;
  bool sync = false;
  int replicas_to_aggregate = 1;  // sync: N, 1 .. num_workers
  double worker_timeout_seconds = 10;
  void validate() const;  // ValueError naming the field
};

struct Work {
  enum class Kind { kWait, kStep, kDone };
  Kind kind = Kind::kWait;
  int64_t step_id = 0;
  int64_t sync_step = 0;  // sync: the global step the gradients belong to
  bool sync = false;
  int replicas_to_aggregate = 1;
};

struct SchedulerStats {
  int64_t steps_done = 0;       // steps (sync: global steps) completed, all runs
  int64_t rescheduled = 0;      // steps taken back from lost workers
  int64_t failed = 0;           // steps reported as failed (and scheduled again)
  int64_t workers_lost = 0;     // timeouts and restarts
  int64_t worker_restarts = 0;  // of those, a new incarnation calling in
  int64_t dropped = 0;          // sync: straggler reports
  int64_t max_staleness = 0;
};

class StepScheduler {
 public:
  explicit StepScheduler(SchedulerOptions options);

  // A run of `steps` steps (async) or global steps (sync, numbered from
  // `first_sync_step`). Ends any run before it.
  void start(int64_t steps, int64_t first_sync_step = 0);
  // Forget the run's steps: WAIT until the next start().
  void pause();
  // Training is over: DONE to everyone from now on.
  void finish();

  Work next_work(const std::string& worker, uint64_t incarnation, SteadyTime now);
  // Whether this report completed a step (async) or a global step (sync).
  struct Outcome {
    bool counted = false;    // its metrics belong in the epoch's (not a duplicate, not a straggler's)
    bool completed = false;  // a step (sync: a global step) is done now
  };
  Outcome report(const std::string& worker, uint64_t incarnation, int64_t step_id, bool ok, bool dropped,
                 int64_t max_staleness, SteadyTime now);
  void heartbeat(const std::string& worker, uint64_t incarnation, SteadyTime now);
  // Workers silent for longer than the timeout: lost now (their steps go
  // back). Returns a line for each.
  std::vector<std::string> expire(SteadyTime now);
  // Lines about workers lost or restarted since the last call.
  std::vector<std::string> take_messages();

  bool run_done() const { return run_completed_ >= run_steps_; }
  int64_t run_completed() const { return run_completed_; }
  int64_t sync_step() const { return sync_step_; }
  bool finished() const { return finished_; }
  // Whether every worker of the job has been told DONE or is lost (one that
  // never called in is neither).
  bool all_workers_done() const;
  // When any worker last called in (heartbeats included); nullopt: none yet.
  std::optional<SteadyTime> last_contact() const { return last_contact_; }
  int workers_seen() const { return static_cast<int>(workers_.size()); }
  const SchedulerStats& stats() const { return stats_; }
  const SchedulerOptions& options() const { return options_; }

 private:
  struct Item {
    int64_t sync_step = 0;
    std::string holder;  // empty: pending
    uint64_t holder_incarnation = 0;
    bool done = false;
  };
  struct WorkerInfo {
    uint64_t incarnation = 0;
    SteadyTime last_seen;
    bool lost = false;
    bool told_done = false;
  };
  void seen(const std::string& worker, uint64_t incarnation, SteadyTime now);
  void reclaim(const std::string& worker, uint64_t incarnation);
  void open_sync_step();

  SchedulerOptions options_;
  std::map<int64_t, Item> items_;  // the run's steps not yet forgotten, by id
  int64_t next_id_ = 1;
  int64_t run_steps_ = 0, run_completed_ = 0;
  int64_t sync_step_ = 0;
  std::map<int64_t, int> sync_done_;  // sync: reports per global step
  bool paused_ = true, finished_ = false;
  std::map<std::string, WorkerInfo> workers_;
  std::vector<std::string> messages_;
  SchedulerStats stats_;
  std::optional<SteadyTime> last_contact_;
};

// A step a worker finished, for the chief's loop.
struct StepEvent {
  bool completed = false;                          // a (global) step is done: the callbacks' batch end
  std::map<std::string, at::Tensor> metric_state;  // to add into the chief's metrics (empty if not counted)
};

class CoordinatorServiceImpl;

class Coordinator {
 public:
  // Serves at `address` ("0.0.0.0:<port>", port 0 picks one). IOError when
  // it cannot listen.
  Coordinator(const std::string& address, SchedulerOptions options);
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  int port() const { return port_; }

  // The scheduler's start/pause/finish, under the lock; they wake waiting
  // GetWork calls.
  void start(int64_t steps, int64_t first_sync_step);
  void pause();
  void finish();

  // Waits up to `timeout` for events (none: empty); runs expire() first and
  // prints the scheduler's messages on the chief's stdout.
  std::vector<StepEvent> wait_events(std::chrono::milliseconds timeout);
  bool run_done() const;
  int64_t run_completed() const;
  int64_t sync_step() const;
  SchedulerStats stats() const;
  // Seconds since any worker called in (since construction when none has).
  double seconds_without_workers() const;
  // Waits up to `timeout` until every worker of the job has called in;
  // returns how many have.
  int wait_workers_joined(std::chrono::milliseconds timeout);
  // Waits up to `timeout` until every worker has been told DONE (or is lost).
  void wait_workers_done(std::chrono::milliseconds timeout);

 private:
  friend class CoordinatorServiceImpl;
  mutable std::mutex mu_;
  std::condition_variable changed_;  // work may be available / events queued
  StepScheduler scheduler_;
  std::deque<StepEvent> events_;
  std::unique_ptr<CoordinatorServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  SteadyTime created_ = std::chrono::steady_clock::now();
};

}  // namespace kiln::ps
