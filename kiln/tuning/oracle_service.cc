#include "kiln/tuning/oracle_service.h"

#include <grpcpp/grpcpp.h>

#include <cstdlib>
#include <iostream>

#include "kiln/core/error.h"
#include "kiln/tuning/oracle.grpc.pb.h"

namespace kiln::tuning {
namespace {

using Clock = std::chrono::steady_clock;
namespace pb = ::kiln::tuning;  // generated messages share the namespace

grpc::Status user_error(grpc::StatusCode code, const std::string& m) { return grpc::Status(code, m); }

}  // namespace

// --- the service ---------------------------------------------------------------------------------

class OracleServiceImpl final : public pb::OracleService::Service {
 public:
  OracleServiceImpl(std::shared_ptr<Oracle> oracle, double lease_seconds)
      : oracle_(std::move(oracle)), lease_seconds_(lease_seconds) {}

  grpc::Status GetSpace(grpc::ServerContext*, const pb::GetSpaceRequest*, pb::GetSpaceResponse* r) override {
    r->set_hyperparameters_json(oracle_->space().to_json().dump());
    return grpc::Status::OK;
  }

  grpc::Status CreateTrial(grpc::ServerContext*, const pb::CreateTrialRequest* q, pb::CreateTrialResponse* r) override {
    return guard([&] {
      std::lock_guard<std::mutex> l(mu_);
      Next next = Next::kDone;
      Trial t = oracle_->create_trial(q->tuner_id(), &next);
      r->set_lease_seconds(lease_seconds_);
      if (next == Next::kTrial) {
        leases_[t.trial_id] = {q->tuner_id(), deadline()};
        r->set_next(pb::CreateTrialResponse::TRIAL);
        r->set_trial_json(t.to_json().dump());
      } else if (next == Next::kDone && oracle_->count(TrialStatus::kRunning) == 0) {
        r->set_next(pb::CreateTrialResponse::DONE);
      } else {
        r->set_next(pb::CreateTrialResponse::IDLE);
      }
      return grpc::Status::OK;
    });
  }

  grpc::Status UpdateTrial(grpc::ServerContext*, const pb::UpdateTrialRequest* q, pb::UpdateTrialResponse* r) override {
    return guard([&] {
      std::lock_guard<std::mutex> l(mu_);
      if (auto s = check_lease(q->tuner_id(), q->trial_id()); !s.ok()) return s;
      std::map<std::string, double> logs(q->metrics().begin(), q->metrics().end());
      TrialStatus st = oracle_->update_trial(q->trial_id(), logs, q->step());
      r->set_stop(st == TrialStatus::kStopped);
      r->set_status(status_name(st));
      return grpc::Status::OK;
    });
  }

  grpc::Status Heartbeat(grpc::ServerContext*, const pb::HeartbeatRequest* q, pb::HeartbeatResponse*) override {
    std::lock_guard<std::mutex> l(mu_);
    return check_lease(q->tuner_id(), q->trial_id());
  }

  grpc::Status EndTrial(grpc::ServerContext*, const pb::EndTrialRequest* q, pb::EndTrialResponse*) override {
    return guard([&] {
      std::lock_guard<std::mutex> l(mu_);
      if (auto s = check_lease(q->tuner_id(), q->trial_id()); !s.ok()) return s;
      oracle_->end_trial(q->trial_id(), status_from_name(q->status()), q->message());
      leases_.erase(q->trial_id());
      return grpc::Status::OK;
    });
  }

  grpc::Status GetTrial(grpc::ServerContext*, const pb::GetTrialRequest* q, pb::GetTrialResponse* r) override {
    return guard([&] {
      r->set_trial_json(oracle_->get_trial(q->trial_id()).to_json().dump());
      return grpc::Status::OK;
    });
  }

  grpc::Status GetBestTrials(grpc::ServerContext*, const pb::GetBestTrialsRequest* q,
                             pb::GetBestTrialsResponse* r) override {
    return guard([&] {
      for (auto& t : oracle_->get_best_trials(q->num_trials() > 0 ? q->num_trials() : 1))
        r->add_trial_json(t.to_json().dump());
      return grpc::Status::OK;
    });
  }

  // Requeues trials whose lease ran out; returns how many.
  int reap() {
    std::lock_guard<std::mutex> l(mu_);
    int n = 0;
    auto now = Clock::now();
    for (auto it = leases_.begin(); it != leases_.end();) {
      if (it->second.deadline < now) {
        std::string msg = "worker '" + it->second.owner + "' sent nothing for " + std::to_string(lease_seconds_) +
                          " s (lease expired); trial handed out again";
        std::cerr << "kiln tune chief: trial " << it->first << ": " << msg << std::endl;
        try {
          oracle_->requeue_trial(it->first, msg);
        } catch (const std::exception& e) {
          std::cerr << "kiln tune chief: " << e.what() << std::endl;
        }
        it = leases_.erase(it);
        ++n;
      } else {
        ++it;
      }
    }
    return n;
  }

