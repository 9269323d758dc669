#include "kiln/ps/ps_strategy.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cmath>
#include <exception>
#include <iomanip>
#include <iostream>
#include <random>
#include <thread>

#include "kiln/core/config_keys.h"
#include "kiln/core/error.h"
#include "kiln/core/json_limits.h"
#include "kiln/distribute/partitioner.h"
#include "kiln/metrics/metric.h"
#include "kiln/models/model.h"
#include "kiln/optimizers/optimizer.h"
#include "kiln/ps/parameter_server.grpc.pb.h"
#include "kiln/ps/parameter_server.h"
#include "kiln/ps/ps_client.h"
#include "kiln/ps/wire.h"
#include "kiln/training/callback.h"
#include "kiln/training/data_adapter.h"
#include "kiln/training/train_state.h"

namespace kiln::ps {
namespace {

namespace pb = ::kiln::ps;
using namespace std::chrono_literals;

std::string port_of(const std::string& address) { return address.substr(address.rfind(':') + 1); }

std::unique_ptr<distribute::Partitioner> make_partitioner(const Json& cfg) {
  if (cfg.is_null()) return nullptr;
  if (!cfg.is_object() || !cfg.contains("type"))
    throw ValueError(
        "spec: distribution `partitioner` must be an object with a \"type\" (\"min_size\", \"max_size\" "
        "or \"fixed\"). Received: " +
        text_excerpt(cfg.dump()));
  const std::string type = get_or<std::string>(cfg, "type", "");
  if (type == "min_size") {
    check_config_keys(cfg, {"type", "min_shard_bytes", "max_shards"}, "distribution.partitioner");
    distribute::MinSizePartitionerOptions o;
    o.min_shard_bytes = get_or<int64_t>(cfg, "min_shard_bytes", o.min_shard_bytes);
    o.max_shards = get_or<int64_t>(cfg, "max_shards", o.max_shards);
    return std::make_unique<distribute::MinSizePartitioner>(o);
  }
  if (type == "max_size") {
    check_config_keys(cfg, {"type", "max_shard_bytes", "max_shards"}, "distribution.partitioner");
    distribute::MaxSizePartitionerOptions o;
    o.max_shard_bytes = get_or<int64_t>(cfg, "max_shard_bytes", o.max_shard_bytes);
    o.max_shards = get_or<int64_t>(cfg, "max_shards", o.max_shards);
    return std::make_unique<distribute::MaxSizePartitioner>(o);
  }
  if (type == "fixed") {
    check_config_keys(cfg, {"type", "num_shards"}, "distribution.partitioner");
    distribute::FixedShardsPartitionerOptions o;
    o.num_shards = get_or<int64_t>(cfg, "num_shards", o.num_shards);
    return std::make_unique<distribute::FixedShardsPartitioner>(o);
  }
  throw ValueError("spec: distribution partitioner `type` must be \"min_size\", \"max_size\" or \"fixed\". Received: " +
                   text_excerpt(cfg["type"].dump()));
}

// What lives on the ps tasks: every floating-point weight of the model.
std::vector<VariablePtr> ps_variables(models::Model& model) {
  std::vector<VariablePtr> out;
  for (auto& v : model.weights())
    if (at::isFloatingType(v->dtype())) out.push_back(v);
  return out;
}

std::vector<distribute::PlacedVariable> place(models::Model& model, int num_ps, const Json& partitioner) {
  std::vector<distribute::VariableToPlace> vars;
  for (auto& v : ps_variables(model)) vars.push_back({v->path(), v->shape(), v->dtype()});
  auto p = make_partitioner(partitioner);
  return distribute::place_variables(vars, num_ps, p.get());
}

void assign_values(models::Model& model, const std::map<std::string, at::Tensor>& values) {
  at::NoGradGuard ng;
  for (auto& v : ps_variables(model)) {
    auto it = values.find(v->path());
    if (it != values.end()) v->value().copy_(it->second);
  }
}

// Builds the model with a one-row probe (the variables must exist to be
// placed); returns the training data of this task as an adapter.
// `shard`: (num_shards, index) for a worker's share.
std::unique_ptr<DataAdapter> training_data(models::Model& model, const FitArgs& a,
                                           std::optional<std::pair<int, int>> shard,
                                           std::optional<EvaluateArgs>* validation) {
  if (validation) {
    if (a.validation_dataset) {
      EvaluateArgs ev;
      ev.dataset = a.validation_dataset;
      *validation = ev;
    } else if (!a.validation_x.empty()) {
      if (a.validation_y.empty()) throw ValueError("fit: validation_x was given without validation_y");
      EvaluateArgs ev;
      ev.x = a.validation_x;
      ev.y = a.validation_y;
      *validation = ev;
    }
  }
  if (a.dataset) {
    if (!a.x.empty() || !a.y.empty()) throw ValueError("fit: pass either x/y tensors or a dataset, not both");
    data::Dataset ds = shard ? a.dataset->shard(shard->first, shard->second) : *a.dataset;
    auto probe = make_dataset_adapter(ds, model.num_inputs(), 0);
    const size_t n_out = build_with_probe(model, probe->sample_inputs(), /*force_probe=*/true);
    return make_dataset_adapter(ds, model.num_inputs(), n_out, a.class_weight);
  }
  if (a.x.empty()) throw ValueError("fit: no training data; pass x and y tensors or a dataset");
  if (a.y.empty()) throw ValueError("fit: no targets; pass y (one tensor per model output)");
  make_tensor_adapter(a.x, a.y, a.sample_weight, a.batch_size, false);  // checks lengths
  Tensors x = a.x, y = a.y;
  at::Tensor sw = a.sample_weight;
  if (a.validation_split > 0) {
    ValidationSplit v = split_validation(x, y, sw, a.validation_split);
    if (validation) {
      if (*validation) throw ValueError("fit: pass either validation_split or validation data, not both");
      EvaluateArgs ev;
      ev.x = v.val_x;
      ev.y = v.val_y;
      ev.sample_weight = v.val_sample_weight;
      *validation = ev;
    }
    x = std::move(v.x);
    y = std::move(v.y);
    sw = v.sample_weight;
  }
  if (shard) {  // every num_shards-th example from index
    const int64_t n = x[0].size(0);
    if (n < shard->first)
      throw ValueError("fit: " + std::to_string(n) + " training examples cannot be shared by " +
                       std::to_string(shard->first) + " workers; give every worker at least one");
    at::Tensor rows = at::arange(shard->second, n, shard->first, at::kLong);
    for (auto& t : x) t = t.index_select(0, rows);
    for (auto& t : y) t = t.index_select(0, rows);
    if (sw.defined()) sw = sw.index_select(0, rows);
  }
  auto adapter = make_tensor_adapter(x, y, sw, a.batch_size, a.shuffle, a.class_weight);
  build_with_probe(model, adapter->sample_inputs(), /*force_probe=*/false);
  return adapter;
}

std::map<std::string, at::Tensor> metric_state(TrainState& ts) {
  std::map<std::string, at::Tensor> out;
  auto metrics = ts.all_metrics();
  for (size_t i = 0; i < metrics.size(); ++i) {
    auto vars = metrics[i]->variables();
    for (size_t j = 0; j < vars.size(); ++j) out[std::to_string(i) + "/" + std::to_string(j)] = vars[j].clone();
  }
  return out;
}

void add_metric_state(TrainState& ts, const std::map<std::string, at::Tensor>& state, bool replace) {
  auto metrics = ts.all_metrics();
  at::NoGradGuard ng;
  for (size_t i = 0; i < metrics.size(); ++i) {
    auto vars = metrics[i]->variables();
    for (size_t j = 0; j < vars.size(); ++j) {
      auto it = state.find(std::to_string(i) + "/" + std::to_string(j));
      if (it == state.end() || !it->second.sizes().equals(vars[j].sizes())) continue;
      if (replace)
        vars[j].copy_(it->second);
      else
        vars[j].add_(it->second.to(vars[j].device(), vars[j].scalar_type()));
    }
  }
}

template <class Rpc>
grpc::Status call_with_deadline(std::chrono::milliseconds deadline, Rpc&& rpc) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  return rpc(ctx);
}

}  // namespace

