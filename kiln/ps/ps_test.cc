// Parameter-server tasks on loopback: two in-process ps servers, clients
// from several threads, the optimizer's result checked against one process.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <iostream>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/random.h"
#include "kiln/distribute/partitioner.h"
#include "kiln/layers/dense.h"
#include "kiln/models/sequential.h"
#include "kiln/optimizers/optimizer.h"
#include "kiln/ps/parameter_server.grpc.pb.h"
#include "kiln/ps/parameter_server.h"
#include "kiln/ps/ps_client.h"
#include "kiln/ps/tensor_bytes.h"
#include "kiln/ps/wire.h"
#include "kiln/testing/expect_error.h"

namespace kiln {
namespace {

using ps::ParameterServer;
using ps::ParameterServerClient;

// A small model's variables: dense (5, 16) + (16), dense_1 (16, 3) + (3).
std::vector<VariablePtr> model_variables() {
  auto m = models::Sequential(
      std::vector<LayerPtr>{layers::Dense({.units = 16, .activation = "relu"}), layers::Dense({.units = 3})}, "small");
  m->build({{kNone, 5}});
  return m->weights();
}

std::vector<distribute::VariableToPlace> to_place(const std::vector<VariablePtr>& vars) {
  std::vector<distribute::VariableToPlace> out;
  for (auto& v : vars) out.push_back({v->path(), v->shape(), v->dtype()});
  return out;
}

// Values whose SGD sums are exact in float32 in any order: multiples of 1/8.
at::Tensor dyadic(const Shape& shape, int64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(-8, 9, shape, gen, at::kFloat) / 8;
}

struct TwoPs {
  explicit TwoPs(const Json& optimizer) {
    for (int i = 0; i < 2; ++i)
      servers.push_back(std::make_unique<ParameterServer>(
          ps::ParameterServerOptions{.address = "127.0.0.1:0", .optimizer = optimizer, .task_index = i}));
  }
  std::vector<std::string> addresses() const {
    std::vector<std::string> out;
    for (auto& s : servers) out.push_back(s->target());
    return out;
  }
  std::vector<std::unique_ptr<ParameterServer>> servers;
};

// Every call bounded: a hung ps fails the test in seconds.
ps::PsClientOptions options(std::vector<std::string> addresses, std::string name = "worker") {
  return {.ps_addresses = std::move(addresses),
          .worker_name = std::move(name),
          .connect_timeout_seconds = 5,
          .rpc_timeout_seconds = 20};
}

Json sgd(double lr) { return Json{{"class_name", "SGD"}, {"config", {{"learning_rate", lr}}}}; }

TEST(ParameterServer, TensorBytesRoundTrip) {
  for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kLong, at::kInt}) {
    at::Tensor t = (at::randn({3, 4}) * 10).to(dtype);
    at::Tensor back = ps::tensor_from_bytes(dtype_to_string(dtype), {3, 4}, ps::tensor_bytes(t), "t");
    EXPECT_TRUE(at::equal(t, back)) << dtype_to_string(dtype);
  }
  at::Tensor strided = at::arange(12, at::kFloat).reshape({3, 4}).t();  // not contiguous
  EXPECT_TRUE(at::equal(strided, ps::tensor_from_bytes("float32", {4, 3}, ps::tensor_bytes(strided), "t")));
  at::Tensor scalar = at::scalar_tensor(2.5, at::kDouble);
  EXPECT_TRUE(at::equal(scalar, ps::tensor_from_bytes("float64", {}, ps::tensor_bytes(scalar), "t")));
  expect_error<ValueError>([] { ps::tensor_from_bytes("float32", {2}, std::string(7, '\0'), "grad of x"); },
                           {"grad of x", "8 bytes", "Received: 7"});
  expect_error<ValueError>([] { ps::tensor_from_bytes("float99", {2}, "", "grad of x"); }, {"grad of x", "float99"});
  expect_error<ValueError>([] { ps::tensor_from_bytes("float32", {-1}, "", "x"); }, {"negative"});
}

