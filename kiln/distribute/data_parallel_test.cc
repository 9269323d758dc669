// Data parallelism: the cluster resolver, DataParallel in one process, and
// real multi-process jobs (`kiln train` ranks over c10d/Gloo on loopback)
// checked against one process.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <map>
#include <thread>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/core/random.h"
#include "kiln/distribute/cluster.h"
#include "kiln/distribute/collectives.h"
#include "kiln/distribute/data_parallel.h"
#include "kiln/distribute/nccl.h"
#include "kiln/layers/dense.h"
#include "kiln/layers/normalization.h"
#include "kiln/models/sequential.h"
#include "kiln/optimizers/loss_scale_optimizer.h"
#include "kiln/optimizers/optimizer.h"
#include "kiln/saving/safetensors.h"
#include "kiln/testing/expect_error.h"
#include "kiln/testing/testing.h"
#include "kiln/training/callbacks.h"
#include "kiln/training/checkpoint.h"
#include "kiln/training/gradient_sync.h"
#include "kiln/training/train_state.h"

namespace kiln {
namespace {

using distribute::ClusterSpec;
using distribute::resolve_cluster;

distribute::GetEnv env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& k) -> std::optional<std::string> {
    auto it = vars.find(k);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(Cluster, NoVariablesIsOneProcess) {
  ClusterSpec c = resolve_cluster(env_of({}));
  EXPECT_EQ(c.world_size, 1);
  EXPECT_EQ(c.rank, 0);
  EXPECT_EQ(c.source, "none");
}

TEST(Cluster, TorchrunVariablesComeFirst) {
  ClusterSpec c = resolve_cluster(env_of({{"RANK", "3"},
                                          {"WORLD_SIZE", "4"},
                                          {"LOCAL_RANK", "1"},
                                          {"LOCAL_WORLD_SIZE", "2"},
                                          {"MASTER_ADDR", "10.0.0.1"},
                                          {"MASTER_PORT", "29400"},
                                          {"TF_CONFIG", "{not json"},
                                          {"SLURM_PROCID", "0"}}));
  EXPECT_EQ(c.source, "torchrun");
  EXPECT_EQ(c.rank, 3);
  EXPECT_EQ(c.world_size, 4);
  EXPECT_EQ(c.local_rank, 1);
  EXPECT_EQ(c.local_world_size, 2);
  EXPECT_EQ(c.master_addr, "10.0.0.1");
  EXPECT_EQ(c.master_port, 29400);
}

// A TFJob with an Evaluator replica lists it in every task's TF_CONFIG: it
// takes no part (no rank, not counted), and the evaluator task itself is
// told what to run instead.
TEST(Cluster, TfConfigEvaluatorIsNotARank) {
  const std::string cluster = R"({"cluster": {"chief": ["a:1"], "worker": ["b:2"], "evaluator": ["c:3"]},)";
  ClusterSpec w = resolve_cluster(env_of({{"TF_CONFIG", cluster + R"("task": {"type": "worker", "index": 0}})"}}));
  EXPECT_EQ(w.world_size, 2);
  EXPECT_EQ(w.rank, 1);
  EXPECT_EQ(w.master_addr, "a");
  auto msg = error_of<ValueError>([&] {
    resolve_cluster(env_of({{"TF_CONFIG", cluster + R"("task": {"type": "evaluator", "index": 0}})"}}));
  });
  EXPECT_NE(msg.find("evaluator"), std::string::npos) << msg;
  EXPECT_NE(msg.find("kiln evaluate"), std::string::npos) << msg;
}

TEST(Cluster, TfConfigChiefIsRankZero) {
  const std::string cluster =
      R"({"cluster": {"worker": ["hostb:2222", "hosta:2223", "hostb:2224"], "chief": ["hosta:2222"]},)";
  ClusterSpec chief = resolve_cluster(env_of({{"TF_CONFIG", cluster + R"("task": {"type": "chief", "index": 0}})"}}));
  EXPECT_EQ(chief.source, "TF_CONFIG");
  EXPECT_EQ(chief.rank, 0);
  EXPECT_EQ(chief.world_size, 4);
  EXPECT_EQ(chief.master_addr, "hosta");
  EXPECT_EQ(chief.master_port, 2222);
  EXPECT_EQ(chief.local_rank, 0);
  EXPECT_EQ(chief.local_world_size, 2);  // chief and worker 1 on hosta
  ClusterSpec w2 = resolve_cluster(env_of({{"TF_CONFIG", cluster + R"("task": {"type": "worker", "index": 2}})"}}));
  EXPECT_EQ(w2.rank, 3);
  EXPECT_EQ(w2.local_rank, 1);  // worker 0 is before it on hostb
  EXPECT_EQ(w2.local_world_size, 2);
  // Without a chief, worker 0 leads.
  ClusterSpec w = resolve_cluster(
      env_of({{"TF_CONFIG", R"({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}})"}}));
  EXPECT_EQ(w.rank, 1);
  EXPECT_EQ(w.master_addr, "a");
  EXPECT_EQ(w.master_port, 1);
}

TEST(Cluster, SlurmVariables) {
  ClusterSpec c = resolve_cluster(env_of({{"SLURM_PROCID", "5"},
                                          {"SLURM_NTASKS", "8"},
                                          {"SLURM_LOCALID", "1"},
                                          {"SLURM_TASKS_PER_NODE", "4(x2)"},
                                          {"SLURM_JOB_NODELIST", "gpu[07-08,11],login1"}}));
  EXPECT_EQ(c.source, "slurm");
  EXPECT_EQ(c.rank, 5);
  EXPECT_EQ(c.world_size, 8);
  EXPECT_EQ(c.local_rank, 1);
  EXPECT_EQ(c.local_world_size, 4);
  EXPECT_EQ(c.master_addr, "gpu07");
  EXPECT_EQ(c.master_port, 29500);
  EXPECT_EQ(distribute::first_slurm_host("node1,node2"), "node1");
  EXPECT_EQ(distribute::first_slurm_host("rack[3]-n[1-4]"), "rack3-n[1-4]");
}

TEST(Cluster, BadValuesAreOneClearError) {
  expect_error<ValueError>(
      [] {
        resolve_cluster(env_of({{"RANK", "two"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}}));
      },
      {"RANK", "two"});
  expect_error<ValueError>(
      [] {
        resolve_cluster(env_of({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}}));
      },
      {"RANK", "[0, 3]"});
  expect_error<ValueError>(
      [] {
        resolve_cluster(env_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}}));
      },
      {"MASTER_ADDR", "kiln launch"});
  expect_error<ValueError>([] { resolve_cluster(env_of({{"TF_CONFIG", "{oops"}})); }, {"TF_CONFIG"});
  expect_error<ValueError>(
      [] {
        resolve_cluster(
            env_of({{"TF_CONFIG", R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}})"}}));
      },
      {"TF_CONFIG", "not in the cluster"});
  expect_error<ValueError>(
      [] {
        resolve_cluster(env_of({{"TF_CONFIG", R"({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 0}})"}}));
      },
      {"TF_CONFIG", "'ps'"});
}