  bool idle() {
    std::lock_guard<std::mutex> l(mu_);
    return leases_.empty();
  }

 private:
  struct Lease {
    std::string owner;
    Clock::time_point deadline;
  };
  Clock::time_point deadline() const {
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(lease_seconds_));
  }
  // mu_ held. Renews the lease when `tuner_id` holds it.
  grpc::Status check_lease(const std::string& tuner_id, const std::string& trial_id) {
    auto it = leases_.find(trial_id);
    if (it == leases_.end() || it->second.owner != tuner_id)
      return user_error(grpc::StatusCode::FAILED_PRECONDITION,
                        "worker '" + tuner_id + "' does not hold trial '" + trial_id +
                            "' (its lease expired and the trial was handed out again)");
    it->second.deadline = deadline();
    return grpc::Status::OK;
  }
  template <class F>
  grpc::Status guard(F&& f) {
    try {
      return f();
    } catch (const NotFoundError& e) {
      return user_error(grpc::StatusCode::NOT_FOUND, e.what());
    } catch (const UserError& e) {
      return user_error(grpc::StatusCode::INVALID_ARGUMENT, e.what());
    } catch (const StateError& e) {
      return user_error(grpc::StatusCode::FAILED_PRECONDITION, e.what());
    } catch (const std::exception& e) {
      return user_error(grpc::StatusCode::INTERNAL, e.what());
    }
  }

  std::shared_ptr<Oracle> oracle_;
  double lease_seconds_;
  std::mutex mu_;  // guards leases_ and orders oracle calls with them
  std::map<std::string, Lease> leases_;
};

// --- chief ---------------------------------------------------------------------------------------

void ChiefOptions::validate() const {
  if (address.empty() || address.find(':') == std::string::npos)
    throw ValueError("the chief's address must be HOST:PORT (port 0 picks a free one). Received: \"" + address + "\"");
  if (!(lease_seconds > 0))
    throw ValueError("`lease_seconds` must be positive. Received: " + std::to_string(lease_seconds));
}

OracleChief::OracleChief(std::shared_ptr<Oracle> oracle, ChiefOptions options)
    : oracle_(std::move(oracle)), options_(std::move(options)) {
  options_.validate();
  service_ = std::make_unique<OracleServiceImpl>(oracle_, options_.lease_seconds);
  grpc::ServerBuilder b;
  b.AddListeningPort(options_.address, grpc::InsecureServerCredentials(), &port_);
  b.RegisterService(service_.get());
  server_ = b.BuildAndStart();
  if (!server_ || port_ == 0) throw IOError("cannot serve the tuning oracle at " + options_.address);
  reaper_ = std::thread([this] { reap_loop(); });
}

OracleChief::~OracleChief() { shutdown(); }

void OracleChief::reap_loop() {
  double period = std::min(0.5, options_.lease_seconds / 4);
  std::unique_lock<std::mutex> l(mu_);
  while (!stopping_) {
    cv_.wait_for(l, std::chrono::duration<double>(period));
    if (stopping_) break;
    l.unlock();
    service_->reap();
    l.lock();
  }
}

bool OracleChief::done() const {
  return oracle_->done() && oracle_->count(TrialStatus::kRunning) == 0 && service_->idle();
}

void OracleChief::wait_until_done(double linger_seconds) {
  {
    std::unique_lock<std::mutex> l(mu_);
    while (!stopping_ && !done()) cv_.wait_for(l, std::chrono::milliseconds(100));
    cv_.wait_for(l, std::chrono::duration<double>(linger_seconds), [&] { return stopping_; });
  }
  shutdown();
}

void OracleChief::shutdown() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopping_ && !reaper_.joinable() && !server_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (reaper_.joinable()) reaper_.join();
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_->Wait();
    server_.reset();
  }
}

// --- worker side ---------------------------------------------------------------------------------

struct RemoteOracleSource::Stub {
  std::unique_ptr<pb::OracleService::Stub> stub;
};

RemoteOracleSource::RemoteOracleSource(const std::string& target, std::string tuner_id, double connect_timeout_seconds)
    : target_(target), tuner_id_(std::move(tuner_id)), connect_timeout_(connect_timeout_seconds) {
  auto channel = grpc::CreateChannel(target_, grpc::InsecureChannelCredentials());
  stub_ = std::make_unique<Stub>();
  stub_->stub = pb::OracleService::NewStub(channel);
}

RemoteOracleSource::~RemoteOracleSource() = default;

namespace {
template <class Call>
void call_with_retry(const std::string& target, double timeout_s, const std::string& what, Call&& call) {
  auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Status s = call(ctx);
    if (s.ok()) return;
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE && Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      continue;
    }
    std::string m = what + " at the tuning chief " + target + " failed: " + s.error_message();
    if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) throw StateError(m);
    if (s.error_code() == grpc::StatusCode::INVALID_ARGUMENT || s.error_code() == grpc::StatusCode::NOT_FOUND)
      throw ValueError(m);
    throw IOError(m);
  }
}
}  // namespace

