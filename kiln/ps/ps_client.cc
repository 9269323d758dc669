#include "kiln/ps/ps_client.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <functional>
#include <future>
#include <random>
#include <sstream>
#include <thread>

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/json_limits.h"
#include "kiln/ps/wire.h"

namespace kiln::ps {
namespace {

namespace pb = ::kiln::ps;
using Clock = std::chrono::steady_clock;

// Runs f(i) for every i in `tasks` at once; rethrows the first error after
// all have finished.
void for_each_task(const std::vector<int>& tasks, const std::function<void(int)>& f) {
  if (tasks.size() == 1) return f(tasks[0]);
  std::vector<std::future<void>> running;
  for (int i : tasks) running.push_back(std::async(std::launch::async, f, i));
  std::exception_ptr first;
  for (auto& r : running) {
    try {
      r.get();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

// 0 .. n-1: every ps task.
std::vector<int> every_task(size_t n) {
  std::vector<int> tasks(n);
  for (size_t t = 0; t < n; ++t) tasks[t] = static_cast<int>(t);
  return tasks;
}

}  // namespace

grpc::ChannelArguments job_channel_arguments() {
  grpc::ChannelArguments args;
  // gRPC backs off up to 2 minutes between connection attempts to a peer
  // that refused one; the tasks of a job start in any order and restart
  // within seconds, so try again every 100 ms, at most a second apart.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // A failed connection re-resolves the name, at most this often (30 s by default).
  args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 100);
  return args;
}

struct ParameterServerClient::Stubs {
  std::vector<std::unique_ptr<pb::ParameterServerService::Stub>> stubs;
  PsClientOptions options;

  template <class Rpc>
  void call(int task, const std::string& what, Rpc&& rpc) {
    const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(options.connect_timeout_seconds));
    const std::string where = "ps " + std::to_string(task) + " (" + options.ps_addresses[task] + ")";
    while (true) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::duration_cast<std::chrono::system_clock::duration>(
                           std::chrono::duration<double>(options.rpc_timeout_seconds)));
      grpc::Status s = rpc(*stubs[task], ctx);
      if (s.ok()) return;
      if (s.error_code() == grpc::StatusCode::UNAVAILABLE && Clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      }
      const std::string m = what + " at " + where + " failed: " + s.error_message();
      switch (s.error_code()) {
        case grpc::StatusCode::INVALID_ARGUMENT:
          throw ValueError(m);
        case grpc::StatusCode::NOT_FOUND:
          throw NotFoundError(m);
        case grpc::StatusCode::FAILED_PRECONDITION:
          throw StateError(m);
        case grpc::StatusCode::UNAVAILABLE:
          throw IOError(what + ": cannot reach " + where + " within " + seconds_text(options.connect_timeout_seconds) +
                        " s: " + s.error_message());
        default:
          throw IOError(m);
      }
    }
  }
};

void PsClientOptions::validate() const {
  if (ps_addresses.empty())
    throw ValueError(
        "ParameterServerClient: `ps_addresses` is empty; give the cluster's \"ps\" list (PsClusterSpec::ps)");
  for (const auto& a : ps_addresses) {
    const auto colon = a.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == a.size())
      throw ValueError("ParameterServerClient: a ps address must be HOST:PORT. Received: " + text_excerpt(a));
  }
  if (!(connect_timeout_seconds > 0))
    throw ValueError("ParameterServerClient: `connect_timeout_seconds` must be positive. Received: " +
                     std::to_string(connect_timeout_seconds));
  if (!(rpc_timeout_seconds > 0))
    throw ValueError("ParameterServerClient: `rpc_timeout_seconds` must be positive. Received: " +
                     std::to_string(rpc_timeout_seconds));
}