// --- one process ----------------------------------------------------------------------

std::shared_ptr<models::SequentialImpl> small_model() {
  auto m = models::Sequential(
      std::vector<LayerPtr>{layers::Dense({.units = 16, .activation = "relu"}),
                            layers::BatchNormalization({.synchronized = true}), layers::Dense({.units = 3})},
      "small");
  m->compile(CompileArgs::from_names("adam", "sparse_categorical_crossentropy", {"accuracy"}));
  return m;
}

// One replica (no cluster) under `options`, or no distribution.
std::vector<at::Tensor> train_small(std::optional<distribute::DataParallelOptions> options) {
  if (options) options->cluster = ClusterSpec{};
  set_distribution(options ? std::make_shared<distribute::DataParallel>(*options) : nullptr);
  set_random_seed(7);
  at::Tensor x = at::randn({200, 8});
  at::Tensor y = at::randint(0, 3, {200}, at::kLong);
  auto m = small_model();
  m->fit({.x = {x}, .y = {y}, .batch_size = 32, .epochs = 3, .verbose = 0, .validation_split = 0.2});
  set_distribution(nullptr);
  std::vector<at::Tensor> w;
  for (auto& v : m->weights()) w.push_back(v->value().clone());
  return w;
}

TEST(DataParallel, OneReplicaIsBitIdenticalToNoDistribution) {
  auto plain = train_small(std::nullopt);
  auto dp = train_small(distribute::DataParallelOptions{});
  ASSERT_EQ(plain.size(), dp.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(at::equal(plain[i], dp[i])) << i;
}

TEST(DataParallel, BadOptionsAreClearErrors) {
  // A GPU this machine lacks (none on CI; more than any machine has here).
  auto msg = error_of<ValueError>([] { distribute::DataParallel({.devices = {"cuda:64"}, .cluster = ClusterSpec{}}); });
  EXPECT_NE(msg.find("cuda:64"), std::string::npos) << msg;
  EXPECT_NE(msg.find("use --device"), std::string::npos) << msg;
  msg = error_of<ValueError>([] { distribute::DataParallel({.devices = {"tpu:0"}, .cluster = ClusterSpec{}}); });
  EXPECT_NE(msg.find("tpu:0"), std::string::npos) << msg;
  msg = error_of<ValueError>([] { distribute::distribution_from_config(Json{{"type", "pipeline_parallel"}}); });
  EXPECT_NE(msg.find("data_parallel"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model_parallel"), std::string::npos) << msg;
  msg = error_of<ValueError>([] {
    distribute::distribution_from_config(Json{{"type", "data_parallel"}, {"bucket_mb", 4}});
  });
  EXPECT_NE(msg.find("bucket_mb"), std::string::npos) << msg;
}

TEST(DataParallel, ZeroStageIsZeroOneOrTwo) {
  for (const Json& bad : {Json(3), Json(-1), Json("1"), Json(1.5)}) {
    auto msg = error_of<ValueError>([&] {
      distribute::distribution_from_config(Json{{"type", "data_parallel"}, {"zero_stage", bad}});
    });
    EXPECT_NE(msg.find("zero_stage"), std::string::npos) << msg;
    EXPECT_NE(msg.find("0"), std::string::npos) << msg;
  }
  auto d = distribute::distribution_from_config(Json{{"type", "data_parallel"}, {"zero_stage", 2}});
  EXPECT_EQ(d->gradient_sync().zero_stage, 2);
  EXPECT_EQ(distribute::distribution_from_config(Json{{"type", "data_parallel"}})->gradient_sync().zero_stage, 0);
}

// One replica: zero_stage is accepted and changes nothing.
TEST(DataParallel, ZeroStageOnOneReplicaIsBitIdentical) {
  auto plain = train_small(std::nullopt);
  auto zero = train_small(distribute::DataParallelOptions{.zero_stage = 2});
  ASSERT_EQ(plain.size(), zero.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(at::equal(plain[i], zero[i])) << i;
}

// The gradient buckets, as PyTorch DDP's reducer lays them out: variables
// in reverse order (backward's), a bucket closed when the next variable
// would take it past the cap, a larger variable alone; ZeRO 2: one open
// bucket per owner. Every replica computes the same plan, so the buckets'
// launch order (their index) is the same on all: what NCCL needs.
TEST(DataParallel, GradientBucketsFollowBackwardsOrderAndTheCap) {
  BucketPlan p = plan_gradient_buckets({10, 20, 30, 40}, /*bucket_bytes=*/4 * 50);
  EXPECT_EQ(p.bucket, (std::vector<size_t>{2, 1, 1, 0}));
  EXPECT_EQ(p.offset, (std::vector<int64_t>{0, 30, 0, 0}));
  EXPECT_EQ(p.bucket_numel, (std::vector<int64_t>{40, 50, 10}));
  EXPECT_EQ(p.root, (std::vector<int>{-1, -1, -1}));
  p = plan_gradient_buckets({100, 5}, 4 * 50);
  EXPECT_EQ(p.bucket, (std::vector<size_t>{1, 0}));
  EXPECT_EQ(p.bucket_numel, (std::vector<int64_t>{5, 100})) << "a variable over the cap gets a bucket of its own";
  p = plan_gradient_buckets({10, 20, 30, 40}, int64_t{1} << 30, /*owner=*/{0, 1, 0, 1}, /*world=*/2);
  EXPECT_EQ(p.bucket, (std::vector<size_t>{1, 0, 1, 0}));
  EXPECT_EQ(p.offset, (std::vector<int64_t>{30, 40, 0, 0}));
  EXPECT_EQ(p.bucket_numel, (std::vector<int64_t>{60, 40}));
  EXPECT_EQ(p.root, (std::vector<int>{1, 0}));
}

// NCCL carries a job's GPU tensors when every rank has a GPU of its own;
// otherwise Gloo does (it takes CUDA tensors too).
TEST(Collectives, NcclOnlyWhenEveryRankHasAGpuOfItsOwn) {
  const at::Device cpu(at::kCPU), gpu0(at::kCUDA, 0), gpu1(at::kCUDA, 1);
  using RD = distribute::RankDevice;
  using distribute::choose_collective_backend;
  EXPECT_EQ(choose_collective_backend({RD{"a", gpu0}, RD{"a", gpu1}}, "auto", true), "nccl");
  EXPECT_EQ(choose_collective_backend({RD{"a", gpu0}, RD{"b", gpu0}}, "", true), "nccl") << "two hosts";
  EXPECT_EQ(choose_collective_backend({RD{"a", gpu0}}, "auto", true), "nccl");
  EXPECT_EQ(choose_collective_backend({RD{"a", gpu0}, RD{"a", gpu0}}, "auto", true), "gloo") << "shared GPU";
  EXPECT_EQ(choose_collective_backend({RD{"a", gpu0}, RD{"a", cpu}}, "auto", true), "gloo");
  EXPECT_EQ(choose_collective_backend({RD{"a", cpu}, RD{"a", cpu}}, "auto", true), "gloo");
  EXPECT_EQ(choose_collective_backend({RD{"a", gpu0}, RD{"a", gpu1}}, "auto", false), "gloo") << "no NCCL built";
  EXPECT_EQ(choose_collective_backend({RD{"a", gpu0}, RD{"a", gpu1}}, "gloo", true), "gloo");
  expect_error<ValueError>(
      [&] {
        choose_collective_backend({RD{"a", gpu0}, RD{"a", gpu0}}, "nccl", true);
      },
      {"KILN_COLLECTIVE_BACKEND=nccl cannot run this job: ranks 0 and 1 share cuda:0 on host a",
       "give each rank its own GPU", "or set KILN_COLLECTIVE_BACKEND=gloo"});
  expect_error<ValueError>(
      [&] {
        choose_collective_backend({RD{"a", gpu0}, RD{"a", cpu}}, "nccl", true);
      },
      {"rank 1 computes on cpu, not a GPU"});
  expect_error<ValueError>(
      [&] {
        choose_collective_backend({RD{"a", gpu0}}, "mpi", true);
      },
      {"KILN_COLLECTIVE_BACKEND must be auto, nccl or gloo. Received: mpi"});
}

// One rank on NCCL (the most a one-GPU machine allows): every collective
// kiln uses, on GPU tensors, and CPU tensors still through Gloo.
TEST(CollectivesCUDA, OneRankOnNcclSumsBroadcastsGathersAndReduces) {
  distribute::ClusterSpec c;
  c.master_port = free_loopback_port();
  auto coll = distribute::Collectives::connect(c, {.timeout_seconds = 60, .device = at::Device(at::kCUDA, 0)});
  ASSERT_EQ(coll->gpu_backend(), distribute::nccl_available() ? "nccl" : "gloo");
  const auto on_gpu = at::TensorOptions(at::kFloat).device(at::kCUDA, 0);
  std::vector<at::Tensor> t = {at::arange(6, on_gpu), at::arange(3, at::kLong), at::ones({2}, on_gpu)};
  coll->all_reduce_sum(t);
  EXPECT_TRUE(at::equal(t[0].cpu(), at::arange(6, at::kFloat)));
  EXPECT_TRUE(t[1].device().is_cpu());
  coll->broadcast(t, 0);
  EXPECT_TRUE(at::equal(t[2].cpu(), at::ones({2})));
  at::Tensor flat = at::arange(8, on_gpu);
  coll->all_reduce_sum_async(flat)();
  coll->reduce_sum_async(flat, 0)();
  EXPECT_TRUE(at::equal(flat.cpu(), at::arange(8, at::kFloat)));
  at::Tensor half = at::arange(8, on_gpu).to(at::kBFloat16);
  coll->all_reduce_sum_async(half)();
  EXPECT_TRUE(at::equal(half.cpu().to(at::kFloat), at::arange(8, at::kFloat)));
  auto gathered = coll->all_gather(at::arange(4, on_gpu));
  ASSERT_EQ(gathered.size(), 1u);
  EXPECT_TRUE(gathered[0].is_cuda());
  coll->barrier();
}

// --- several processes ----------------------------------------------------------------

int free_port() { return free_loopback_port(); }

// Starts `PROGRAM ARGS` (PROGRAM: the kiln CLI unless given) with extra
// environment, output to `log`.
pid_t spawn(const std::vector<std::string>& args, const std::map<std::string, std::string>& extra_env,
            const std::string& log, const std::string& program = "") {
  std::vector<std::string> argv = {program.empty() ? cli_path() : program};
  argv.insert(argv.end(), args.begin(), args.end());
  return spawn_logged(argv, log, extra_env);
}

class MultiProcess : public ::testing::Test {
 protected:
  TempDir dir_;
  void SetUp() override { KILN_SKIP_WITHOUT_CLI(); }

  std::string spec(const std::string& name, int epochs, const std::string& base, const Json& extra = Json::object()) {
    Json s = Json::parse(R"({
      "model": {"layers": [{"class_name": "Dense", "config": {"units": 64, "activation": "relu"}},
                           {"class_name": "BatchNormalization", "config": {"synchronized": true}},
                           {"class_name": "Dense", "config": {"units": 10}}],
                "input_shape": [784]},
      "data": {"source": "fashion_mnist", "scale": "1/255", "flatten": true, "limit": 1536, "test_limit": 500},
      "compile": {"optimizer": "adam", "loss": {"class_name": "SparseCategoricalCrossentropy",
                                                "config": {"from_logits": true}},
                  "metrics": ["accuracy"]},
      "fit": {"batch_size": 128, "seed": 3, "verbose": 2, "validation_split": 0.25}
    })");
    s["fit"]["epochs"] = epochs;
    s["output"] = {{"base_dir", base}};
    for (auto& [k, v] : extra.items()) s[k] = v;
    const std::string path = dir_.path() + "/" + name;
    std::ofstream(path) << s.dump(2);
    return path;
  }

  // Runs `kiln train SPEC` as `n` ranks (torchrun's variables, one thread
  // each); returns each rank's output.
  std::vector<std::string> run_ranks(int n, const std::string& spec_path,
                                     std::map<std::string, std::string> extra_env = {}) {
    const double timeout_s = 240;
    const int port = free_port();
    std::vector<pid_t> pids;
    for (int r = 0; r < n; ++r) {
      pids.push_back(spawn({"train", spec_path}, rank_env(r, n, port, extra_env), log(r)));
    }
    std::vector<std::string> out;
    for (int r = 0; r < n; ++r) {
      const int code = wait_bounded(pids[r], timeout_s);
      out.push_back(read_file(log(r)));
      EXPECT_EQ(code, 0) << "rank " << r << ":\n" << out.back();
    }
    return out;
  }
  std::string log(int r) { return dir_.path() + "/rank" + std::to_string(r) + ".log"; }
};

NamedTensors weights_of(const std::string& version_dir) {
  return load_safetensors(version_dir + "/weights.safetensors");
}

double metric_in(const std::string& out, const std::string& name) {
  auto p = out.rfind(name + ": ");
  if (p == std::string::npos) return -1;
  return std::stod(out.substr(p + name.size() + 2));
}

TEST_F(MultiProcess, TwoRanksMatchOneProcessWithTheSameGlobalBatch) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  const std::string one = dir_.path() + "/one", two = dir_.path() + "/two";
  auto single = run_command(cli_path() + " --threads 1 train " + spec("one.json", 3, one));
  ASSERT_EQ(single.exit_code, 0) << single.output;
  auto outs = run_ranks(2, spec("two.json", 3, two));
  ASSERT_EQ(outs.size(), 2u);

  // Only the chief writes and prints.
  ASSERT_TRUE(path_exists(two + "/1/weights.safetensors")) << outs[0];
  EXPECT_FALSE(path_exists(two + "/2"));
  EXPECT_NE(outs[0].find("Saved model to"), std::string::npos) << outs[0];
  EXPECT_EQ(outs[1].find("Saved model"), std::string::npos) << outs[1];
  EXPECT_EQ(outs[1].find("test_accuracy"), std::string::npos) << outs[1];
  EXPECT_EQ(outs[1].find("Epoch"), std::string::npos) << outs[1];

  // Same weights to float tolerance: the reduction order is the only
  // difference (ranks' sums of half-batch gradients, all-reduced).
  auto a = weights_of(one + "/1"), b = weights_of(two + "/1");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].first, b[i].first);
    const double diff = (a[i].second - b[i].second).abs().max().item<double>();
    EXPECT_LT(diff, 1e-4) << a[i].first;
  }
  // Exact metric reduction: the logged test accuracy of 2 ranks is the
  // accuracy of the same weights on the whole test split.
  const double acc1 = metric_in(single.output, "test_accuracy"), acc2 = metric_in(outs[0], "test_accuracy");
  ASSERT_GT(acc1, 0.5) << single.output;
  EXPECT_NEAR(acc1, acc2, 0.0021) << outs[0];
  auto ev = run_command(cli_path() + " --threads 1 evaluate " + two + "/1 --spec " + dir_.path() + "/two.json");
  ASSERT_EQ(ev.exit_code, 0) << ev.output;
  EXPECT_NEAR(metric_in(ev.output, "accuracy"), acc2, 1e-9) << ev.output;
  // And validation: val_accuracy of the last epoch, same weights, whole split.
  EXPECT_NEAR(metric_in(single.output, "val_accuracy"), metric_in(outs[0], "val_accuracy"), 0.0041);

  // The gradients went through shared memory (both ranks on this host);
  // through Gloo instead, the sums (a + b, in rank order) are the same bits.
  const std::string gloo = dir_.path() + "/gloo";
  run_ranks(2, spec("gloo.json", 3, gloo), {{"KILN_SHM_ALLREDUCE", "0"}});
  auto g = weights_of(gloo + "/1");
  ASSERT_EQ(g.size(), b.size());
  for (size_t i = 0; i < g.size(); ++i) EXPECT_TRUE(at::equal(g[i].second, b[i].second)) << g[i].first;
}

