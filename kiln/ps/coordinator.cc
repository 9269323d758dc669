#include "kiln/ps/coordinator.h"

#include <grpcpp/grpcpp.h>

#include <iostream>

#include "kiln/core/error.h"
#include "kiln/core/json_limits.h"
#include "kiln/ps/wire.h"

namespace kiln::ps {
namespace {

namespace pb = ::kiln::ps;

}  // namespace

// --- StepScheduler -----------------------------------------------------------------------------

void SchedulerOptions::validate() const {
  if (num_workers < 1)
    throw ValueError("parameter-server training needs at least one worker. Received: num_workers=" +
                     std::to_string(num_workers));
  if (sync && (replicas_to_aggregate < 1 || replicas_to_aggregate > num_workers))
    throw ValueError("synchronous training aggregates between 1 and num_workers (" + std::to_string(num_workers) +
                     ") gradients per step. Received: replicas_to_aggregate=" + std::to_string(replicas_to_aggregate) +
                     " (backup_workers must be < num_workers)");
  if (!(worker_timeout_seconds > 0))
    throw ValueError("`worker_timeout_seconds` must be positive. Received: " + std::to_string(worker_timeout_seconds));
}

StepScheduler::StepScheduler(SchedulerOptions options) : options_(std::move(options)) { options_.validate(); }

void StepScheduler::start(int64_t steps, int64_t first_sync_step) {
  items_.clear();
  sync_done_.clear();
  run_steps_ = steps;
  run_completed_ = 0;
  sync_step_ = first_sync_step;
  paused_ = false;
  if (steps <= 0) return;
  if (options_.sync) {
    open_sync_step();
  } else {
    for (int64_t i = 0; i < steps; ++i) items_[next_id_++] = Item{};
  }
}

void StepScheduler::open_sync_step() {
  for (int i = 0; i < options_.num_workers; ++i) items_[next_id_++] = Item{.sync_step = sync_step_};
}

void StepScheduler::pause() {
  items_.clear();
  sync_done_.clear();
  paused_ = true;
}

void StepScheduler::finish() {
  items_.clear();
  finished_ = true;
}

void StepScheduler::seen(const std::string& worker, uint64_t incarnation, SteadyTime now) {
  auto [it, fresh] = workers_.try_emplace(worker);
  WorkerInfo& w = it->second;
  if (!fresh && w.incarnation != incarnation) {
    if (!w.lost) {
      reclaim(worker, w.incarnation);
      ++stats_.workers_lost;
    }
    ++stats_.worker_restarts;
    messages_.push_back(worker + " restarted and rejoined");
    w.told_done = false;
  } else if (!fresh && w.lost) {
    messages_.push_back(worker + " is back");
  }
  w.incarnation = incarnation;
  w.last_seen = now;
  w.lost = false;
  last_contact_ = now;
}

void StepScheduler::reclaim(const std::string& worker, uint64_t incarnation) {
  int64_t n = 0;
  for (auto& [id, item] : items_)
    if (!item.done && item.holder == worker && item.holder_incarnation == incarnation &&
        (!options_.sync || item.sync_step == sync_step_)) {  // a straggler's old step needs nobody
      item.holder.clear();
      ++n;
    }
  stats_.rescheduled += n;
  messages_.push_back(worker + " lost; " + std::to_string(n) + " of its steps rescheduled");
}

Work StepScheduler::next_work(const std::string& worker, uint64_t incarnation, SteadyTime now) {
  seen(worker, incarnation, now);
  if (finished_) {
    workers_[worker].told_done = true;
    return {.kind = Work::Kind::kDone};
  }
  if (paused_) return {};
  for (auto& [id, item] : items_) {
    if (item.done || !item.holder.empty()) continue;
    if (options_.sync && item.sync_step != sync_step_) continue;
    item.holder = worker;
    item.holder_incarnation = incarnation;
    return {.kind = Work::Kind::kStep,
            .step_id = id,
            .sync_step = item.sync_step,
            .sync = options_.sync,
            .replicas_to_aggregate = options_.replicas_to_aggregate};
  }
  return {};
}

StepScheduler::Outcome StepScheduler::report(const std::string& worker, uint64_t incarnation, int64_t step_id, bool ok,
                                             bool dropped, int64_t max_staleness, SteadyTime now) {
  seen(worker, incarnation, now);
  Outcome out;
  if (!ok) ++stats_.failed;
  auto it = items_.find(step_id);
  if (it == items_.end() || it->second.done) return out;  // forgotten (paused) or finished by another worker
  Item& item = it->second;
  if (!ok) {
    item.holder.clear();  // again, to anyone
    return out;
  }
  item.done = true;
  if (dropped) {
    ++stats_.dropped;
  } else {
    stats_.max_staleness = std::max(stats_.max_staleness, max_staleness);
    out.counted = true;
  }
  if (!options_.sync) {
    ++run_completed_;
    ++stats_.steps_done;
    out.completed = true;
    items_.erase(it);
    return out;
  }
  if (item.sync_step != sync_step_) return out;  // a straggler's
  // A dropped push counts too: some ps task had applied the step already.
  // Once N pushes of the step have returned from every ps task, each task
  // has either taken N of them or dropped one after applying the step.
  if (++sync_done_[sync_step_] < options_.replicas_to_aggregate) return out;
  // The global step is done: the rest of its items are stragglers'.
  sync_done_.erase(sync_step_);
  for (auto i = items_.begin(); i != items_.end();)
    i = i->second.sync_step == sync_step_ && i->second.holder.empty() ? items_.erase(i) : std::next(i);
  ++sync_step_;
  ++run_completed_;
  ++stats_.steps_done;
  out.completed = true;
  if (run_completed_ < run_steps_) open_sync_step();
  return out;
}

void StepScheduler::heartbeat(const std::string& worker, uint64_t incarnation, SteadyTime now) {
  seen(worker, incarnation, now);
}

std::vector<std::string> StepScheduler::expire(SteadyTime now) {
  std::vector<std::string> lost;
  const auto timeout =
      std::chrono::duration_cast<SteadyTime::duration>(std::chrono::duration<double>(options_.worker_timeout_seconds));
  for (auto& [name, w] : workers_) {
    if (w.lost || w.told_done || now - w.last_seen <= timeout) continue;
    w.lost = true;
    ++stats_.workers_lost;
    messages_.push_back(name + " silent for " + seconds_text(options_.worker_timeout_seconds) + " s");
    reclaim(name, w.incarnation);
    lost.push_back(name);
  }
  return lost;
}

std::vector<std::string> StepScheduler::take_messages() { return std::exchange(messages_, {}); }

bool StepScheduler::all_workers_done() const {
  int n = 0;
  for (auto& [name, w] : workers_) n += w.lost || w.told_done;
  return n >= options_.num_workers;
}

// --- the service -------------------------------------------------------------------------------

class CoordinatorServiceImpl final : public pb::CoordinatorService::Service {
 public:
  explicit CoordinatorServiceImpl(Coordinator& c) : c_(c) {}

