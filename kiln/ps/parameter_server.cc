#include "kiln/ps/parameter_server.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <random>
#include <set>

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/json_limits.h"
#include "kiln/core/variable.h"
#include "kiln/optimizers/optimizer.h"
#include "kiln/ps/wire.h"

namespace kiln::ps {
namespace {

namespace pb = ::kiln::ps;  // generated messages share the namespace

template <class F>
grpc::Status guard(F&& f) {
  try {
    return f();
  } catch (const NotFoundError& e) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, e.what());
  } catch (const UserError& e) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, e.what());
  } catch (const StateError& e) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, e.what());
  } catch (const std::exception& e) {
    return grpc::Status(grpc::StatusCode::INTERNAL, e.what());
  }
}

}  // namespace

// --- the service ---------------------------------------------------------------------------------

class ParameterServiceImpl final : public pb::ParameterServerService::Service {
 public:
  ParameterServiceImpl(OptimizerPtr optimizer, int task_index)
      : optimizer_(std::move(optimizer)), task_index_(task_index) {}

  grpc::Status CreateVariables(grpc::ServerContext*, const pb::CreateVariablesRequest* q,
                               pb::CreateVariablesResponse* r) override {
    return guard([&] {
      // Decode everything first: a bad entry creates nothing.
      std::vector<std::pair<std::string, at::Tensor>> fresh;
      std::set<std::string> seen;
      for (const auto& v : q->variables()) {
        if (v.path().empty()) throw ValueError("CreateVariables: a variable has an empty path");
        if (!seen.insert(v.path()).second)
          throw ValueError("CreateVariables: the path " + text_excerpt(v.path()) + " appears twice");
        fresh.emplace_back(v.path(), wire::tensor_of(v.value(), "CreateVariables: variable " + text_excerpt(v.path())));
      }
      std::lock_guard<std::mutex> l(mu_);
      for (auto& [path, value] : fresh) {
        auto it = vars_.find(path);
        if (it == vars_.end()) continue;
        const Variable& have = *it->second.var;
        if (have.dtype() != value.scalar_type() || have.shape() != sizes_of(value))
          throw ValueError("CreateVariables: variable " + text_excerpt(path) + " exists as " +
                           dtype_to_string(have.dtype()) + " " + shape_to_string(have.shape()) +
                           "; the request asks for " + dtype_to_string(value.scalar_type()) + " " +
                           shape_to_string(sizes_of(value)) + " (two models in one job share a path?)");
      }
      for (auto& [path, value] : fresh) {
        if (vars_.count(path)) {
          r->add_existing(path);
          continue;
        }
        vars_[path] = Slot{std::make_shared<Variable>(path, value, /*trainable=*/true), 0};
        r->add_created(path);
      }
      return grpc::Status::OK;
    });
  }

  grpc::Status Pull(grpc::ServerContext*, const pb::PullRequest* q, pb::PullResponse* r) override {
    return guard([&] {
      std::lock_guard<std::mutex> l(mu_);
      auto add = [&](const std::string& path, const Slot& s) {
        pb::VariableValue* v = r->add_variables();
        v->set_path(path);
        v->set_version(s.version);
        wire::fill(v->mutable_value(), s.var->value());
        bytes_pulled_ += static_cast<int64_t>(v->value().data().size());
      };
      if (q->paths().empty())
        for (auto& [path, s] : vars_) add(path, s);
      for (const auto& path : q->paths()) add(path, find(path, "Pull"));
      return grpc::Status::OK;
    });
  }