// Regression: EarlyStopping's "Restoring model weights ..." came from every
// rank; like the rest of training's output, only the chief prints it (every
// rank still restores the same weights).
TEST_F(MultiProcess, OnlyTheChiefSaysEarlyStoppingRestoredTheWeights) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  const Json callbacks = Json::parse(
      R"([{"class_name": "EarlyStopping", "config": {"monitor": "loss", "restore_best_weights": true, "verbose": 1}}])");
  auto outs = run_ranks(2, spec("restore.json", 1, dir_.path() + "/restore", Json{{"callbacks", callbacks}}));
  ASSERT_EQ(outs.size(), 2u);
  EXPECT_NE(outs[0].find("Restoring model weights"), std::string::npos) << outs[0];
  EXPECT_EQ(outs[1].find("Restoring model weights"), std::string::npos) << outs[1];
}

// Three more ways to train data-parallel, each against one process:
//   - gradient accumulation (the optimizer's gradient_accumulation_steps):
//     the accumulating steps are not synchronized, the applying step sums
//     every rank's accumulators;
//   - auto_shard "off": each rank uses its input as it comes (here the
//     whole data on both ranks), so 2 ranks on identical batches take the
//     steps one process takes.
TEST_F(MultiProcess, GradientAccumulationAndUnsplitInputMatchOneProcess) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  Json accumulate = {
      {"compile", Json::parse(R"({"optimizer": {"class_name": "Adam", "config": {"gradient_accumulation_steps": 3}},
                          "loss": {"class_name": "SparseCategoricalCrossentropy", "config": {"from_logits": true}},
                          "metrics": ["accuracy"]})")}};
  // compress_bf16: gradients travel as bfloat16 (8 bits of mantissa), so
  // the weights agree to a looser tolerance.
  const Json compressed = {{"distribution", {{"type", "data_parallel"}, {"compress_bf16", true}}}};
  for (const Json& extra :
       {accumulate, Json{{"distribution", {{"type", "data_parallel"}, {"auto_shard", "off"}}}}, compressed}) {
    SCOPED_TRACE(extra.dump());
    const double tolerance = extra == compressed ? 2e-2 : 1e-4;
    TempDir out;
    const std::string one = out.path() + "/one", two = out.path() + "/two";
    auto single = run_command(cli_path() + " --threads 1 train " + spec("one.json", 2, one, extra));
    ASSERT_EQ(single.exit_code, 0) << single.output;
    auto outs = run_ranks(2, spec("two.json", 2, two, extra));
    auto a = weights_of(one + "/1"), b = weights_of(two + "/1");
    ASSERT_EQ(a.size(), b.size()) << outs[0];
    for (size_t i = 0; i < a.size(); ++i) {
      const double diff = (a[i].second - b[i].second).abs().max().item<double>();
      EXPECT_LT(diff, tolerance) << a[i].first;
    }
    EXPECT_NEAR(metric_in(single.output, "test_accuracy"), metric_in(outs[0], "test_accuracy"),
                extra == compressed ? 0.03 : 0.0021)
        << outs[0];
  }
}