  grpc::Status GetWork(grpc::ServerContext* ctx, const pb::GetWorkRequest* q, pb::WorkResponse* r) override {
    next(ctx, q->worker(), q->incarnation(), r);
    return grpc::Status::OK;
  }

  grpc::Status ReportStep(grpc::ServerContext* ctx, const pb::ReportStepRequest* q, pb::WorkResponse* r) override {
    if (q->worker().empty()) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "ReportStep: no worker name");
    StepEvent e;
    try {
      for (const auto& n : q->metric_state())
        e.metric_state[n.name()] = wire::tensor_of(n.value(), "ReportStep: metric state " + text_excerpt(n.name()));
    } catch (const UserError& err) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, err.what());
    }
    {
      std::lock_guard<std::mutex> l(c_.mu_);
      auto out = c_.scheduler_.report(q->worker(), q->incarnation(), q->step_id(), q->ok(), q->dropped(),
                                      q->max_staleness(), std::chrono::steady_clock::now());
      if (!q->ok() && !q->error().empty())
        std::cout << "Parameter servers: " << q->worker()
                  << " failed a step (scheduled again): " << text_excerpt(q->error(), 300) << std::endl;
      if (out.counted || out.completed) {
        e.completed = out.completed;
        if (!out.counted) e.metric_state.clear();
        c_.events_.push_back(std::move(e));
      }
    }
    c_.changed_.notify_all();
    next(ctx, q->worker(), q->incarnation(), r);
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext*, const pb::HeartbeatRequest* q, pb::HeartbeatResponse*) override {
    std::lock_guard<std::mutex> l(c_.mu_);
    c_.scheduler_.heartbeat(q->worker(), q->incarnation(), std::chrono::steady_clock::now());
    return grpc::Status::OK;
  }

 private:
  // The worker's next step, waiting up to a second for one (long poll).
  void next(grpc::ServerContext* ctx, const std::string& worker, uint64_t incarnation, pb::WorkResponse* r) {
    std::unique_lock<std::mutex> l(c_.mu_);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    Work w;
    for (bool first = true;; first = false) {
      w = c_.scheduler_.next_work(worker, incarnation, std::chrono::steady_clock::now());
      if (w.kind != Work::Kind::kWait || ctx->IsCancelled()) break;
      if (first) c_.changed_.notify_all();  // the chief may be waiting for every worker to call in
      if (c_.changed_.wait_until(l, until) == std::cv_status::timeout) break;
    }
    r->set_kind(w.kind == Work::Kind::kStep   ? pb::WorkResponse::STEP
                : w.kind == Work::Kind::kDone ? pb::WorkResponse::DONE
                                              : pb::WorkResponse::WAIT);
    r->set_step_id(w.step_id);
    r->set_sync_step(w.sync_step);
    r->set_sync(w.sync);
    r->set_replicas_to_aggregate(w.replicas_to_aggregate);
  }

  Coordinator& c_;
};