ParameterServerClient::ParameterServerClient(std::vector<distribute::PlacedVariable> placement, PsClientOptions options)
    : placement_(std::move(placement)), options_(std::move(options)), stubs_(std::make_unique<Stubs>()) {
  options_.validate();
  next_request_id_ = random_id();  // 0 means "no id"
  for (size_t i = 0; i < placement_.size(); ++i) {
    const auto& v = placement_[i];
    if (!index_.emplace(v.path, i).second)
      throw ValueError("ParameterServerClient: the placement lists " + text_excerpt(v.path) + " twice");
    for (const auto& s : v.shards)
      if (s.ps < 0 || s.ps >= static_cast<int>(options_.ps_addresses.size()))
        throw ValueError("ParameterServerClient: " + text_excerpt(s.path) + " is placed on ps " + std::to_string(s.ps) +
                         ", but the cluster has " + std::to_string(options_.ps_addresses.size()) +
                         " ps tasks; place the variables with the cluster's num_ps()");
  }
  stubs_->options = options_;
  grpc::ChannelArguments args = job_channel_arguments();
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  for (const auto& a : options_.ps_addresses)
    stubs_->stubs.push_back(
        pb::ParameterServerService::NewStub(grpc::CreateCustomChannel(a, grpc::InsecureChannelCredentials(), args)));
}

ParameterServerClient::~ParameterServerClient() = default;

const distribute::PlacedVariable& ParameterServerClient::placed(const std::string& path) const {
  auto it = index_.find(path);
  if (it == index_.end())
    throw ValueError("ParameterServerClient: no placed variable is named " + text_excerpt(path) +
                     " (the placement has " + std::to_string(placement_.size()) + " variables)");
  return placement_[it->second];
}

int ParameterServerClient::create_variables(const std::map<std::string, at::Tensor>& initial_values) {
  std::map<int, pb::CreateVariablesRequest> requests;
  for (const auto& v : placement_) {
    auto it = initial_values.find(v.path);
    if (it == initial_values.end() || !it->second.defined())
      throw ValueError("ParameterServerClient::create_variables: no initial value for " + text_excerpt(v.path));
    const at::Tensor value = it->second.detach().to(at::kCPU);
    if (sizes_of(value) != v.shape)
      throw ShapeError("ParameterServerClient::create_variables: " + text_excerpt(v.path) + " is placed with shape " +
                       shape_to_string(v.shape) + "; its initial value has " + shape_to_string(sizes_of(value)));
    for (const auto& s : v.shards) {
      pb::VariableValue* out = requests[s.ps].add_variables();
      out->set_path(s.path);
      wire::fill(out->mutable_value(), v.sharded() ? value.narrow(0, s.row_offset, s.shape[0]) : value);
    }
  }
  for (const auto& [path, value] : initial_values) placed(path);  // no unplaced extras
  std::vector<int> tasks;
  for (auto& [t, q] : requests) tasks.push_back(t);
  std::mutex mu;
  int created = 0;
  for_each_task(tasks, [&](int t) {
    pb::CreateVariablesResponse r;
    stubs_->call(t, "CreateVariables", [&](pb::ParameterServerService::Stub& s, grpc::ClientContext& c) {
      return s.CreateVariables(&c, requests.at(t), &r);
    });
    std::lock_guard<std::mutex> l(mu);
    created += r.created_size();
  });
  return created;
}

std::map<std::string, at::Tensor> ParameterServerClient::pull(const std::vector<std::string>& paths) {
  std::vector<const distribute::PlacedVariable*> wanted;
  if (paths.empty())
    for (const auto& v : placement_) wanted.push_back(&v);
  for (const auto& p : paths) wanted.push_back(&placed(p));
  std::map<int, pb::PullRequest> requests;
  for (const auto* v : wanted)
    for (const auto& s : v->shards) requests[s.ps].add_paths(s.path);
  std::vector<int> tasks;
  for (auto& [t, q] : requests) tasks.push_back(t);
  std::map<int, pb::PullResponse> responses;
  for (int t : tasks) responses[t];  // created before the threads write into them
  for_each_task(tasks, [&](int t) {
    stubs_->call(t, "Pull", [&](pb::ParameterServerService::Stub& s, grpc::ClientContext& c) {
      return s.Pull(&c, requests.at(t), &responses.at(t));
    });
  });
  std::map<std::string, at::Tensor> shards;
  std::map<std::string, int64_t> versions;
  for (auto& [t, r] : responses)
    for (const auto& v : r.variables()) {
      shards[v.path()] =
          wire::tensor_of(v.value(), "Pull from ps " + std::to_string(t) + ": " + text_excerpt(v.path()));
      versions[v.path()] = v.version();
    }
  std::map<std::string, at::Tensor> out;
  for (const auto* v : wanted) {
    std::vector<at::Tensor> parts;
    for (const auto& s : v->shards) {
      auto it = shards.find(s.path);
      if (it == shards.end())
        throw IOError("Pull: ps " + std::to_string(s.ps) + " sent no value for " + text_excerpt(s.path));
      parts.push_back(it->second);
    }
    out[v->path] = parts.size() == 1 ? parts[0] : at::cat(parts, 0);
  }
  std::lock_guard<std::mutex> l(mu_);
  for (auto& [p, ver] : versions) versions_[p] = ver;
  return out;
}