// --- ranks that are this test binary: inputs no spec can give ---------------------------

// Odd splits: 30 rows, global batch 7 (batches of 7, 7, 7, 7, 2 split 4+3
// and 1+1 over 2 ranks). The weighting of each rank's gradient by its rows
// must make this the same as one process.
std::vector<at::Tensor> train_odd_split() {
  set_random_seed(11);
  at::Tensor x = at::randn({30, 5});
  at::Tensor y = at::randn({30, 2});
  auto m = models::Sequential(
      std::vector<LayerPtr>{layers::Dense({.units = 4, .activation = "tanh"}), layers::Dense({.units = 2})}, "odd");
  m->compile(CompileArgs::from_names("sgd", "mse", {"mae"}));
  auto h = m->fit({.x = {x}, .y = {y}, .batch_size = 7, .epochs = 3, .verbose = 0, .shuffle = true});
  std::vector<at::Tensor> w;
  for (auto& v : m->weights()) w.push_back(v->value().clone());
  w.push_back(at::tensor({h.history.at("loss").back()}, at::kDouble));
  return w;
}

// Uneven per-rank inputs (auto_shard "off"): rank 0 has 5 batches, rank 1
// has 3; both must stop after 3 steps per epoch, not deadlock.
int64_t train_uneven_off() {
  set_random_seed(5);
  const int64_t rows = replica_id() == 0 ? 40 : 24;
  at::Tensor x = at::randn({rows, 3}), y = at::randn({rows, 1});
  auto m = models::Sequential(std::vector<LayerPtr>{layers::Dense({.units = 1})}, "u");
  m->compile(CompileArgs::from_names("sgd", "mse", {}));
  m->fit({.x = {x}, .y = {y}, .batch_size = 8, .epochs = 2, .verbose = 0});
  return m->train_state().optimizer().iterations();
}

