// A worker's view of the parameter servers: pull and push by variable path,
// each routed to the ps task that holds it (or, for a sharded variable, to
// the tasks that hold its shards) by the placement of
// kiln/distribute/partitioner.h.
//
//   auto spec = distribute::resolve_ps_cluster();
//   auto placement = distribute::place_variables(vars, spec.num_ps(), &partitioner);
//   ParameterServerClient client(placement, {.ps_addresses = spec.ps, .worker_name = "worker:0"});
//   client.create_variables(initial_values);    // idempotent: any task may call it
//   auto values = client.pull();                // whole values, by path
//   ... compute gradients from `values` ...
//   auto result = client.push_gradients(grads); // result.max_staleness
//
// Sharded variables are split and joined here (rows along axis 0, see
// partitioner.h); callers see whole variables only. Calls to several ps
// tasks run in parallel.
//
// Staleness: the client remembers the version of every shard it last
// pulled, and a push sends those versions with the gradients; a gradient of
// a variable this client never pulled counts as computed from version 0.
// So one client stands for one worker: give each worker (or each worker
// thread) its own.
//
// Errors: ValueError for a path the placement does not know or a bad
// gradient (its ps answered INVALID_ARGUMENT), NotFoundError when the ps does
// not hold the variable (not created), StateError when a ps holds an older
// version than the one pulled (it restarted), IOError when a ps cannot be
// reached within connect_timeout_seconds (retrying meanwhile) or a call
// outlives rpc_timeout_seconds. Each message names the ps task and address.
// A call that fails UNAVAILABLE is retried; pushes carry a request id, so a
// retried push the ps applied already is not applied again.
//
// Thread safety: all methods may be called from several threads (the
// remembered versions are guarded), though staleness is meaningful per worker.
#pragma once

#include <ATen/ATen.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/distribute/partitioner.h"

namespace grpc {
class ChannelArguments;
}  // namespace grpc

namespace kiln::ps {

// Channel settings for the calls between a job's tasks (quick reconnects:
// tasks start in any order and restart within seconds).
grpc::ChannelArguments job_channel_arguments();

struct PsClientOptions {
  std::vector<std::string> ps_addresses;  // "host:port" of ps task i (PsClusterSpec::ps)
  std::string worker_name = "worker";     // sent with pushes, e.g. "worker:2"
  double connect_timeout_seconds = 30;    // keep retrying an unreachable ps this long
  double rpc_timeout_seconds = 120;       // one call's deadline
  void validate() const;                  // ValueError: no address, an address without a port, a timeout <= 0
};

// One ps task's GetStatus answer.
struct PsTaskStatus {
  int task_index = 0;
  std::string address;
  std::string state;  // "SERVING" or "STOPPING"
  int64_t num_variables = 0;
  int64_t pushes_applied = 0;
  int64_t max_staleness = 0;
  std::string optimizer_json;
  int64_t optimizer_iterations = 0;
  uint64_t incarnation = 0;  // random per ps process: a change means it restarted
  int64_t sync_step = 0;
  int64_t bytes_pulled = 0;  // tensor bytes served by Pull since the task started
  int64_t bytes_pushed = 0;  // tensor bytes received by PushGradients
};

// How a push is applied (see parameter_server.h).
struct PushOptions {
  bool sync = false;              // false: applied at once (asynchronous)
  int64_t sync_step = 0;          // sync: the global step the gradients belong to
  int replicas_to_aggregate = 1;  // sync: pushes averaged into one update
  // Non-trainable variables to overwrite on their ps (moving statistics),
  // whole values by path.
  std::map<std::string, at::Tensor> assign;
};

// One ps task's whole state (GetState/SetState), for checkpoints.
struct PsTaskState {
  std::map<std::string, at::Tensor> values;  // by stored path
  std::map<std::string, int64_t> versions;
  std::map<std::string, at::Tensor> optimizer_state;  // Optimizer::state_dict()
  int64_t sync_step = 0;
};

struct PushResult {
  // Per stored variable (shard paths "<path>/part_<i>" for sharded ones):
  // version before the update minus the version this client pulled.
  std::map<std::string, int64_t> staleness;
  int64_t max_staleness = 0;
  // Synchronous: some ps task dropped the push (its step was already
  // applied: this worker was a straggler).
  bool dropped = false;
};

class ParameterServerClient {
 public:
  // ValueError when a shard names a ps task outside ps_addresses.
  ParameterServerClient(std::vector<distribute::PlacedVariable> placement, PsClientOptions options);
  ~ParameterServerClient();
  ParameterServerClient(const ParameterServerClient&) = delete;
  ParameterServerClient& operator=(const ParameterServerClient&) = delete;

  const std::vector<distribute::PlacedVariable>& placement() const { return placement_; }

  // Creates every placed variable from its whole initial value (by path; each
  // must be given, with the placed shape), split into shards as placed.
  // Idempotent: variables that exist keep their values. Returns how many
  // stored variables (shards count one each) were created now.
  int create_variables(const std::map<std::string, at::Tensor>& initial_values);

  // The current whole values by path (empty `paths`: every placed variable),
  // on the CPU. Remembers the versions for later pushes.
  std::map<std::string, at::Tensor> pull(const std::vector<std::string>& paths = {});

  // Pushes whole gradients by path (each with its variable's shape; the
  // variable's dtype or any floating dtype). Each ps task applies its part
  // as one optimizer step. Undefined gradients are skipped.
  // Each push carries a fresh request id, so a retry after a broken
  // connection is never applied twice.
  PushResult push_gradients(const std::map<std::string, at::Tensor>& grads, const PushOptions& options = {});

  // The versions this client last pulled, by stored path.
  std::map<std::string, int64_t> pulled_versions() const;

  // Every ps task's status, in task order (a task that does not answer is an
  // IOError).
  std::vector<PsTaskStatus> status();

  // Every ps task's state, in task order (the chief's checkpoint), and back.
  std::vector<PsTaskState> get_state();
  void set_state(const std::vector<PsTaskState>& state);
  // Asks every ps task to stop serving (the job is over); tasks that cannot
  // be reached are skipped.
  void shutdown_servers();

 private:
  struct Stubs;
  const distribute::PlacedVariable& placed(const std::string& path) const;

  std::vector<distribute::PlacedVariable> placement_;
  std::map<std::string, size_t> index_;  // path -> placement_ index
  PsClientOptions options_;
  std::unique_ptr<Stubs> stubs_;
  mutable std::mutex mu_;  // guards versions_
  std::map<std::string, int64_t> versions_;
  // Random start: a restarted worker (same name, new client) must not
  // reuse the ids of its previous life.
  std::atomic<uint64_t> next_request_id_;
};

}  // namespace kiln::ps