  grpc::Status PushGradients(grpc::ServerContext*, const pb::PushGradientsRequest* q,
                             pb::PushGradientsResponse* r) override {
    return guard([&] {
      std::vector<at::Tensor> grads;
      std::set<std::string> seen;
      for (const auto& g : q->gradients()) {
        if (!seen.insert(g.path()).second)
          throw ValueError("PushGradients: the path " + text_excerpt(g.path()) + " appears twice");
        grads.push_back(wire::tensor_of(g.gradient(), "PushGradients: gradient of " + text_excerpt(g.path())));
      }
      std::vector<at::Tensor> assigned;
      for (const auto& a : q->assign())
        assigned.push_back(wire::tensor_of(a.value(), "PushGradients: value of " + text_excerpt(a.path())));
      if (q->sync() && q->replicas_to_aggregate() < 1)
        throw ValueError("PushGradients: a synchronous push needs replicas_to_aggregate >= 1. Received: " +
                         std::to_string(q->replicas_to_aggregate()));
      std::lock_guard<std::mutex> l(mu_);
      for (const auto& g : q->gradients()) bytes_pushed_ += static_cast<int64_t>(g.gradient().data().size());
      for (const auto& a : q->assign()) bytes_pushed_ += static_cast<int64_t>(a.value().data().size());
      if (q->request_id() != 0) {  // a retry of an applied push: the same answer, no second update
        auto it = last_push_.find(q->worker());
        if (it != last_push_.end() && it->second.first == q->request_id()) {
          *r = it->second.second;
          return grpc::Status::OK;
        }
      }
      std::vector<Slot*> slots;
      std::vector<int64_t> staleness;
      for (int i = 0; i < q->gradients_size(); ++i) {
        const auto& g = q->gradients(i);
        Slot& s = find(g.path(), "PushGradients");
        if (g.pulled_version() > s.version || g.pulled_version() < 0)
          throw StateError("PushGradients: the gradient of " + text_excerpt(g.path()) + " was computed from version " +
                           std::to_string(g.pulled_version()) + ", but ps " + std::to_string(task_index_) +
                           " holds version " + std::to_string(s.version) +
                           " (did this ps task restart and lose its variables?); pull again");
        if (!at::isFloatingType(grads[i].scalar_type()))
          throw ValueError("PushGradients: the gradient of " + text_excerpt(g.path()) + " is " +
                           dtype_to_string(grads[i].scalar_type()) + "; gradients must be floating point");
        if (sizes_of(grads[i]) != s.var->shape())
          throw ShapeError("PushGradients: the gradient of " + text_excerpt(g.path()) + " has shape " +
                           shape_to_string(sizes_of(grads[i])) + "; the variable's is " +
                           shape_to_string(s.var->shape()));
        grads[i] = grads[i].to(s.var->dtype());
        slots.push_back(&s);
        staleness.push_back(s.version - g.pulled_version());
      }
      std::vector<Slot*> assign_slots;
      for (int i = 0; i < q->assign_size(); ++i) {
        Slot& s = find(q->assign(i).path(), "PushGradients");
        if (sizes_of(assigned[i]) != s.var->shape())
          throw ShapeError("PushGradients: the value of " + text_excerpt(q->assign(i).path()) + " has shape " +
                           shape_to_string(sizes_of(assigned[i])) + "; the variable's is " +
                           shape_to_string(s.var->shape()));
        assign_slots.push_back(&s);
      }
      if (q->sync() && q->sync_step() > sync_step_)
        throw StateError("PushGradients: a push for step " + std::to_string(q->sync_step()) + " reached ps " +
                         std::to_string(task_index_) + ", which is at step " + std::to_string(sync_step_) +
                         " (it restarted without its checkpoint?)");
      {
        at::NoGradGuard ng;
        for (size_t i = 0; i < assign_slots.size(); ++i) {
          assign_slots[i]->var->value().copy_(assigned[i]);
          ++assign_slots[i]->version;
        }
      }
      const bool dropped = q->sync() && q->sync_step() < sync_step_;
      if (!dropped && (q->sync() || !slots.empty())) {  // a synchronous push counts even without gradients here
        if (!q->sync()) {
          std::vector<VariablePtr> vars;
          for (Slot* s : slots) vars.push_back(s->var);
          optimizer_->apply_gradients(grads, vars);
          for (Slot* s : slots) ++s->version;
        } else {
          for (size_t i = 0; i < slots.size(); ++i) {
            auto& acc = accumulated_[q->gradients(i).path()];
            acc.sum = acc.sum.defined() ? acc.sum.add_(grads[i]) : grads[i].clone();
            ++acc.count;
          }
          if (++sync_pushes_ >= q->replicas_to_aggregate()) apply_accumulated();
        }
        ++pushes_;
      }
      for (size_t i = 0; i < slots.size(); ++i) {
        r->add_staleness(staleness[i]);
        r->add_version(slots[i]->version);
        if (!dropped) max_staleness_ = std::max(max_staleness_, staleness[i]);
      }
      r->set_dropped(dropped);
      r->set_sync_step(sync_step_);
      if (q->request_id() != 0) last_push_[q->worker()] = {q->request_id(), *r};
      return grpc::Status::OK;
    });
  }

  grpc::Status GetState(grpc::ServerContext*, const pb::GetStateRequest*, pb::PsState* r) override {
    return guard([&] {
      std::lock_guard<std::mutex> l(mu_);
      for (auto& [path, s] : vars_) {
        pb::VariableValue* v = r->add_variables();
        v->set_path(path);
        v->set_version(s.version);
        wire::fill(v->mutable_value(), s.var->value());
      }
      for (auto& [name, t] : optimizer_->state_dict()) {
        pb::NamedTensor* n = r->add_optimizer_state();
        n->set_name(name);
        wire::fill(n->mutable_value(), t);
      }
      r->set_sync_step(sync_step_);
      return grpc::Status::OK;
    });
  }