// ZeRO: the same training at every zero_stage (KILN_TEST_ZERO_STAGE). Adam
// on an MLP whose variables split about evenly over 2 ranks (576 + 24 + 24
// + 16 against 384 + 384 parameters). "features" adds what needs care:
// LossScaleOptimizer, global_clipnorm (a norm over every owner),
// weight_decay, gradient accumulation, EMA with overwrites, and a
// BackupAndRestore checkpoint resumed by a second fit() (gathered to the
// chief, cut back to the owned slots on restore).
int64_t optimizer_slot_bytes(Optimizer& opt) {
  int64_t n = 0;
  for (auto& [k, t] : opt.state_dict())
    if (k.find("kernel/") != std::string::npos || k.find("bias/") != std::string::npos) n += t.nbytes();
  return n;
}

NamedTensors train_zero(const std::string& variant, const std::string& out) {
  set_random_seed(21);
  at::Tensor x = at::randn({96, 16});
  at::Tensor y = at::randn({96, 16});
  auto m = models::Sequential(
      std::vector<LayerPtr>{layers::Dense({.units = 24, .activation = "relu"}),
                            layers::Dense({.units = 24, .activation = "tanh"}), layers::Dense({.units = 16})},
      "zero");
  OptimizerPtr opt;
  if (variant == "features")
    opt = std::make_shared<LossScaleOptimizer>(
        Optimizer::from_json(Json::parse(R"({"class_name": "Adam", "config": {"learning_rate": 0.01,
            "global_clipnorm": 0.1, "weight_decay": 0.01, "gradient_accumulation_steps": 2, "use_ema": true,
            "ema_overwrite_frequency": 3}})")));
  else
    opt = Optimizer::from_json(Json::parse(R"({"class_name": "Adam", "config": {"learning_rate": 0.01}})"));
  m->compile(CompileArgs{.optimizer = opt, .loss = Loss::get("mse")});
  NamedTensors result;
  int64_t in_fit = -1;
  auto probe = callbacks::LambdaCallback();
  probe->on_epoch_end_fn = [&](int, Logs&) { in_fit = optimizer_slot_bytes(m->train_state().optimizer()); };
  std::vector<CallbackPtr> cbs = {probe};
  if (variant == "features") {
    cbs.push_back(
        callbacks::BackupAndRestore(out + ".backup", callbacks::BackupAndRestoreOptions{.delete_checkpoint = false}));
    // A full model every epoch: the optimizer state is gathered to the chief.
    cbs.push_back(callbacks::ModelCheckpoint(out + ".model", callbacks::ModelCheckpointOptions{.monitor = "loss"}));
  }
  FitArgs fa{.x = {x}, .y = {y}, .batch_size = 16, .epochs = 3, .verbose = 0, .callbacks = cbs};
  auto h = m->fit(fa);
  if (variant == "refit") {
    // Another fit() with the first layer frozen: another partition, so a
    // rank may own a variable whose slots only the chief kept.
    for (auto& v : m->layers()[0]->weights()) v->set_trainable(false);
    fa.epochs = 1;
    h = m->fit(fa);
  }
  if (variant == "features") {
    fa.epochs = 5;  // resumes after epoch 3 from the checkpoint
    h = m->fit(fa);
    auto ckpts = list_training_checkpoints(out + ".backup");
    EXPECT_FALSE(ckpts.empty());
    if (!ckpts.empty())
      for (auto& [k, t] : load_safetensors(ckpts.back() + "/optimizer.safetensors"))
        if (k.find("gradient_accumulator") == std::string::npos) result.emplace_back("ckpt:" + k, t);
    // The ModelCheckpoint of the last epoch (the chief wrote it before fit()
    // ended on every rank).
    if (is_chief())
      for (auto& [k, t] : load_safetensors(out + ".model/optimizer.safetensors"))
        if (k.find("gradient_accumulator") == std::string::npos) result.emplace_back("model:" + k, t);
  }
  for (auto& v : m->weights()) result.emplace_back(v->path(), v->value().clone());
  result.emplace_back("loss", at::tensor({h.history.at("loss").back()}, at::kDouble));
  result.emplace_back("slot_bytes_in_fit", at::tensor({in_fit}, at::kLong));
  result.emplace_back("slot_bytes_after_fit",
                      at::tensor({optimizer_slot_bytes(m->train_state().optimizer())}, at::kLong));
  return result;
}

// Runs only as a rank started by RankJobs.* (KILN_TEST_RANK_JOB names the job).
TEST(RankJob, Run) {
  const char* job = std::getenv("KILN_TEST_RANK_JOB");
  if (!job) GTEST_SKIP() << "runs only as a rank started by RankJobs.*";
  const std::string out = std::getenv("KILN_TEST_OUT");
  const char* zero = std::getenv("KILN_TEST_ZERO_STAGE");
  const char* bf16 = std::getenv("KILN_TEST_COMPRESS_BF16");
  set_distribution(std::make_shared<distribute::DataParallel>(
      distribute::DataParallelOptions{.compress_bf16 = bf16 && std::string(bf16) == "1",
                                      .auto_shard = std::string(job) == "uneven_off" ? "off" : "data",
                                      .zero_stage = zero ? std::atoi(zero) : 0}));
  NamedTensors result;
  if (std::string(job).rfind("zero_", 0) == 0) {
    result = train_zero(std::string(job).substr(5), out);
  } else if (std::string(job) == "odd_split") {
    auto w = train_odd_split();
    for (size_t i = 0; i < w.size(); ++i) result.emplace_back("t" + std::to_string(i), w[i]);
  } else if (std::string(job) == "loss_scale" || std::string(job) == "loss_scale_sharded") {
    // Only rank 1's (unsynchronized) gradient is non-finite: both ranks
    // must skip the step and halve the scale. Sharded (ZeRO 2): rank 1 owns
    // the variable, and rank 0 has no gradient at all but must still agree.
    auto var = std::make_shared<Variable>("w", at::ones({3}), true);
    LossScaleOptimizer opt(Optimizer::get("sgd"), {.initial_scale = 8});
    at::Tensor g = replica_id() == 1 ? at::tensor({INFINITY, 0.0f, 0.0f}) : at::full({3}, 8.0f);
    if (std::string(job) == "loss_scale_sharded") {
      opt.set_ownership([](const std::string&) { return replica_id() == 1; });
      if (replica_id() == 0) g = at::Tensor();
    }
    opt.apply_gradients({g}, {var});
    result.emplace_back("w", var->value().clone());
    result.emplace_back("scale", at::tensor({opt.scale()}, at::kDouble));
    result.emplace_back("iterations", at::tensor({opt.iterations()}, at::kLong));
  } else {
    result.emplace_back("iterations", at::tensor({train_uneven_off()}, at::kLong));
  }
  if (is_chief() || std::string(job) != "odd_split") save_safetensors(out + "." + std::to_string(replica_id()), result);
  set_distribution(nullptr);
}