// --- options -------------------------------------------------------------------------------------

void ParameterServerStrategyOptions::validate() const {
  if (mode != "async" && mode != "sync")
    throw ValueError("parameter_server: `mode` must be \"async\" or \"sync\". Received: mode=" + text_excerpt(mode));
  if (backup_workers < 0)
    throw ValueError("parameter_server: `backup_workers` must be >= 0. Received: " + std::to_string(backup_workers));
  if (backup_workers > 0 && mode != "sync")
    throw ValueError(
        "parameter_server: `backup_workers` applies to mode \"sync\" only (async never waits for "
        "stragglers); set \"mode\": \"sync\" or drop backup_workers");
  if (!(worker_timeout_seconds > 0))
    throw ValueError("parameter_server: `worker_timeout_seconds` must be positive. Received: " +
                     std::to_string(worker_timeout_seconds));
  if (!(ps_timeout_seconds > 0))
    throw ValueError("parameter_server: `ps_timeout_seconds` must be positive. Received: " +
                     std::to_string(ps_timeout_seconds));
  if (checkpoint_steps < 0)
    throw ValueError("parameter_server: `checkpoint_steps` must be >= 0 (0: at epoch ends). Received: " +
                     std::to_string(checkpoint_steps));
  make_partitioner(partitioner);
}