TEST(ParameterServer, AsyncSgdFromThreeWorkersEqualsOneProcess) {
  const auto vars = model_variables();
  // 64-byte minimum, 2 shards at most: both kernels split over the 2 ps, the
  // biases whole.
  distribute::MinSizePartitioner partitioner({.min_shard_bytes = 64, .max_shards = 2});
  const auto placement = distribute::place_variables(to_place(vars), 2, &partitioner);
  ASSERT_TRUE(placement[0].sharded());
  ASSERT_FALSE(placement[3].sharded());

  TwoPs cluster(sgd(0.25));
  std::map<std::string, at::Tensor> init;
  for (size_t i = 0; i < vars.size(); ++i) init[vars[i]->path()] = dyadic(vars[i]->shape(), 100 + i);
  {
    ParameterServerClient chief(placement, options(cluster.addresses(), "chief"));
    EXPECT_EQ(chief.create_variables(init), 6);  // 2 + 1 + 2 + 1 stored variables
  }

  constexpr int kWorkers = 3, kSteps = 8;
  auto gradient = [&](int worker, int step, size_t var) {
    return dyadic(vars[var]->shape(), 1000 * worker + 10 * step + static_cast<int64_t>(var)) / 2;
  };
  std::vector<int64_t> max_staleness(kWorkers, 0);
  std::vector<std::string> errors(kWorkers);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w)
    threads.emplace_back([&, w] {
      try {
        ParameterServerClient client(placement, options(cluster.addresses(), "worker:" + std::to_string(w)));
        for (int step = 0; step < kSteps; ++step) {
          auto values = client.pull();
          std::map<std::string, at::Tensor> grads;
          for (size_t i = 0; i < vars.size(); ++i) {
            ASSERT_EQ(sizes_of(values.at(vars[i]->path())), vars[i]->shape());
            grads[vars[i]->path()] = gradient(w, step, i);
          }
          auto r = client.push_gradients(grads);
          EXPECT_EQ(r.staleness.size(), 6u);
          for (auto& [path, s] : r.staleness) EXPECT_GE(s, 0) << path;
          max_staleness[w] = std::max(max_staleness[w], r.max_staleness);
        }
      } catch (const std::exception& e) {
        errors[w] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors) EXPECT_EQ(e, "");

  // One process: the same optimizer, every gradient applied in turn (plain
  // SGD sums the updates, and the values make every sum exact).
  std::vector<VariablePtr> local;
  for (auto& v : vars) local.push_back(std::make_shared<Variable>(v->path(), init[v->path()].clone(), true));
  auto opt = Optimizer::from_json(sgd(0.25));
  for (int w = 0; w < kWorkers; ++w)
    for (int step = 0; step < kSteps; ++step) {
      std::vector<at::Tensor> grads;
      for (size_t i = 0; i < vars.size(); ++i) grads.push_back(gradient(w, step, i));
      opt->apply_gradients(grads, local);
    }
  ParameterServerClient reader(placement, options(cluster.addresses()));
  auto final_values = reader.pull();
  for (auto& v : local)
    EXPECT_TRUE(at::equal(final_values.at(v->path()), v->value().detach())) << v->path() << "\n"
                                                                            << final_values.at(v->path()) << "\n"
                                                                            << v->value();
  for (auto& [path, version] : reader.pulled_versions()) EXPECT_EQ(version, kWorkers * kSteps) << path;

  auto status = reader.status();
  ASSERT_EQ(status.size(), 2u);
  int64_t seen = *std::max_element(max_staleness.begin(), max_staleness.end());
  int64_t reported = 0;
  for (int t = 0; t < 2; ++t) {
    EXPECT_EQ(status[t].task_index, t);
    EXPECT_EQ(status[t].state, "SERVING");
    EXPECT_EQ(status[t].num_variables, 3);  // a shard of each kernel and one bias
    EXPECT_EQ(status[t].pushes_applied, kWorkers * kSteps);
    EXPECT_EQ(status[t].optimizer_iterations, kWorkers * kSteps);
    EXPECT_NE(status[t].optimizer_json.find("\"SGD\""), std::string::npos) << status[t].optimizer_json;
    reported = std::max(reported, status[t].max_staleness);
  }
  EXPECT_EQ(reported, seen);
  EXPECT_LE(seen, kWorkers * kSteps);
  std::cout << "largest staleness seen: " << seen << "\n";
}

TEST(ParameterServer, StalenessIsVersionsSincePull) {
  TwoPs cluster(sgd(0.5));
  const auto placement = distribute::place_variables({{"w", {4}}, {"b", {2}}}, 2);
  ParameterServerClient a(placement, options(cluster.addresses(), "a"));
  ParameterServerClient b(placement, options(cluster.addresses(), "b"));
  a.create_variables({{"w", at::ones({4})}, {"b", at::zeros({2})}});
  std::map<std::string, at::Tensor> g = {{"w", at::ones({4})}, {"b", at::ones({2})}};
  a.pull();
  b.pull();
  EXPECT_EQ(b.push_gradients(g).max_staleness, 0);  // fresh
  EXPECT_EQ(b.push_gradients(g).max_staleness, 1);  // one update since b's pull
  auto r = a.push_gradients(g);                     // two updates since a's pull
  EXPECT_EQ(r.max_staleness, 2);
  EXPECT_EQ(r.staleness.at("w"), 2);
  EXPECT_EQ(r.staleness.at("b"), 2);
  // Only "w" pushed: only ps 0 steps.
  a.pull();
  EXPECT_EQ(a.push_gradients({{"w", at::ones({4})}}).staleness.size(), 1u);
  auto v = a.pull();
  EXPECT_TRUE(at::allclose(v.at("w"), at::full({4}, 1 - 4 * 0.5)));
  EXPECT_TRUE(at::allclose(v.at("b"), at::full({2}, -3 * 0.5)));
  EXPECT_EQ(a.pulled_versions().at("w"), 4);
  EXPECT_EQ(a.pulled_versions().at("b"), 3);
  EXPECT_EQ(a.status()[0].max_staleness, 2);
}

// Adam on two ps tasks against one process, the worker computing on
// `worker`: its variables, gradients and the values it pulls back into its
// variables live there (a GPU worker's too); the ps tasks keep theirs on
// the CPU.
void adam_on_two_ps_matches_one_process(const at::Device& worker) {
  const auto vars = model_variables();
  distribute::MinSizePartitioner partitioner({.min_shard_bytes = 64, .max_shards = 2});
  const auto placement = distribute::place_variables(to_place(vars), 2, &partitioner);
  const Json adam = Json{{"class_name", "Adam"}, {"config", {{"learning_rate", 0.01}}}};
  TwoPs cluster(adam);
  ParameterServerClient client(placement, options(cluster.addresses()));
  std::map<std::string, at::Tensor> init;
  std::vector<VariablePtr> local, on_worker;
  for (auto& v : vars) {
    init[v->path()] = v->value().detach().to(worker);
    local.push_back(std::make_shared<Variable>(v->path(), v->value().detach().clone(), true));
    on_worker.push_back(std::make_shared<Variable>(v->path(), v->value().detach().to(worker), true));
  }
  client.create_variables(init);
  auto opt = Optimizer::from_json(adam);
  set_random_seed(3);
  for (int step = 0; step < 5; ++step) {
    auto pulled = client.pull();
    {
      at::NoGradGuard ng;
      for (auto& v : on_worker) v->value().copy_(pulled.at(v->path()));  // as the worker's strategy assigns them
    }
    std::map<std::string, at::Tensor> grads;
    std::vector<at::Tensor> local_grads;
    for (auto& v : vars) {
      at::Tensor g = at::randn(v->shape());
      grads[v->path()] = g.to(worker);
      local_grads.push_back(g);
    }
    EXPECT_EQ(client.push_gradients(grads).max_staleness, 0);
    opt->apply_gradients(local_grads, local);
  }
  auto values = client.pull();
  for (auto& v : local) {
    EXPECT_TRUE(values.at(v->path()).device().is_cpu());
    EXPECT_TRUE(at::allclose(values.at(v->path()), v->value().detach(), 1e-6, 1e-7)) << v->path();
  }
  for (auto& v : on_worker) EXPECT_EQ(v->value().device(), worker) << v->path();
}

TEST(ParameterServer, AdamOnTwoPsMatchesOneProcess) { adam_on_two_ps_matches_one_process(at::Device(at::kCPU)); }

TEST(ParameterServerCUDA, AWorkerOnTheGpuTrainsAgainstPsTasksOnTheCpu) {
  adam_on_two_ps_matches_one_process(at::Device(at::kCUDA, 0));
}

TEST(ParameterServer, CreateIsIdempotentAndErrorsAreClear) {
  TwoPs cluster(sgd(1.0));
  const auto placement = distribute::place_variables({{"w", {2, 2}}, {"b", {2}}}, 2);
  ParameterServerClient c(placement, options(cluster.addresses()));
  EXPECT_EQ(c.create_variables({{"w", at::ones({2, 2})}, {"b", at::zeros({2})}}), 2);
  c.pull();
  c.push_gradients({{"w", at::ones({2, 2})}});
  // Again (a restarted worker): nothing created, the values stay.
  EXPECT_EQ(c.create_variables({{"w", at::full({2, 2}, 7.0)}, {"b", at::zeros({2})}}), 0);
  EXPECT_TRUE(at::equal(c.pull().at("w"), at::zeros({2, 2})));
  EXPECT_EQ(cluster.servers[0]->versions().at("w"), 1);
  EXPECT_TRUE(at::equal(cluster.servers[0]->values().at("w"), at::zeros({2, 2})));

  // Another shape under the same path.
  ParameterServerClient other(distribute::place_variables({{"w", {3}}}, 1), options({cluster.servers[0]->target()}));
  expect_error<ValueError>(
      [&] {
        other.create_variables({{"w", at::ones({3})}});
      },
      {"'w'", "float32 (2, 2)", "(3,)", "ps 0"});
  // A variable no ps holds.
  ParameterServerClient stray(distribute::place_variables({{"nowhere", {1}}}, 1),
                              options({cluster.servers[0]->target()}));
  expect_error<NotFoundError>([&] { stray.pull(); }, {"'nowhere'", "create it first"});
  expect_error<NotFoundError>([&] { stray.push_gradients({{"nowhere", at::ones({1})}}); }, {"'nowhere'"});
  // Client-side checks.
  expect_error<ShapeError>([&] { c.push_gradients({{"w", at::ones({3})}}); }, {"'w'", "(3,)", "(2, 2)"});
  expect_error<ValueError>([&] { c.pull({"nope"}); }, {"'nope'"});
  expect_error<ValueError>([&] { c.create_variables({{"w", at::ones({2, 2})}}); }, {"no initial value", "'b'"});
  expect_error<ValueError>([&] { c.push_gradients({{"w", at::ones({2, 2}, at::kLong)}}); }, {"floating point"});
  expect_error<ValueError>([&] { ParameterServerClient({}, {.ps_addresses = {}}); }, {"ps_addresses"});
  expect_error<ValueError>(
      [&] {
        ParameterServerClient(distribute::place_variables({{"x", {1}}, {"y", {1}}}, 2),
                              {.ps_addresses = {"127.0.0.1:1"}});
      },
      {"'y'", "ps 1", "1 ps tasks"});
  expect_error<ValueError>([] { ParameterServer({.address = "nohost"}); }, {"HOST:PORT", "'nohost'"});
  expect_error<ValueError>([] { ParameterServer({.optimizer = "sgdd"}); }, {"sgdd"});

  // Lifecycle: shutdown is final and idempotent; a stopped ps is unreachable.
  const std::string gone = cluster.servers[1]->target();
  EXPECT_EQ(cluster.servers[1]->state(), ParameterServer::State::kServing);
  cluster.servers[1]->shutdown();
  EXPECT_EQ(cluster.servers[1]->state(), ParameterServer::State::kStopped);
  cluster.servers[1]->shutdown();
  cluster.servers[1]->wait();  // returns at once once stopped
  EXPECT_EQ(ps::state_name(ParameterServer::State::kStopping), "STOPPING");
  ParameterServerClient late(distribute::place_variables({{"b", {2}}}, 1),
                             {.ps_addresses = {gone}, .connect_timeout_seconds = 0.3});
  const auto start = std::chrono::steady_clock::now();
  expect_error<IOError>([&] { late.pull(); }, {"ps 0", gone.c_str(), "cannot reach"});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(ParameterServer, TaskOptionsFromTheCluster) {
  distribute::PsClusterSpec spec;
  spec.worker = {"h1:2222"};
  spec.ps = {"h2:2222", "h3:2300"};
  spec.task_type = "ps";
  spec.task_index = 1;
  auto o = ps::ps_task_options(spec, "adam");
  EXPECT_EQ(o.address, "0.0.0.0:2300");
  EXPECT_EQ(o.task_index, 1);
  EXPECT_EQ(o.optimizer, Json("adam"));
  spec.task_type = "worker";
  spec.task_index = 0;
  expect_error<ValueError>([&] { ps::ps_task_options(spec, "sgd"); }, {"worker 0", "not a ps task"});
}

// --- synchronous steps, retries, checkpoints, shutdown ----------------------------------------------

TEST(ParameterServer, SyncStepAveragesTheFirstNPushesAndDropsTheStragglers) {
  TwoPs cluster(sgd(1.0));
  const auto placement = distribute::place_variables({{"w", {2}}, {"b", {1}}}, 2);  // w on ps 0, b on ps 1
  ParameterServerClient a(placement, options(cluster.addresses(), "worker:0"));
  ParameterServerClient b(placement, options(cluster.addresses(), "worker:1"));
  ParameterServerClient c(placement, options(cluster.addresses(), "worker:2"));
  a.create_variables({{"w", at::zeros({2})}, {"b", at::zeros({1})}});
  for (auto* w : {&a, &b, &c}) w->pull();
  const ps::PushOptions step0{.sync = true, .sync_step = 0, .replicas_to_aggregate = 2};
  // The first push of step 0 is held, not applied.
  EXPECT_FALSE(a.push_gradients({{"w", at::tensor({1.0f, 0.0f})}, {"b", at::tensor({4.0f})}}, step0).dropped);
  EXPECT_TRUE(at::equal(c.pull().at("w"), at::zeros({2})));
  EXPECT_EQ(cluster.servers[0]->sync_step(), 0);
  // A push with no gradient for ps 1 still counts there: every task takes part in each step.
  EXPECT_FALSE(b.push_gradients({{"w", at::tensor({3.0f, 2.0f})}}, step0).dropped);
  auto v = c.pull();
  EXPECT_TRUE(at::equal(v.at("w"), at::tensor({-2.0f, -1.0f})));  // the mean of the two, lr 1
  EXPECT_TRUE(at::equal(v.at("b"), at::tensor({-4.0f})));         // b's only gradient, over its one push
  EXPECT_EQ(cluster.servers[0]->sync_step(), 1);
  EXPECT_EQ(cluster.servers[1]->sync_step(), 1);
  // The third worker of step 0 is a straggler: dropped, nothing changes.
  auto late = c.push_gradients({{"w", at::tensor({100.0f, 100.0f})}, {"b", at::tensor({100.0f})}}, step0);
  EXPECT_TRUE(late.dropped);
  EXPECT_TRUE(at::equal(a.pull().at("w"), at::tensor({-2.0f, -1.0f})));
  EXPECT_EQ(a.status()[0].sync_step, 1);
  // A push for a step the task has not reached: it lost its state.
  expect_error<StateError>(
      [&] {
        a.push_gradients({{"w", at::ones({2})}}, {.sync = true, .sync_step = 5, .replicas_to_aggregate = 2});
      },
      {"step 5", "ps 0", "at step 1"});
}

TEST(ParameterServer, ARetriedPushIsAnsweredAgainAndNotAppliedTwice) {
  TwoPs cluster(sgd(1.0));
  ParameterServerClient client(distribute::place_variables({{"w", {2}}}, 1), options({cluster.addresses()[0]}));
  client.create_variables({{"w", at::zeros({2})}});
  auto stub = ps::ParameterServerService::NewStub(
      grpc::CreateChannel(cluster.addresses()[0], grpc::InsecureChannelCredentials()));
  ps::PushGradientsRequest q;
  q.set_worker("worker:0");
  q.set_request_id(7);
  auto* g = q.add_gradients();
  g->set_path("w");
  ps::wire::fill(g->mutable_gradient(), at::ones({2}));
  std::vector<int64_t> versions;
  for (int attempt = 0; attempt < 2; ++attempt) {  // the second is a retry after a lost answer
    grpc::ClientContext ctx;
    ps::PushGradientsResponse r;
    ASSERT_TRUE(stub->PushGradients(&ctx, q, &r).ok());
    versions.push_back(r.version(0));
  }
  EXPECT_EQ(versions, (std::vector<int64_t>{1, 1}));
  EXPECT_TRUE(at::equal(client.pull().at("w"), at::full({2}, -1.0f)));  // applied once
  q.set_request_id(8);                                                  // a new push from the same worker is applied
  grpc::ClientContext ctx;
  ps::PushGradientsResponse r;
  ASSERT_TRUE(stub->PushGradients(&ctx, q, &r).ok());
  EXPECT_TRUE(at::equal(client.pull().at("w"), at::full({2}, -2.0f)));
}

TEST(ParameterServer, StateGoesBackIntoARestartedTaskAndTrainingContinuesAlike) {
  const Json adam = Json{{"class_name", "Adam"}, {"config", {{"learning_rate", 0.1}}}};
  const auto placement = distribute::place_variables({{"w", {3}}, {"b", {2}}}, 2);
  TwoPs first(adam);
  ParameterServerClient a(placement, options(first.addresses()));
  a.create_variables({{"w", at::ones({3})}, {"b", at::zeros({2})}});
  const std::map<std::string, at::Tensor> g1 = {{"w", at::tensor({1.0f, -2.0f, 0.5f})}, {"b", at::ones({2})}};
  const std::map<std::string, at::Tensor> g2 = {{"w", at::tensor({-1.0f, 0.25f, 3.0f})}, {"b", at::zeros({2})}};
  a.pull();
  a.push_gradients(g1);
  a.push_gradients({{"w", at::ones({3})}}, {.assign = {{"b", at::full({2}, 7.0f)}}});  // moving statistics
  const auto state = a.get_state();
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state[0].optimizer_state.at("iterations").item<int64_t>(), 2);
  // Fresh tasks (a ps that restarted): the state goes in, and the next push lands alike.
  TwoPs second(adam);
  ParameterServerClient b(placement, options(second.addresses()));
  b.set_state(state);
  EXPECT_EQ(b.status()[1].num_variables, 1);
  a.pull();
  b.pull();
  a.push_gradients(g2);
  b.push_gradients(g2);
  auto va = a.pull(), vb = b.pull();
  for (const char* p : {"w", "b"}) EXPECT_TRUE(at::equal(va.at(p), vb.at(p))) << p;
  EXPECT_EQ(b.pulled_versions(), a.pulled_versions());
  EXPECT_NE(first.servers[0]->incarnation(), second.servers[0]->incarnation());
  EXPECT_EQ(b.status()[0].incarnation, second.servers[0]->incarnation());
}

TEST(ParameterServer, AShutdownCallEndsWait) {
  TwoPs cluster(sgd(0.1));
  ParameterServerClient client(distribute::place_variables({{"w", {1}}}, 2), options(cluster.addresses()));
  std::thread waiter([&] { cluster.servers[1]->wait(); });
  client.shutdown_servers();
  waiter.join();  // returns: the call asked ps 1 to stop
  EXPECT_EQ(cluster.servers[1]->state(), ParameterServer::State::kStopped);
  cluster.servers[0]->wait();
  EXPECT_EQ(cluster.servers[0]->state(), ParameterServer::State::kStopped);
}

}  // namespace
}  // namespace kiln