class RankJobs : public MultiProcess {
 protected:
  void SetUp() override {}  // no CLI needed: the ranks are this binary
  void run_job(const std::string& job, const std::string& out, std::map<std::string, std::string> extra_env = {}) {
    const int port = free_port();
    std::vector<pid_t> pids;
    extra_env.emplace("KILN_TEST_RANK_JOB", job);
    extra_env.emplace("KILN_TEST_OUT", out);
    for (int r = 0; r < 2; ++r) {
      pids.push_back(spawn({"--gtest_filter=RankJob.Run"}, rank_env(r, 2, port, extra_env), log(r), "/proc/self/exe"));
    }
    for (int r = 0; r < 2; ++r) EXPECT_EQ(wait_bounded(pids[r], 120), 0) << read_file(log(r));
  }
};

TEST_F(RankJobs, OddSplitsOfTheGlobalBatchMatchOneProcess) {
  auto single = train_odd_split();
  const std::string out = dir_.path() + "/odd";
  run_job("odd_split", out);
  auto two = load_safetensors(out + ".0");
  ASSERT_EQ(two.size(), single.size());
  for (size_t i = 0; i + 1 < single.size(); ++i)
    EXPECT_LT((single[i] - two[i].second).abs().max().item<double>(), 1e-6) << i;
  // The logged metric is exact over both ranks' rows.
  EXPECT_NEAR(single.back().item<double>(), two.back().second.item<double>(), 1e-6);
}

TEST_F(RankJobs, UnevenPerRankInputsStopTogether) {
  const std::string out = dir_.path() + "/uneven";
  run_job("uneven_off", out);
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(load_safetensors(out + "." + std::to_string(r)).at(0).second.item<int64_t>(), 6) << "rank " << r;
}

TEST_F(RankJobs, LossScaleSkipDecisionIsAgreedAcrossRanks) {
  for (std::string job : {"loss_scale", "loss_scale_sharded"}) {
    const std::string out = dir_.path() + "/" + job;
    run_job(job, out);
    for (int r = 0; r < 2; ++r) {
      auto t = load_safetensors(out + "." + std::to_string(r));
      ASSERT_EQ(t.size(), 3u);
      EXPECT_TRUE(at::equal(t[0].second, at::ones({3}))) << job << " rank " << r << " applied a step the other skipped";
      EXPECT_EQ(t[1].second.item<double>(), 4.0) << job << " rank " << r;
      EXPECT_EQ(t[2].second.item<int64_t>(), 0) << job << " rank " << r;
    }
  }
}

// ZeRO stages 1 and 2 against stage 0 on 2 ranks: the same weights (and
// loss, and checkpointed optimizer state) to float rounding, with each
// rank holding about half of the optimizer slots during fit(), and the
// chief all of them again after it. Gloo's reduce (KILN_SHM_ALLREDUCE=0) and the
// shared-memory one both run.
class ZeroJobs : public RankJobs {
 protected:
  std::map<std::string, at::Tensor> run_stage(const std::string& variant, int stage, int rank,
                                              const std::string& shm = "1", const std::string& bf16 = "0") {
    const std::string out = dir_.path() + "/" + variant + std::to_string(stage) + "shm" + shm + "bf16" + bf16;
    run_job("zero_" + variant, out,
            {{"KILN_TEST_ZERO_STAGE", std::to_string(stage)},
             {"KILN_SHM_ALLREDUCE", shm},
             {"KILN_TEST_COMPRESS_BF16", bf16}});
    std::map<std::string, at::Tensor> r;
    for (auto& [k, t] : load_safetensors(out + "." + std::to_string(rank))) r[k] = t;
    return r;
  }
  // Every entry but the byte counts within `tol` of stage 0's.
  void expect_close(const std::map<std::string, at::Tensor>& ref, const std::map<std::string, at::Tensor>& got,
                    double tol, const std::string& what) {
    size_t compared = 0;
    double worst = 0;
    for (auto& [k, t] : ref) {
      if (k.rfind("slot_bytes", 0) == 0) continue;
      auto it = got.find(k);
      ASSERT_NE(it, got.end()) << what << " lacks " << k;
      const double diff = (t.to(at::kDouble) - it->second.to(at::kDouble)).abs().max().item<double>();
      EXPECT_LE(diff, tol) << what << ": " << k;
      worst = std::max(worst, diff);
      ++compared;
    }
    std::cout << what << ": largest difference to stage 0 " << worst << " (tolerance " << tol << ")\n";
    EXPECT_EQ(got.size(), ref.size()) << what;
    EXPECT_GT(compared, 6u);
  }
};

TEST_F(ZeroJobs, StagesOneAndTwoMatchStageZeroWithHalfTheSlotsPerRank) {
  auto ref = run_stage("plain", 0, 0);
  const int64_t full = ref.at("slot_bytes_in_fit").item<int64_t>();
  EXPECT_EQ(full, 2 * 4 * (16 * 24 + 24 + 24 * 24 + 24 + 24 * 16 + 16));  // Adam's m and v, float32
  for (int stage : {1, 2}) {
    int64_t sum = 0;
    for (int rank : {0, 1}) {
      auto got = run_stage("plain", stage, rank);
      expect_close(ref, got, 1e-6, "stage " + std::to_string(stage) + " rank " + std::to_string(rank));
      const int64_t mine = got.at("slot_bytes_in_fit").item<int64_t>();
      EXPECT_LT(mine, full * 0.6) << "stage " << stage << " rank " << rank;
      // After fit() the chief has the whole state again (for Model::save).
      EXPECT_EQ(got.at("slot_bytes_after_fit").item<int64_t>(), rank == 0 ? full : mine) << "rank " << rank;
      sum += mine;
    }
    EXPECT_EQ(sum, full) << "every slot on exactly one rank";
  }
  // Stage 2 through Gloo's reduce instead of shared memory.
  expect_close(ref, run_stage("plain", 2, 1, "0"), 1e-6, "stage 2 over Gloo");
  // bfloat16 buckets (an all-gather even at stage 2): as stage 0 with them.
  expect_close(run_stage("plain", 0, 0, "1", "1"), run_stage("plain", 2, 1, "1", "1"), 1e-6, "stage 2, bfloat16");
}

TEST_F(ZeroJobs, ASecondFitWithOtherTrainableVariablesMatchesStageZero) {
  auto ref = run_stage("refit", 0, 1);
  for (int stage : {1, 2}) expect_close(ref, run_stage("refit", stage, 1), 1e-6, "stage " + std::to_string(stage));
}

// Two ranks on one GPU (the GPU machines lent here have one; NCCL refuses
// two ranks on a GPU): GPU tensors go through Gloo, and stages 0 and 2
// (and bfloat16 buckets) give the weights two CPU ranks give. IEEE float32
// products on the GPU (KILN_TF32=0), so only summation orders differ.
class DataParallelCUDA : public ZeroJobs {};