ParameterServerStrategy::ParameterServerStrategy(ParameterServerStrategyOptions options)
    : options_(std::move(options)) {
  options_.validate();
  cluster_ = options_.cluster ? *options_.cluster : distribute::resolve_ps_cluster();
  if (cluster_.chief.empty())
    throw ValueError(
        "parameter_server: TF_CONFIG's cluster has no \"chief\"; the chief coordinates the workers, so "
        "add one (\"chief\": [\"host:port\"])");
  if (cluster_.worker.empty())
    throw ValueError("parameter_server: TF_CONFIG's cluster has no \"worker\" tasks; add at least one");
  if (options_.mode == "sync" && options_.backup_workers >= cluster_.num_workers())
    throw ValueError("parameter_server: backup_workers=" + std::to_string(options_.backup_workers) + " leaves no " +
                     "gradient to aggregate with " + std::to_string(cluster_.num_workers()) +
                     " workers; use fewer backup workers than workers");
}

int ParameterServerStrategy::process_index() const {
  if (cluster_.is_chief()) return 0;
  if (cluster_.is_worker()) return 1 + cluster_.task_index;
  if (cluster_.is_ps()) return 1 + cluster_.num_workers() + cluster_.task_index;
  return 1 + cluster_.num_workers() + cluster_.num_ps() + cluster_.task_index;
}

History ParameterServerStrategy::run_fit(models::Model& model, const FitArgs& a) {
  if (cluster_.is_ps()) {
    serve(model.train_state().optimizer());
    return {};
  }
  if (cluster_.is_worker()) {
    run_worker(model, a);
    return {};
  }
  if (cluster_.is_evaluator())
    throw ValueError(
        "parameter_server: this task is the evaluator; it does not train. Run `kiln evaluate` on the "
        "chief's saved models instead");
  return run_chief(model, a);
}

// --- ps --------------------------------------------------------------------------------------------

void ParameterServerStrategy::serve(const Optimizer& optimizer) {
  ParameterServer server(ps_task_options(cluster_, optimizer.to_json()));
  std::cout << "Parameter servers: ps " << cluster_.task_index << " serving on port " << server.port() << std::endl;
  server.wait();
}

// --- worker ----------------------------------------------------------------------------------------