PushResult ParameterServerClient::push_gradients(const std::map<std::string, at::Tensor>& grads,
                                                 const PushOptions& options) {
  std::map<std::string, int64_t> pulled = pulled_versions();
  std::map<int, pb::PushGradientsRequest> requests;
  if (options.sync)  // every ps task takes part in each step, with or without gradients for it
    for (int t = 0; t < static_cast<int>(options_.ps_addresses.size()); ++t) requests[t];
  for (const auto& [path, value] : options.assign) {
    const auto& v = placed(path);
    if (sizes_of(value) != v.shape)
      throw ShapeError("ParameterServerClient::push_gradients: the value of " + text_excerpt(path) + " has shape " +
                       shape_to_string(sizes_of(value)) + "; the variable's is " + shape_to_string(v.shape));
    const at::Tensor cpu = value.detach().to(at::kCPU);
    for (const auto& s : v.shards) {
      pb::VariableValue* out = requests[s.ps].add_assign();
      out->set_path(s.path);
      wire::fill(out->mutable_value(), v.sharded() ? cpu.narrow(0, s.row_offset, s.shape[0]) : cpu);
    }
  }
  for (const auto& [path, g] : grads) {
    if (!g.defined()) continue;
    const auto& v = placed(path);
    if (sizes_of(g) != v.shape)
      throw ShapeError("ParameterServerClient::push_gradients: the gradient of " + text_excerpt(path) + " has shape " +
                       shape_to_string(sizes_of(g)) + "; the variable's is " + shape_to_string(v.shape));
    const at::Tensor cpu = g.detach().to(at::kCPU);
    for (const auto& s : v.shards) {
      pb::Gradient* out = requests[s.ps].add_gradients();
      out->set_path(s.path);
      auto it = pulled.find(s.path);
      out->set_pulled_version(it == pulled.end() ? 0 : it->second);
      wire::fill(out->mutable_gradient(), v.sharded() ? cpu.narrow(0, s.row_offset, s.shape[0]) : cpu);
    }
  }
  std::vector<int> tasks;
  for (auto& [t, q] : requests) {
    tasks.push_back(t);
    q.set_worker(options_.worker_name);
    q.set_request_id(next_request_id_++);
    q.set_sync(options.sync);
    q.set_sync_step(options.sync_step);
    q.set_replicas_to_aggregate(options.replicas_to_aggregate);
  }
  std::map<int, pb::PushGradientsResponse> responses;
  for (int t : tasks) responses[t];
  for_each_task(tasks, [&](int t) {
    stubs_->call(t, "PushGradients", [&](pb::ParameterServerService::Stub& s, grpc::ClientContext& c) {
      return s.PushGradients(&c, requests.at(t), &responses.at(t));
    });
  });
  PushResult result;
  for (auto& [t, r] : responses) {
    const auto& q = requests[t];
    if (r.staleness_size() != q.gradients_size())
      throw IOError("PushGradients: ps " + std::to_string(t) + " answered " + std::to_string(r.staleness_size()) +
                    " staleness values for " + std::to_string(q.gradients_size()) + " gradients");
    for (int i = 0; i < q.gradients_size(); ++i) {
      result.staleness[q.gradients(i).path()] = r.staleness(i);
      result.max_staleness = std::max(result.max_staleness, r.staleness(i));
    }
    result.dropped = result.dropped || r.dropped();
  }
  return result;
}