TEST_F(DataParallelCUDA, TwoRanksSharingOneGpuMatchTwoCpuRanksThroughGloo) {
  const std::map<std::string, std::string> gpu = {{"KILN_DEVICE", "cuda:0"}, {"KILN_TF32", "0"}};
  for (int stage : {0, 2}) {
    auto cpu_ranks = run_stage("plain", stage, 0);
    const std::string out = dir_.path() + "/gpu" + std::to_string(stage);
    auto env = gpu;
    env.emplace("KILN_TEST_ZERO_STAGE", std::to_string(stage));
    run_job("zero_plain", out, env);
    std::map<std::string, at::Tensor> on_gpu;
    for (auto& [k, t] : load_safetensors(out + ".0")) on_gpu[k] = t;
    expect_close(cpu_ranks, on_gpu, 1e-5, "stage " + std::to_string(stage) + " on one shared GPU");
  }
  auto env = gpu;
  env.emplace("KILN_TEST_COMPRESS_BF16", "1");
  run_job("zero_plain", dir_.path() + "/gpubf16", env);
  std::map<std::string, at::Tensor> bf16;
  for (auto& [k, t] : load_safetensors(dir_.path() + "/gpubf16.0")) bf16[k] = t;
  expect_close(run_stage("plain", 0, 0, "1", "1"), bf16, 1e-4, "bfloat16 buckets on one shared GPU");
}

TEST_F(ZeroJobs, ClippingEmaAccumulationLossScaleAndCheckpointsMatchStageZero) {
  auto ref = run_stage("features", 0, 0);
  size_t ckpt_slots = 0;
  for (auto& [k, t] : ref) ckpt_slots += k.rfind("ckpt:", 0) == 0;
  EXPECT_GT(ckpt_slots, 12u) << "m, v and the average of every variable, and the scalars";
  for (int stage : {1, 2}) expect_close(ref, run_stage("features", stage, 0), 1e-5, "stage " + std::to_string(stage));
}

// `kiln train` with {"distribution": {"type": "data_parallel", "zero_stage":
// 2}}: the saved model (weights and the whole optimizer state, gathered to
// the chief at the end of fit) matches the zero_stage 0 run.
TEST_F(MultiProcess, SpecZeroStageTwoSavesTheSameModelAndOptimizerState) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  const std::string plain = dir_.path() + "/plain", zero = dir_.path() + "/zero";
  run_ranks(2, spec("plain.json", 1, plain));
  run_ranks(2, spec("zero.json", 1, zero, Json{{"distribution", {{"type", "data_parallel"}, {"zero_stage", 2}}}}));
  for (const char* file : {"/1/weights.safetensors", "/1/optimizer.safetensors"}) {
    ASSERT_TRUE(path_exists(zero + file)) << read_file(log(0));
    auto a = load_safetensors(plain + file), b = load_safetensors(zero + file);
    ASSERT_EQ(a.size(), b.size()) << file;
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].first, b[i].first) << file;
      EXPECT_LE((a[i].second.to(at::kDouble) - b[i].second.to(at::kDouble)).abs().max().item<double>(), 1e-6)
          << file << " " << a[i].first;
    }
  }
}

// --- jobs started by `kiln launch`: kills, hangs, restarts, two hosts -------------------

// The pid of the live process whose environment holds `token` and RANK=rank
// (the launcher passes its environment on to the ranks); -1 if none.
pid_t find_rank(const std::string& token, int rank) {
  for (auto& name : list_directory("/proc")) {
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f("/proc/" + name + "/environ", std::ios::binary);
    std::string env((std::istreambuf_iterator<char>(f)), {});
    bool has_token = false, has_rank = false;
    size_t pos = 0;
    while (pos < env.size()) {
      size_t end = env.find('\0', pos);
      if (end == std::string::npos) end = env.size();
      const std::string kv = env.substr(pos, end - pos);
      if (kv == "KILN_TEST_TOKEN=" + token) has_token = true;
      if (kv == "RANK=" + std::to_string(rank)) has_rank = true;
      pos = end + 1;
    }
    // The launcher itself has the token but no RANK.
    if (has_token && has_rank) return static_cast<pid_t>(std::stol(name));
  }
  return -1;
}

bool any_left(const std::string& token) { return find_rank(token, 0) > 0 || find_rank(token, 1) > 0; }

class LaunchedJob : public MultiProcess {
 protected:
  // A spec slow enough to kill in the middle: 4 epochs of 36 steps, a
  // backup every 3 batches.
  std::string backup_spec(const std::string& name, const std::string& base, const std::string& backup) {
    Json extra;
    extra["callbacks"] =
        Json::array({{{"class_name", "BackupAndRestore"}, {"config", {{"backup_dir", backup}, {"save_freq", 3}}}}});
    extra["data"] = Json::parse(
        R"({"source": "fashion_mnist", "scale": "1/255", "flatten": true, "limit": 6144, "test_limit": 500})");
    return spec(name, 4, base, extra);
  }
  // Starts `kiln launch ARGS -- kiln train SPEC` in the background.
  pid_t launch(const std::vector<std::string>& flags, const std::string& spec_path, const std::string& log_path,
               const std::map<std::string, std::string>& env = {}) {
    std::vector<std::string> args = {"launch"};
    args.insert(args.end(), flags.begin(), flags.end());
    for (const char* a : {"--", "kiln", "train"}) args.push_back(a);
    args.push_back(spec_path);
    return spawn(args, env, log_path);
  }
};

TEST_F(LaunchedJob, KilledRankRestartsAndEndsBitIdenticalToAnUninterruptedRun) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  const std::string ref = dir_.path() + "/ref";
  pid_t p = launch({"--nproc_per_node", "2", "--threads_per_rank", "1", "--master_port", std::to_string(free_port())},
                   backup_spec("ref.json", ref, dir_.path() + "/ref_backup"), dir_.path() + "/ref.log");
  ASSERT_EQ(wait_bounded(p, 300), 0) << read_file(dir_.path() + "/ref.log");
  auto a = weights_of(ref + "/1");

  // Any rank: a worker, then the chief (which writes the backups).
  for (int victim : {1, 0}) {
    SCOPED_TRACE("SIGKILL of rank " + std::to_string(victim));
    const std::string tag = std::to_string(victim), out = dir_.path() + "/out" + tag;
    const std::string token = "kill" + tag + "_" + std::to_string(::getpid());
    const std::string backup = dir_.path() + "/backup" + tag, log_path = dir_.path() + "/killed" + tag + ".log";
    p = launch({"--nproc_per_node", "2", "--threads_per_rank", "1", "--max_restarts", "1", "--master_port",
                std::to_string(free_port())},
               backup_spec("killed" + tag + ".json", out, backup), log_path, {{"KILN_TEST_TOKEN", token}});
    // SIGKILL the rank once the first backup is there (a few batches in).
    bool killed = false;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (!killed && std::chrono::steady_clock::now() < deadline) {
      if (has_checkpoint(backup)) {
        pid_t r = find_rank(token, victim);
        if (r > 0) killed = ::kill(r, SIGKILL) == 0;
      }
      if (!killed) std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling the backup dir
    }
    ASSERT_TRUE(killed) << read_file(log_path);
    const int code = wait_bounded(p, 300);
    const std::string log = read_file(log_path);
    ASSERT_EQ(code, 0) << log;
    EXPECT_NE(log.find("kiln launch: rank " + tag), std::string::npos) << log;
    EXPECT_NE(log.find("killed by signal 9"), std::string::npos) << log;
    EXPECT_NE(log.find("restarting all ranks (restart 1 of 1)"), std::string::npos) << log;
    // It resumed from the backup (a restart from scratch would give the
    // same weights too).
    EXPECT_NE(log.find("[rank0] Resumed from the backup in " + backup), std::string::npos) << log;
    auto b = weights_of(out + "/1");
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i].second, b[i].second)) << a[i].first;
    EXPECT_FALSE(any_left(token));
  }
}