void ParameterServerStrategy::run_worker(models::Model& model, const FitArgs& a) {
  TrainState& ts = model.train_state();
  const std::string name = "worker:" + std::to_string(cluster_.task_index);
  auto data = training_data(model, a, std::make_pair(cluster_.num_workers(), cluster_.task_index), nullptr);
  ParameterServerClient client(place(model, cluster_.num_ps(), options_.partitioner),
                               {.ps_addresses = cluster_.ps,
                                .worker_name = name,
                                .connect_timeout_seconds = std::min(5.0, options_.ps_timeout_seconds)});
  const uint64_t incarnation = random_id();
  auto channel =
      grpc::CreateCustomChannel(cluster_.chief[0], grpc::InsecureChannelCredentials(), job_channel_arguments());
  auto stub = pb::CoordinatorService::NewStub(channel);

  std::atomic<bool> stop{false};
  std::thread heartbeat([&] {
    std::mutex m;
    std::condition_variable cv;
    while (!stop) {
      pb::HeartbeatRequest q;
      q.set_worker(name);
      q.set_incarnation(incarnation);
      pb::HeartbeatResponse r;
      (void)call_with_deadline(1000ms, [&](grpc::ClientContext& c) { return stub->Heartbeat(&c, q, &r); });
      std::unique_lock<std::mutex> l(m);
      cv.wait_for(l, 500ms, [&] { return stop.load(); });
    }
  });
  struct Stop {
    std::atomic<bool>& stop;
    std::thread& t;
    ~Stop() {
      stop = true;
      t.join();
    }
  } stop_heartbeat{stop, heartbeat};

  // The train step pushes instead of applying: the ps tasks apply.
  std::vector<VariablePtr> non_trainable;
  for (auto& v : ps_variables(model))
    if (!v->trainable()) non_trainable.push_back(v);
  PushOptions push;
  PushResult pushed;
  StepPipeline saved = ts.pipeline();
  struct Restore {
    TrainState& ts;
    StepPipeline p;
    ~Restore() { ts.pipeline() = p; }
  } restore{ts, saved};
  ts.pipeline().apply_gradients = [&](TrainState&, StepData& s) {
    std::map<std::string, at::Tensor> grads;
    for (size_t i = 0; i < s.variables.size() && i < s.grads.size(); ++i)
      if (s.grads[i].defined()) grads[s.variables[i]->path()] = s.grads[i];
    push.assign.clear();
    for (auto& v : non_trainable) push.assign[v->path()] = v->value();
    pushed = s.apply_update ? client.push_gradients(grads, push) : PushResult{.dropped = true};
  };

  const auto deadline_for_chief = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::duration<double>(std::max(60.0, 3 * options_.worker_timeout_seconds)));
  // One call to the chief, retried while it cannot be reached (it may be starting).
  auto ask = [&](const std::function<grpc::Status(grpc::ClientContext&, pb::WorkResponse*)>& rpc) {
    const auto until = std::chrono::steady_clock::now() + deadline_for_chief;
    while (true) {
      pb::WorkResponse r;
      grpc::Status s = call_with_deadline(30s, [&](grpc::ClientContext& c) { return rpc(c, &r); });
      if (s.ok()) return r;
      if (std::chrono::steady_clock::now() > until)
        throw IOError("parameter-server " + name + ": the chief at " + cluster_.chief[0] + " did not answer for " +
                      std::to_string(deadline_for_chief.count() / 1000) + " s (" + s.error_message() +
                      "); is it running?");
      std::this_thread::sleep_for(200ms);  // back off before asking again
    }
  };
  auto get_work = [&] {
    pb::GetWorkRequest q;
    q.set_worker(name);
    q.set_incarnation(incarnation);
    return ask([&](grpc::ClientContext& c, pb::WorkResponse* r) { return stub->GetWork(&c, q, r); });
  };
  pb::WorkResponse work = get_work();
  int epoch = 0;
  int64_t ran = 0, failed = 0;
  auto it = data->begin_epoch(epoch);
  std::vector<VariablePtr> variables = model.trainable_weights();
  while (work.kind() != pb::WorkResponse::DONE) {
    if (work.kind() == pb::WorkResponse::WAIT) {
      work = get_work();
      continue;
    }
    pb::ReportStepRequest report;
    report.set_worker(name);
    report.set_incarnation(incarnation);
    report.set_step_id(work.step_id());
    try {
      assign_values(model, client.pull());
      auto batch = it->next();
      if (!batch) {  // this worker's share is used up: its next pass
        it = data->begin_epoch(++epoch);
        batch = it->next();
        if (!batch) throw ValueError("parameter-server " + name + ": its share of the training data is empty");
      }
      push.sync = work.sync();
      push.sync_step = work.sync_step();
      push.replicas_to_aggregate = work.replicas_to_aggregate();
      ts.reset_metrics();
      StepData s;
      s.model = &model;
      s.x = std::move(batch->x);
      s.y = std::move(batch->y);
      s.sample_weight = batch->sample_weight;
      s.variables = variables;
      ts.train_step(s);
      if (variables.empty()) variables = s.variables;
      report.set_ok(true);
      ++ran;
      report.set_dropped(pushed.dropped);
      report.set_max_staleness(pushed.max_staleness);
      for (auto& [k, v] : metric_state(ts)) {
        pb::NamedTensor* n = report.add_metric_state();
        n->set_name(k);
        wire::fill(n->mutable_value(), v);
      }
    } catch (const Error& e) {  // a ps task is down or restarting: the chief schedules the step again
      report.set_ok(false);
      ++failed;
      report.set_error(e.what());
      std::this_thread::sleep_for(100ms);  // do not spin while the chief restores
    }
    work = ask([&](grpc::ClientContext& c, pb::WorkResponse* r) { return stub->ReportStep(&c, report, r); });
  }
  std::cout << "Parameter servers: " << name << " ran " << ran << " steps (" << failed << " failed) over " << epoch + 1
            << " pass" << (epoch ? "es" : "") << " of its data" << std::endl;
}

