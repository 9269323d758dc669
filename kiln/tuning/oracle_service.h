// Distributed tuning: a chief serves one Oracle over gRPC
// (proto/kiln/tuning/oracle.proto, service kiln.tuning.OracleService);
// workers on any machine pull trials, report each epoch and end them.
//
//   chief:   OracleChief chief(oracle, {.address = "0.0.0.0:8000"});
//            chief.wait_until_done();
//   worker:  RemoteOracleSource source("10.0.0.1:8000", "worker1");
//            run_command_trials(source, options);   // trial_runner.h
//
// Workers find the chief with KerasTuner's environment variables
// (worker_config_from_env): KERASTUNER_ORACLE_IP, KERASTUNER_ORACLE_PORT and
// KERASTUNER_TUNER_ID (a worker's id; "chief" marks the chief in KerasTuner).
//
// Leases: a trial handed to a worker is leased to it for lease_seconds,
// renewed by every UpdateTrial and Heartbeat. When a lease expires (the
// worker died, hung or lost the network) the chief hands the trial out
// again from scratch (Oracle::requeue_trial) and refuses further reports
// from the old worker (FAILED_PRECONDITION, so it stops its copy): a trial
// is never completed twice and never lost.
//
// Thread safety: OracleChief's handlers run on gRPC's threads and lock;
// RemoteOracleSource may be shared by a worker's threads.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "kiln/tuning/oracle.h"
#include "kiln/tuning/trial_runner.h"

namespace grpc {
class Server;
class Channel;
}  // namespace grpc

namespace kiln::tuning {

struct ChiefOptions {
  std::string address = "0.0.0.0:0";  // port 0: pick a free one (see port())
  double lease_seconds = 30;
  void validate() const;
};

class OracleServiceImpl;

class OracleChief {
 public:
  // Starts serving at once. IOError if the address cannot be bound.
  OracleChief(std::shared_ptr<Oracle> oracle, ChiefOptions options = {});
  ~OracleChief();  // shutdown()
  OracleChief(const OracleChief&) = delete;
  OracleChief& operator=(const OracleChief&) = delete;

  int port() const { return port_; }
  // True once no trial will be created and none is running.
  bool done() const;
  // Blocks until done(), then keeps answering for `linger_seconds` so that
  // the other workers hear DONE, then stops the server.
  void wait_until_done(double linger_seconds = 2.0);
  void shutdown();
  Oracle& oracle() { return *oracle_; }

 private:
  void reap_loop();
  std::shared_ptr<Oracle> oracle_;
  ChiefOptions options_;
  std::unique_ptr<OracleServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::mutex mu_;  // guards stopping_
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread reaper_;
};

// A worker's view of the chief.
class RemoteOracleSource : public TrialSource {
 public:
  // `target` "host:port". connect_timeout: how long to keep retrying an
  // unreachable chief before IOError.
  RemoteOracleSource(const std::string& target, std::string tuner_id, double connect_timeout_seconds = 30);
  ~RemoteOracleSource() override;
  std::optional<Trial> next_trial(const std::string& tuner_id, Next* next) override;
  TrialStatus report(const std::string& trial_id, const std::map<std::string, double>& logs, int step) override;
  void end(const std::string& trial_id, TrialStatus status, const std::string& message) override;
  void heartbeat(const std::string& trial_id) override;
  std::vector<std::string> best_trial_ids(int n) override;
  HyperParameters space();
  std::vector<Trial> best_trials(int n);
  double lease_seconds() const { return lease_seconds_; }

 private:
  struct Stub;
  std::string owner(const std::string& trial_id);  // the tuner id that took the trial
  std::string target_;
  std::string tuner_id_;
  double connect_timeout_;
  std::unique_ptr<Stub> stub_;
  std::mutex mu_;  // guards owners_
  std::map<std::string, std::string> owners_;
  double lease_seconds_ = 0;
};

struct WorkerConfig {
  std::string tuner_id;
  std::string oracle_ip;
  int oracle_port = 0;
  std::string target() const { return oracle_ip + ":" + std::to_string(oracle_port); }
};
// From KERASTUNER_TUNER_ID / KERASTUNER_ORACLE_IP / KERASTUNER_ORACLE_PORT;
// nullopt when KERASTUNER_ORACLE_IP is unset; ValueError for a bad port.
std::optional<WorkerConfig> worker_config_from_env();

}  // namespace kiln::tuning