TEST_F(LaunchedJob, WithoutRestartsEveryRankEndsWithTheCause) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  // A rank killed: the launcher names it and stops the other.
  {
    const std::string token = "dead" + std::to_string(::getpid()), backup = dir_.path() + "/b1";
    const std::string log_path = dir_.path() + "/dead.log";
    pid_t p = launch({"--nproc_per_node", "2", "--threads_per_rank", "1", "--master_port", std::to_string(free_port())},
                     backup_spec("dead.json", dir_.path() + "/o1", backup), log_path, {{"KILN_TEST_TOKEN", token}});
    pid_t r1 = -1;
    for (int i = 0; i < 24000 && r1 < 0; ++i) {
      if (has_checkpoint(backup)) r1 = find_rank(token, 1);
      if (r1 < 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_GT(r1, 0) << read_file(log_path);
    ::kill(r1, SIGKILL);
    EXPECT_EQ(wait_bounded(p, 60), 137) << read_file(log_path);
    const std::string log = read_file(log_path);
    EXPECT_NE(log.find("kiln launch: rank 1 (pid " + std::to_string(r1) + ") was killed by signal 9"),
              std::string::npos)
        << log;
    EXPECT_FALSE(any_left(token));
    EXPECT_FALSE(path_exists(dir_.path() + "/o1/1"));
  }
  // A rank that hangs (SIGSTOP): rank 0's collective times out with one
  // line naming it, and the launcher ends the stopped rank.
  {
    const std::string token = "hang" + std::to_string(::getpid()), backup = dir_.path() + "/b2";
    const std::string log_path = dir_.path() + "/hang.log";
    pid_t p = launch({"--nproc_per_node", "2", "--threads_per_rank", "1", "--grace_seconds", "1", "--master_port",
                      std::to_string(free_port())},
                     backup_spec("hang.json", dir_.path() + "/o2", backup), log_path,
                     {{"KILN_TEST_TOKEN", token}, {"KILN_COLLECTIVE_TIMEOUT", "3"}});
    pid_t r1 = -1;
    for (int i = 0; i < 24000 && r1 < 0; ++i) {
      if (has_checkpoint(backup)) r1 = find_rank(token, 1);
      if (r1 < 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_GT(r1, 0) << read_file(log_path);
    ::kill(r1, SIGSTOP);
    const int code = wait_bounded(p, 90);
    const std::string log = read_file(log_path);
    EXPECT_NE(code, 0) << log;
    EXPECT_NE(code, -1) << "the launcher did not end the job: " << log;
    EXPECT_NE(log.find("[rank0] kiln: error: rank 0:"), std::string::npos) << log;
    EXPECT_NE(log.find("collective timeout 3 s"), std::string::npos) << log;
    EXPECT_NE(log.find("kiln launch: rank 0"), std::string::npos) << log;
    EXPECT_FALSE(any_left(token));
  }
}

// Two "hosts": network namespaces joined by a veth pair, one rank each,
// `kiln launch --nnodes 2` in both. The job must give the very weights the
// same two ranks give on one host.
class TwoHosts : public LaunchedJob {
 protected:
  std::string a_, b_;
  bool made_ = false;
  void SetUp() override {
    KILN_SKIP_WITHOUT_CLI();
    if (::geteuid() != 0) GTEST_SKIP() << "not root: cannot create network namespaces";
    const std::string id = std::to_string(::getpid() % 100000);
    a_ = "kiln-t" + id + "a";
    b_ = "kiln-t" + id + "b";
    const std::string va = "kv" + id + "a", vb = "kv" + id + "b";
    auto r =
        run_command("ip netns add " + a_ + " && ip netns add " + b_ + " && ip link add " + va +
                    " type veth peer name " + vb + " && ip link set " + va + " netns " + a_ + " && ip link set " + vb +
                    " netns " + b_ + " && ip -n " + a_ + " addr add 10.231.0.1/24 dev " + va + " && ip -n " + b_ +
                    " addr add 10.231.0.2/24 dev " + vb + " && ip -n " + a_ + " link set " + va + " up && ip -n " + b_ +
                    " link set " + vb + " up && ip -n " + a_ + " link set lo up && ip -n " + b_ + " link set lo up");
    made_ = true;
    if (r.exit_code != 0) GTEST_SKIP() << "cannot create network namespaces here: " << r.output;
  }
  void TearDown() override {
    if (made_) run_command("ip netns del " + a_ + " 2>/dev/null; ip netns del " + b_ + " 2>/dev/null");
  }
};

TEST_F(TwoHosts, TrainsAsOneJobAndMatchesTheSingleHostRun) {
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)";
  const std::string local = dir_.path() + "/local", multi = dir_.path() + "/multi";
  run_ranks(2, spec("local.json", 2, local));
  const std::string s = spec("multi.json", 2, multi);
  const std::string port = std::to_string(20000 + ::getpid() % 20000);
  std::vector<pid_t> pids;
  for (int node = 0; node < 2; ++node) {
    const std::vector<std::string> args = {"netns",
                                           "exec",
                                           node == 0 ? a_ : b_,
                                           cli_path(),
                                           "launch",
                                           "--nnodes",
                                           "2",
                                           "--node_rank",
                                           std::to_string(node),
                                           "--nproc_per_node",
                                           "1",
                                           "--threads_per_rank",
                                           "1",
                                           "--master_addr",
                                           "10.231.0.1",
                                           "--master_port",
                                           port,
                                           "--",
                                           "kiln",
                                           "train",
                                           s};
    std::string ip = "/usr/sbin/ip";
    if (!path_exists(ip)) ip = "/sbin/ip";
    const pid_t pid = spawn(args, {}, dir_.path() + "/node" + std::to_string(node) + ".log", ip);
    ASSERT_GT(pid, 0);
    pids.push_back(pid);
  }
  for (int node = 0; node < 2; ++node)
    EXPECT_EQ(wait_bounded(pids[node], 240), 0) << read_file(dir_.path() + "/node" + std::to_string(node) + ".log");
  const std::string chief_log = read_file(dir_.path() + "/node0.log");
  EXPECT_NE(chief_log.find("[rank0] Saved model to"), std::string::npos) << chief_log;
  EXPECT_EQ(read_file(dir_.path() + "/node1.log").find("Saved model"), std::string::npos);
  auto a = weights_of(local + "/1"), b = weights_of(multi + "/1");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i].second, b[i].second)) << a[i].first;
}

}  // namespace
}  // namespace kiln