std::vector<PsTaskState> ParameterServerClient::get_state() {
  std::vector<PsTaskState> out(options_.ps_addresses.size());
  for_each_task(every_task(out.size()), [&](int t) {
    pb::GetStateRequest q;
    pb::PsState r;
    stubs_->call(t, "GetState",
                 [&](pb::ParameterServerService::Stub& s, grpc::ClientContext& c) { return s.GetState(&c, q, &r); });
    const std::string where = "GetState from ps " + std::to_string(t) + ": ";
    PsTaskState& st = out[t];
    for (const auto& v : r.variables()) {
      st.values[v.path()] = wire::tensor_of(v.value(), where + text_excerpt(v.path()));
      st.versions[v.path()] = v.version();
    }
    for (const auto& n : r.optimizer_state())
      st.optimizer_state[n.name()] = wire::tensor_of(n.value(), where + text_excerpt(n.name()));
    st.sync_step = r.sync_step();
  });
  return out;
}

void ParameterServerClient::set_state(const std::vector<PsTaskState>& state) {
  if (state.size() != options_.ps_addresses.size())
    throw ValueError("ParameterServerClient::set_state: the state has " + std::to_string(state.size()) +
                     " ps tasks; the cluster has " + std::to_string(options_.ps_addresses.size()));
  for_each_task(every_task(state.size()), [&](int t) {
    pb::PsState q;
    const PsTaskState& st = state[t];
    for (const auto& [path, value] : st.values) {
      pb::VariableValue* v = q.add_variables();
      v->set_path(path);
      auto it = st.versions.find(path);
      v->set_version(it == st.versions.end() ? 0 : it->second);
      wire::fill(v->mutable_value(), value);
    }
    for (const auto& [name, value] : st.optimizer_state) {
      pb::NamedTensor* n = q.add_optimizer_state();
      n->set_name(name);
      wire::fill(n->mutable_value(), value);
    }
    q.set_sync_step(st.sync_step);
    pb::SetStateResponse r;
    stubs_->call(t, "SetState",
                 [&](pb::ParameterServerService::Stub& s, grpc::ClientContext& c) { return s.SetState(&c, q, &r); });
  });
  std::lock_guard<std::mutex> l(mu_);
  versions_.clear();
}

void ParameterServerClient::shutdown_servers() {
  for (size_t t = 0; t < stubs_->stubs.size(); ++t) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    pb::ShutdownRequest q;
    pb::ShutdownResponse r;
    (void)stubs_->stubs[t]->Shutdown(&ctx, q, &r);  // a task already gone has nothing to stop
  }
}

std::map<std::string, int64_t> ParameterServerClient::pulled_versions() const {
  std::lock_guard<std::mutex> l(mu_);
  return versions_;
}

std::vector<PsTaskStatus> ParameterServerClient::status() {
  std::vector<PsTaskStatus> out(options_.ps_addresses.size());
  for_each_task(every_task(options_.ps_addresses.size()), [&](int t) {
    pb::GetStatusRequest q;
    pb::GetStatusResponse r;
    stubs_->call(t, "GetStatus",
                 [&](pb::ParameterServerService::Stub& s, grpc::ClientContext& c) { return s.GetStatus(&c, q, &r); });
    PsTaskStatus& st = out[t];
    st.task_index = r.task_index();
    st.address = options_.ps_addresses[t];
    st.state = r.state();
    st.num_variables = r.num_variables();
    st.pushes_applied = r.pushes_applied();
    st.max_staleness = r.max_staleness();
    st.optimizer_json = r.optimizer_json();
    st.optimizer_iterations = r.optimizer_iterations();
    st.incarnation = r.incarnation();
    st.sync_step = r.sync_step();
    st.bytes_pulled = r.bytes_pulled();
    st.bytes_pushed = r.bytes_pushed();
  });
  return out;
}

}  // namespace kiln::ps