// --- Coordinator -------------------------------------------------------------------------------

Coordinator::Coordinator(const std::string& address, SchedulerOptions options) : scheduler_(std::move(options)) {
  service_ = std::make_unique<CoordinatorServiceImpl>(*this);
  grpc::ServerBuilder b;
  b.AddListeningPort(address, grpc::InsecureServerCredentials(), &port_);
  b.SetMaxReceiveMessageSize(INT32_MAX);
  b.RegisterService(service_.get());
  server_ = b.BuildAndStart();
  if (!server_ || port_ == 0) {
    server_.reset();
    throw IOError("parameter-server chief: cannot listen on " + address +
                  " for the workers (in use, or not a local address); check TF_CONFIG's chief address");
  }
}

Coordinator::~Coordinator() {
  {
    std::lock_guard<std::mutex> l(mu_);
    scheduler_.finish();
  }
  changed_.notify_all();
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_->Wait();
  }
}

void Coordinator::start(int64_t steps, int64_t first_sync_step) {
  {
    std::lock_guard<std::mutex> l(mu_);
    scheduler_.start(steps, first_sync_step);
    events_.clear();
  }
  changed_.notify_all();
}

void Coordinator::pause() {
  std::lock_guard<std::mutex> l(mu_);
  scheduler_.pause();
  events_.clear();
}

void Coordinator::finish() {
  {
    std::lock_guard<std::mutex> l(mu_);
    scheduler_.finish();
  }
  changed_.notify_all();
}

std::vector<StepEvent> Coordinator::wait_events(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(mu_);
  changed_.wait_for(l, timeout, [&] { return !events_.empty() || scheduler_.run_done(); });
  const bool freed = !scheduler_.expire(std::chrono::steady_clock::now()).empty();
  for (const auto& m : scheduler_.take_messages()) std::cout << "Parameter servers: " << m << std::endl;
  std::vector<StepEvent> out(std::make_move_iterator(events_.begin()), std::make_move_iterator(events_.end()));
  events_.clear();
  l.unlock();
  if (freed) changed_.notify_all();  // steps of a lost worker for the waiting ones
  return out;
}

bool Coordinator::run_done() const {
  std::lock_guard<std::mutex> l(mu_);
  return scheduler_.run_done();
}

int64_t Coordinator::run_completed() const {
  std::lock_guard<std::mutex> l(mu_);
  return scheduler_.run_completed();
}

int64_t Coordinator::sync_step() const {
  std::lock_guard<std::mutex> l(mu_);
  return scheduler_.sync_step();
}

double Coordinator::seconds_without_workers() const {
  std::lock_guard<std::mutex> l(mu_);
  const SteadyTime since = scheduler_.last_contact().value_or(created_);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

SchedulerStats Coordinator::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  return scheduler_.stats();
}

int Coordinator::wait_workers_joined(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(mu_);
  changed_.wait_for(l, timeout, [&] { return scheduler_.workers_seen() >= scheduler_.options().num_workers; });
  return scheduler_.workers_seen();
}

void Coordinator::wait_workers_done(std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  std::unique_lock<std::mutex> l(mu_);
  while (!scheduler_.all_workers_done() && std::chrono::steady_clock::now() < until) {
    l.unlock();
    (void)wait_events(std::chrono::milliseconds(100));  // expires silent workers meanwhile
    l.lock();
  }
}

}  // namespace kiln::ps