  grpc::Status SetState(grpc::ServerContext*, const pb::PsState* q, pb::SetStateResponse*) override {
    return guard([&] {
      std::map<std::string, Slot> vars;
      for (const auto& v : q->variables()) {
        if (v.path().empty()) throw ValueError("SetState: a variable has an empty path");
        at::Tensor value = wire::tensor_of(v.value(), "SetState: variable " + text_excerpt(v.path()));
        if (!vars.emplace(v.path(), Slot{std::make_shared<Variable>(v.path(), value, true), v.version()}).second)
          throw ValueError("SetState: the path " + text_excerpt(v.path()) + " appears twice");
      }
      std::map<std::string, at::Tensor> state;
      for (const auto& n : q->optimizer_state())
        state[n.name()] = wire::tensor_of(n.value(), "SetState: optimizer state " + text_excerpt(n.name()));
      std::lock_guard<std::mutex> l(mu_);
      optimizer_->load_state_dict(state);
      vars_ = std::move(vars);
      sync_step_ = q->sync_step();
      accumulated_.clear();
      sync_pushes_ = 0;
      last_push_.clear();
      return grpc::Status::OK;
    });
  }

  grpc::Status Shutdown(grpc::ServerContext*, const pb::ShutdownRequest*, pb::ShutdownResponse*) override {
    if (on_shutdown_) on_shutdown_();
    return grpc::Status::OK;
  }

  grpc::Status GetStatus(grpc::ServerContext*, const pb::GetStatusRequest*, pb::GetStatusResponse* r) override {
    return guard([&] {
      r->set_state(stopping_ ? "STOPPING" : "SERVING");
      r->set_task_index(task_index_);
      std::lock_guard<std::mutex> l(mu_);
      r->set_num_variables(static_cast<int64_t>(vars_.size()));
      r->set_pushes_applied(pushes_);
      r->set_max_staleness(max_staleness_);
      r->set_optimizer_json(optimizer_->to_json().dump());
      r->set_optimizer_iterations(optimizer_->iterations());
      r->set_incarnation(incarnation_);
      r->set_sync_step(sync_step_);
      r->set_bytes_pulled(bytes_pulled_);
      r->set_bytes_pushed(bytes_pushed_);
      return grpc::Status::OK;
    });
  }

  std::map<std::string, at::Tensor> values() const {
    std::lock_guard<std::mutex> l(mu_);
    std::map<std::string, at::Tensor> out;
    for (auto& [path, s] : vars_) out[path] = s.var->value().detach().clone();
    return out;
  }
  std::map<std::string, int64_t> versions() const {
    std::lock_guard<std::mutex> l(mu_);
    std::map<std::string, int64_t> out;
    for (auto& [path, s] : vars_) out[path] = s.version;
    return out;
  }
  void set_stopping() { stopping_ = true; }
  void set_on_shutdown(std::function<void()> f) { on_shutdown_ = std::move(f); }
  uint64_t incarnation() const { return incarnation_; }
  int64_t sync_step() const {
    std::lock_guard<std::mutex> l(mu_);
    return sync_step_;
  }

 private:
  struct Slot {
    VariablePtr var;
    int64_t version = 0;
  };
  // mu_ held.
  Slot& find(const std::string& path, const char* rpc) {
    auto it = vars_.find(path);
    if (it == vars_.end())
      throw NotFoundError(std::string(rpc) + ": ps " + std::to_string(task_index_) + " holds no variable " +
                          text_excerpt(path) + " (create it first, or check that every task places variables alike)");
    return it->second;
  }

  struct Accumulated {
    at::Tensor sum;
    int64_t count = 0;
  };
  // mu_ held: the mean of each variable's accumulated gradients as one
  // optimizer step, then the next synchronous step.
  void apply_accumulated() {
    std::vector<at::Tensor> grads;
    std::vector<VariablePtr> vars;
    for (auto& [path, acc] : accumulated_) {
      Slot& s = vars_.at(path);
      grads.push_back(acc.sum.div_(static_cast<double>(acc.count)));
      vars.push_back(s.var);
    }
    if (!vars.empty()) optimizer_->apply_gradients(grads, vars);
    for (auto& [path, acc] : accumulated_) ++vars_.at(path).version;
    accumulated_.clear();
    sync_pushes_ = 0;
    ++sync_step_;
  }

