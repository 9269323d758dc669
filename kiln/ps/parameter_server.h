// A parameter-server task: a gRPC service (proto/kiln/ps/parameter_server.proto,
// kiln.ps.ParameterServerService) that holds some of a job's variables and applies
// the workers' gradients to them with its own kiln Optimizer.
//
//   ParameterServer ps({.address = "0.0.0.0:2222",
//                       .optimizer = Json{{"class_name", "SGD"}, {"config", {{"learning_rate", 0.1}}}}});
//   ps.wait();   // a ps task's whole life: serve until shutdown()
//
// Asynchronous updates (TF's ParameterServerStrategy without a barrier):
// every PushGradients is applied at once, as one optimizer step over the
// variables it names, in arrival order (one at a time: the optimizer is not
// thread-safe). Each variable has a version, the number of updates applied
// to it since creation; a push reports, per gradient, its staleness: the
// version before the update minus the version the worker pulled (0: the
// gradient was computed from the current values).
//
// Synchronous updates (the seeds' SyncReplicasOptimizer with backup
// workers): a push names its global step and how many pushes a step takes
// (N); the task sums the gradients of the first N pushes of its current step,
// applies their mean as one optimizer step and moves to the next step; a
// push for an earlier step comes from a straggler and is dropped (reported
// as such). Pushes carry a request id per worker: a retried push is
// answered again, never applied twice.
//
// Checkpoints: GetState returns everything the task holds (variables,
// versions, optimizer state, synchronous step) and SetState puts it back,
// into this task or a restarted one. Shutdown (the chief's, at the end of
// the job) makes wait() stop the server and return.
//
// Variables are created by CreateVariables (idempotent by path: an existing
// variable keeps its value, so a restarted worker may call it again). A ps
// task keeps its variables in memory only; checkpoints are the chief's job
// (kiln/ps/ps_strategy.h).
//
// Lifecycle: kServing -> kStopping -> kStopped. The constructor starts
// serving; shutdown() (or the destructor) stops taking calls, lets running
// ones finish (up to 2 s) and stops. shutdown() is idempotent; wait() blocks
// until it has run (or runs it when a Shutdown call asked for it).
//
// Thread safety: every public method may be called from any thread; the
// service's handlers run on gRPC's threads.
#pragma once

#include <ATen/ATen.h>

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "kiln/core/json.h"
#include "kiln/distribute/cluster.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace kiln::ps {

struct ParameterServerOptions {
  // "host:port"; port 0 picks a free one (see ParameterServer::port()).
  std::string address = "127.0.0.1:0";
  // What Optimizer::from_json takes: a name ("sgd") or {"class_name", "config"}.
  Json optimizer = "sgd";
  int task_index = 0;  // this task's index in the cluster's "ps" list (reported by GetStatus)
  // ValueError for an address without a port, a negative task index, or an
  // optimizer that from_json refuses.
  void validate() const;
};

// The options of the ps task `spec` names (resolve_ps_cluster()): it serves
// on every interface at its own address's port ("0.0.0.0:<port>"), with
// task_index = spec.task_index. ValueError when `spec` is not a ps task.
ParameterServerOptions ps_task_options(const distribute::PsClusterSpec& spec, Json optimizer);

class ParameterServiceImpl;

class ParameterServer {
 public:
  enum class State { kServing, kStopping, kStopped };

  // Starts serving at once. IOError when the address cannot be bound.
  explicit ParameterServer(ParameterServerOptions options);
  ~ParameterServer();  // shutdown()
  ParameterServer(const ParameterServer&) = delete;
  ParameterServer& operator=(const ParameterServer&) = delete;

  int port() const { return port_; }
  // "host:port" with the chosen port (the address a local client dials).
  std::string target() const;
  State state() const;
  void shutdown();
  void wait();

  // Copies of the variables' values and their versions, by path (for tests
  // and, later, checkpoints).
  std::map<std::string, at::Tensor> values() const;
  std::map<std::string, int64_t> versions() const;
  // Random per ParameterServer: what GetStatus reports, so clients notice a
  // restarted task.
  uint64_t incarnation() const;
  // Synchronous training: the step this task is aggregating.
  int64_t sync_step() const;

 private:
  ParameterServerOptions options_;
  std::unique_ptr<ParameterServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  mutable std::mutex mu_;  // guards state_ and server_ during shutdown
  std::condition_variable stopped_;
  State state_ = State::kServing;
  bool shutdown_requested_ = false;  // a Shutdown call came; wait() stops the server
};

std::string state_name(ParameterServer::State s);  // "SERVING", "STOPPING", "STOPPED"

}  // namespace kiln::ps