std::string RemoteOracleSource::owner(const std::string& trial_id) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = owners_.find(trial_id);
  return it == owners_.end() ? tuner_id_ : it->second;
}

std::optional<Trial> RemoteOracleSource::next_trial(const std::string& tuner_id, Next* next) {
  pb::CreateTrialRequest q;
  q.set_tuner_id(tuner_id.empty() ? tuner_id_ : tuner_id);
  pb::CreateTrialResponse r;
  call_with_retry(target_, connect_timeout_, "CreateTrial",
                  [&](grpc::ClientContext& c) { return stub_->stub->CreateTrial(&c, q, &r); });
  lease_seconds_ = r.lease_seconds();
  if (r.next() == pb::CreateTrialResponse::TRIAL) {
    *next = Next::kTrial;
    Trial t = Trial::from_json(parse_json(r.trial_json(), "the chief's trial"));
    std::lock_guard<std::mutex> l(mu_);
    owners_[t.trial_id] = q.tuner_id();
    return t;
  }
  *next = r.next() == pb::CreateTrialResponse::DONE ? Next::kDone : Next::kIdle;
  return std::nullopt;
}

TrialStatus RemoteOracleSource::report(const std::string& trial_id, const std::map<std::string, double>& logs,
                                       int step) {
  pb::UpdateTrialRequest q;
  q.set_tuner_id(owner(trial_id));
  q.set_trial_id(trial_id);
  q.set_step(step);
  for (auto& [k, v] : logs) (*q.mutable_metrics())[k] = v;
  pb::UpdateTrialResponse r;
  call_with_retry(target_, connect_timeout_, "UpdateTrial",
                  [&](grpc::ClientContext& c) { return stub_->stub->UpdateTrial(&c, q, &r); });
  return r.stop() ? TrialStatus::kStopped : TrialStatus::kRunning;
}

void RemoteOracleSource::heartbeat(const std::string& trial_id) {
  pb::HeartbeatRequest q;
  q.set_tuner_id(owner(trial_id));
  q.set_trial_id(trial_id);
  pb::HeartbeatResponse r;
  call_with_retry(target_, connect_timeout_, "Heartbeat",
                  [&](grpc::ClientContext& c) { return stub_->stub->Heartbeat(&c, q, &r); });
}

void RemoteOracleSource::end(const std::string& trial_id, TrialStatus status, const std::string& message) {
  pb::EndTrialRequest q;
  q.set_tuner_id(owner(trial_id));
  q.set_trial_id(trial_id);
  q.set_status(status_name(status));
  q.set_message(message);
  pb::EndTrialResponse r;
  call_with_retry(target_, connect_timeout_, "EndTrial",
                  [&](grpc::ClientContext& c) { return stub_->stub->EndTrial(&c, q, &r); });
  std::lock_guard<std::mutex> l(mu_);
  owners_.erase(trial_id);
}

HyperParameters RemoteOracleSource::space() {
  pb::GetSpaceRequest q;
  pb::GetSpaceResponse r;
  call_with_retry(target_, connect_timeout_, "GetSpace",
                  [&](grpc::ClientContext& c) { return stub_->stub->GetSpace(&c, q, &r); });
  return HyperParameters::from_json(parse_json(r.hyperparameters_json(), "the chief's search space"));
}

std::vector<std::string> RemoteOracleSource::best_trial_ids(int n) {
  std::vector<std::string> ids;
  for (auto& t : best_trials(n)) ids.push_back(t.trial_id);
  return ids;
}

std::vector<Trial> RemoteOracleSource::best_trials(int n) {
  pb::GetBestTrialsRequest q;
  q.set_num_trials(n);
  pb::GetBestTrialsResponse r;
  call_with_retry(target_, connect_timeout_, "GetBestTrials",
                  [&](grpc::ClientContext& c) { return stub_->stub->GetBestTrials(&c, q, &r); });
  std::vector<Trial> out;
  for (auto& s : r.trial_json()) out.push_back(Trial::from_json(parse_json(s, "the chief's trial")));
  return out;
}

std::optional<WorkerConfig> worker_config_from_env() {
  const char* ip = std::getenv("KERASTUNER_ORACLE_IP");
  if (!ip || !*ip) return std::nullopt;
  WorkerConfig c;
  c.oracle_ip = ip;
  const char* port = std::getenv("KERASTUNER_ORACLE_PORT");
  std::string p = port ? port : "";
  char* end = nullptr;
  long v = p.empty() ? 0 : std::strtol(p.c_str(), &end, 10);
  if (p.empty() || *end != '\0' || v <= 0 || v > 65535)
    throw ValueError("KERASTUNER_ORACLE_PORT must be the chief's port (1-65535). Received: \"" + p + "\"");
  c.oracle_port = (int)v;
  const char* id = std::getenv("KERASTUNER_TUNER_ID");
  c.tuner_id = id && *id ? id : "worker";
  return c;
}

}  // namespace kiln::tuning