  OptimizerPtr optimizer_;
  const int task_index_;
  const uint64_t incarnation_ = random_id();
  std::function<void()> on_shutdown_;
  int64_t sync_step_ = 0;
  int64_t sync_pushes_ = 0;
  int64_t bytes_pulled_ = 0, bytes_pushed_ = 0;
  std::map<std::string, Accumulated> accumulated_;
  // Per worker: its last push's request id and answer (retries).
  std::map<std::string, std::pair<uint64_t, pb::PushGradientsResponse>> last_push_;
  std::atomic<bool> stopping_{false};
  mutable std::mutex mu_;  // guards vars_, pushes_, max_staleness_ and every optimizer_ call
  std::map<std::string, Slot> vars_;
  int64_t pushes_ = 0;
  int64_t max_staleness_ = 0;
};

// --- the task ------------------------------------------------------------------------------------

void ParameterServerOptions::validate() const {
  const auto colon = address.rfind(':');
  if (address.empty() || colon == std::string::npos || colon + 1 == address.size())
    throw ValueError("ParameterServer: `address` must be HOST:PORT (port 0 picks a free one). Received: address=" +
                     text_excerpt(address));
  if (task_index < 0)
    throw ValueError("ParameterServer: `task_index` must be >= 0. Received: task_index=" + std::to_string(task_index));
  Optimizer::from_json(optimizer);  // ValueError for an unknown optimizer or bad config
}

ParameterServerOptions ps_task_options(const distribute::PsClusterSpec& spec, Json optimizer) {
  if (!spec.is_ps())
    throw ValueError("ps_task_options: this task is " + spec.task_type + " " + std::to_string(spec.task_index) +
                     ", not a ps task; only the tasks of TF_CONFIG's cluster.ps serve variables");
  const std::string& own = spec.address();
  return {.address = "0.0.0.0:" + own.substr(own.rfind(':') + 1),
          .optimizer = std::move(optimizer),
          .task_index = spec.task_index};
}

ParameterServer::ParameterServer(ParameterServerOptions options) : options_(std::move(options)) {
  options_.validate();
  service_ = std::make_unique<ParameterServiceImpl>(Optimizer::from_json(options_.optimizer), options_.task_index);
  grpc::ServerBuilder b;
  b.AddListeningPort(options_.address, grpc::InsecureServerCredentials(), &port_);
  // Variables and gradients travel whole: no message size limit.
  b.SetMaxReceiveMessageSize(INT32_MAX);
  b.SetMaxSendMessageSize(INT32_MAX);
  service_->set_on_shutdown([this] {
    std::lock_guard<std::mutex> l(mu_);
    shutdown_requested_ = true;
    stopped_.notify_all();
  });
  b.RegisterService(service_.get());
  server_ = b.BuildAndStart();
  if (!server_ || port_ == 0) {
    server_.reset();
    throw IOError("ParameterServer: cannot listen on " + options_.address + " (in use, or not a local address)");
  }
}

ParameterServer::~ParameterServer() { shutdown(); }

std::string ParameterServer::target() const {
  return options_.address.substr(0, options_.address.rfind(':')) + ":" + std::to_string(port_);
}

ParameterServer::State ParameterServer::state() const {
  std::lock_guard<std::mutex> l(mu_);
  return state_;
}

void ParameterServer::shutdown() {
  std::unique_ptr<grpc::Server> server;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (state_ != State::kServing) return;
    state_ = State::kStopping;
    server = std::move(server_);
  }
  service_->set_stopping();
  if (server) {
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server->Wait();
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    state_ = State::kStopped;
  }
  stopped_.notify_all();
}

void ParameterServer::wait() {
  {
    std::unique_lock<std::mutex> l(mu_);
    stopped_.wait(l, [&] { return state_ == State::kStopped || shutdown_requested_; });
    if (state_ == State::kStopped) return;
  }
  shutdown();  // asked for by a Shutdown call
  std::unique_lock<std::mutex> l(mu_);
  stopped_.wait(l, [&] { return state_ == State::kStopped; });
}

uint64_t ParameterServer::incarnation() const { return service_->incarnation(); }
int64_t ParameterServer::sync_step() const { return service_->sync_step(); }

std::map<std::string, at::Tensor> ParameterServer::values() const { return service_->values(); }
std::map<std::string, int64_t> ParameterServer::versions() const { return service_->versions(); }

std::string state_name(ParameterServer::State s) {
  switch (s) {
    case ParameterServer::State::kServing:
      return "SERVING";
    case ParameterServer::State::kStopping:
      return "STOPPING";
    case ParameterServer::State::kStopped:
      return "STOPPED";
  }
  return "UNKNOWN";
}

}  // namespace kiln::ps