// --- chief -----------------------------------------------------------------------------------------

History ParameterServerStrategy::run_chief(models::Model& model, const FitArgs& a) {
  TrainState& ts = model.train_state();
  std::optional<EvaluateArgs> val;
  auto data = training_data(model, a, std::nullopt, &val);
  const bool sync = options_.mode == "sync";
  const int aggregate = sync ? cluster_.num_workers() - options_.backup_workers : 1;
  const int64_t card = data->num_batches();
  if (card == kInfiniteCardinality && a.steps_per_epoch <= 0)
    throw ValueError("fit: the dataset is infinite; pass steps_per_epoch to say how many steps make an epoch");
  int64_t steps = a.steps_per_epoch;
  if (steps <= 0) {
    if (card < 0)
      throw ValueError(
          "fit: parameter-server training needs to know an epoch's steps; pass steps_per_epoch "
          "(the dataset's length is unknown)");
    steps = std::max<int64_t>(1, (card + aggregate - 1) / aggregate);
  }

  const auto placement = place(model, cluster_.num_ps(), options_.partitioner);
  ParameterServerClient client(
      placement,
      {.ps_addresses = cluster_.ps, .worker_name = "chief", .connect_timeout_seconds = options_.ps_timeout_seconds});
  // A separate client with short deadlines watches the ps tasks.
  ParameterServerClient watch(
      placement,
      {.ps_addresses = cluster_.ps, .worker_name = "chief", .connect_timeout_seconds = 0.5, .rpc_timeout_seconds = 2});
  std::map<std::string, at::Tensor> initial;
  for (auto& v : ps_variables(model)) initial[v->path()] = v->value().detach();
  client.create_variables(initial);  // a restarted chief finds them there and keeps them
  std::vector<uint64_t> incarnations;
  for (auto& s : client.status()) incarnations.push_back(s.incarnation);

  SchedulerOptions so{.num_workers = cluster_.num_workers(),
                      .sync = sync,
                      .replicas_to_aggregate = aggregate,
                      .worker_timeout_seconds = options_.worker_timeout_seconds};
  Coordinator coordinator("0.0.0.0:" + port_of(cluster_.chief[0]), so);
  // The first steps wait for every worker (each loads its data first), so
  // no early one takes all of them; after a minute, those there start.
  const int joined = coordinator.wait_workers_joined(60s);
  if (joined < cluster_.num_workers())
    std::cout << "Parameter servers: " << joined << " of " << cluster_.num_workers()
              << " workers called in within 60 s; starting with them" << std::endl;
  std::cout << "Parameter servers: " << options_.mode << " training, " << cluster_.num_workers() << " workers, "
            << cluster_.num_ps() << " ps, " << steps << " steps per epoch"
            << (sync ? ", " + std::to_string(aggregate) + " gradients per step" : std::string()) << std::endl;

  struct Checkpoint {
    int epoch = 0;
    int64_t batch = 0;
    int64_t sync_step = 0;
    std::vector<PsTaskState> ps;
    std::map<std::string, at::Tensor> metrics;
  } checkpoint;
  auto take_checkpoint = [&](int epoch, int64_t batch) {
    checkpoint = {epoch, batch, coordinator.sync_step(), client.get_state(), metric_state(ts)};
    ++stats_.checkpoints;
  };
  const int verbose = a.verbose < 0 ? 2 : a.verbose;
  callbacks::CallbackList cbs(a.callbacks, /*add_history=*/true, verbose != 0, &model,
                              fit_params_json(verbose, a.epochs, steps, val.has_value()));
  FitProgress& prog = ts.progress();
  prog = FitProgress();
  prog.in_fit = true;
  prog.steps_per_epoch = steps;
  prog.callbacks = &cbs;
  model.stop_training = false;

  // A ps task that does not answer, or answers as a new process, lost its
  // variables: true.
  auto ps_lost = [&]() -> std::string {
    try {
      auto st = watch.status();
      for (size_t t = 0; t < st.size(); ++t)
        if (st[t].incarnation != incarnations[t]) return "ps " + std::to_string(t) + " restarted";
    } catch (const Error& e) {
      return e.what();
    }
    return {};
  };
  // Back to the last checkpoint on every ps task, once all of them answer.
  auto restore = [&](const std::string& why, int64_t& batch) {
    coordinator.pause();
    std::cout << "Parameter servers: " << why << "; restoring the checkpoint of epoch " << checkpoint.epoch + 1
              << ", step " << checkpoint.batch << std::endl;
    const auto until =
        std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::milliseconds>(
                                               std::chrono::duration<double>(options_.ps_timeout_seconds));
    while (true) {
      try {
        auto st = watch.status();
        incarnations.clear();
        for (auto& s : st) incarnations.push_back(s.incarnation);
        break;
      } catch (const Error& e) {
        if (std::chrono::steady_clock::now() > until)
          throw IOError("parameter-server training: a ps task did not come back within ps_timeout_seconds=" +
                        std::to_string(options_.ps_timeout_seconds) + " (" + e.what() +
                        "); restart it (kiln launch restarts it for you) or raise ps_timeout_seconds");
        (void)coordinator.wait_events(200ms);  // keeps the workers' liveness current meanwhile
      }
    }
    client.set_state(checkpoint.ps);
    add_metric_state(ts, checkpoint.metrics, /*replace=*/true);
    batch = checkpoint.batch;  // checkpoints are taken in the running epoch (at its start at the latest)
    ++stats_.ps_restores;
    coordinator.start(steps - batch, checkpoint.sync_step);
  };

  // Workers heartbeat twice a second: this long without any means none is left.
  const double no_worker_limit = std::max(120.0, 6 * options_.worker_timeout_seconds);
  // On failure the ps tasks are told to stop too (those that can be reached).
  struct ShutdownOnError {
    ParameterServerClient& client;
    int uncaught = std::uncaught_exceptions();
    ~ShutdownOnError() {
      if (std::uncaught_exceptions() > uncaught) client.shutdown_servers();
    }
  } shutdown_on_error{client};
  Logs epoch_logs;
  const auto train_start = std::chrono::steady_clock::now();
  for (int epoch = a.initial_epoch; epoch < a.epochs; ++epoch) {
    int64_t b = 0;
    ts.reset_metrics();
    prog.epoch = epoch;
    prog.batch = 0;
    take_checkpoint(epoch, 0);
    cbs.on_epoch_begin(epoch, {});
    coordinator.start(steps, coordinator.sync_step());
    auto next_watch = std::chrono::steady_clock::now();
    while (!coordinator.run_done()) {
      for (auto& e : coordinator.wait_events(200ms)) {
        if (!e.metric_state.empty()) add_metric_state(ts, e.metric_state, false);
        if (!e.completed) continue;
        cbs.on_train_batch_begin(b, {});
        prog.batch = ++b;
        cbs.on_train_batch_end(b - 1, ts.results());
      }
      if (model.stop_training) break;
      if (options_.checkpoint_steps > 0 && b >= checkpoint.batch + options_.checkpoint_steps &&
          !coordinator.run_done()) {
        coordinator.pause();  // the steps in flight are forgotten (and done again): a consistent state
        take_checkpoint(epoch, b);
        coordinator.start(steps - b, coordinator.sync_step());
      }
      if (std::chrono::steady_clock::now() >= next_watch) {
        next_watch = std::chrono::steady_clock::now() + 500ms;
        if (std::string why = ps_lost(); !why.empty()) restore(why, b);
        if (const double silent = coordinator.seconds_without_workers(); silent > no_worker_limit)
          throw IOError("parameter-server training: no worker has called in for " + std::to_string((int)silent) +
                        " s (all lost?); restart the workers (kiln launch --max_restarts does), then the chief");
      }
    }
    assign_values(model, client.pull());
    epoch_logs = ts.results();
    if (val && (epoch + 1) % a.validation_freq == 0) {
      EvaluateArgs ev = *val;  // with the weights just pulled
      ev.batch_size = a.batch_size;
      ev.steps = a.validation_steps;
      for (auto& [k, v] : model.evaluate(ev)) epoch_logs["val_" + k] = v;
    }
    cbs.on_epoch_end(epoch, epoch_logs);
    if (model.stop_training) break;
  }
  stats_.train_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - train_start).count();
  coordinator.finish();
  coordinator.wait_workers_done(std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::duration<double>(options_.worker_timeout_seconds + 2)));
  stats_.scheduler = coordinator.stats();
  assign_values(model, client.pull());
  {
    // Worker steps since the ps tasks started (the chief's own pulls are few).
    const auto& sc = stats_.scheduler;
    const double worker_steps = static_cast<double>(
        std::max<int64_t>(1, (sync ? sc.steps_done * aggregate + sc.dropped : sc.steps_done) + sc.failed));
    double pulled = 0, pushed = 0;
    try {
      for (auto& st : watch.status()) {
        pulled += st.bytes_pulled;
        pushed += st.bytes_pushed;
      }
    } catch (const Error&) {  // figures only
    }
    stats_.bytes_pulled_per_step = pulled / worker_steps;
    stats_.bytes_pushed_per_step = pushed / worker_steps;
    stats_.worker_steps = static_cast<int64_t>(worker_steps);
  }
  client.shutdown_servers();
  const auto& s = stats_.scheduler;
  std::cout << "Parameter servers: " << options_.mode << ", " << cluster_.num_workers() << " workers, "
            << cluster_.num_ps() << " ps: " << s.steps_done << " steps, " << s.rescheduled << " rescheduled, "
            << s.workers_lost << " worker" << (s.workers_lost == 1 ? "" : "s") << " lost (" << s.worker_restarts
            << " restart" << (s.worker_restarts == 1 ? "" : "s") << "), " << stats_.ps_restores << " ps restore"
            << (stats_.ps_restores == 1 ? "" : "s") << ", " << s.failed << " failed, " << s.dropped
            << " dropped, max staleness " << s.max_staleness << std::endl;
  std::cout << "Parameter servers: per worker step: " << std::fixed << std::setprecision(1)
            << stats_.bytes_pulled_per_step / 1024 << " KB pulled, " << stats_.bytes_pushed_per_step / 1024
            << " KB pushed; " << stats_.worker_steps << " worker steps in " << stats_.train_seconds << " s"
            << std::defaultfloat << std::endl;
  prog.in_fit = false;
  prog.callbacks = nullptr;
  cbs.on_train_end(epoch_logs);
  return cbs.history()->history();
}

// --- spec ------------------------------------------------------------------------------------------

std::shared_ptr<ParameterServerStrategy> parameter_server_from_config(const Json& cfg) {
  check_config_keys(cfg,
                    {"type", "mode", "backup_workers", "partitioner", "worker_timeout_seconds", "ps_timeout_seconds",
                     "checkpoint_steps"},
                    "distribution");
  ParameterServerStrategyOptions o;
  o.mode = get_or<std::string>(cfg, "mode", o.mode);
  o.backup_workers = get_or<int>(cfg, "backup_workers", o.backup_workers);
  o.partitioner = cfg.value("partitioner", Json());
  o.worker_timeout_seconds = get_or<double>(cfg, "worker_timeout_seconds", o.worker_timeout_seconds);
  o.ps_timeout_seconds = get_or<double>(cfg, "ps_timeout_seconds", o.ps_timeout_seconds);
  o.checkpoint_steps = get_or<int64_t>(cfg, "checkpoint_steps", o.checkpoint_steps);
  return std::make_shared<ParameterServerStrategy>(o);
}

}  // namespace kiln::ps
