// Data parallelism: the cluster resolver, DataParallel in one process, and
// real multi-process jobs (`kiln train` ranks over c10d/Gloo on loopback)
// checked against one process.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <thread>

#include "kiln/core/io.h"
#include "kiln/core/random.h"
#include "kiln/distribute/cluster.h"
#include "kiln/distribute/data_parallel.h"
#include "kiln/layers/dense.h"
#include "kiln/layers/normalization.h"
#include "kiln/models/sequential.h"
#include "kiln/saving/safetensors.h"
#include "kiln/testing/testing.h"

extern char** environ;

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

template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const ValueError& e) {
    return e.what();
  }
  return "";
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
  auto has = [](const std::string& msg, std::initializer_list<const char*> parts) {
    for (auto* p : parts) EXPECT_NE(msg.find(p), std::string::npos) << msg << " lacks " << p;
  };
  has(error_of([] {
        resolve_cluster(env_of({{"RANK", "two"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}}));
      }),
      {"RANK", "two"});
  has(error_of([] {
        resolve_cluster(env_of({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}}));
      }),
      {"RANK", "[0, 3]"});
  has(error_of([] { resolve_cluster(env_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}})); }), {"MASTER_ADDR", "kiln launch"});
  has(error_of([] { resolve_cluster(env_of({{"TF_CONFIG", "{oops"}})); }), {"TF_CONFIG"});
  has(error_of([] {
        resolve_cluster(
            env_of({{"TF_CONFIG", R"({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}})"}}));
      }),
      {"TF_CONFIG", "not in the cluster"});
  has(error_of([] {
        resolve_cluster(env_of({{"TF_CONFIG", R"({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 0}})"}}));
      }),
      {"TF_CONFIG", "'ps'"});
}

// --- one process ----------------------------------------------------------------------

std::shared_ptr<Sequential> small_model() {
  auto m = std::make_shared<Sequential>(
      std::vector<LayerPtr>{std::make_shared<Dense>(DenseOptions{.units = 16, .activation = "relu"}),
                            std::make_shared<BatchNormalization>(BatchNormalizationOptions{.synchronized = true}),
                            std::make_shared<Dense>(DenseOptions{.units = 3})},
      "small");
  m->compile(CompileArgs::from_names("adam", "sparse_categorical_crossentropy", {"accuracy"}));
  return m;
}

std::vector<at::Tensor> train_small(bool data_parallel) {
  set_distribution(data_parallel ? std::make_shared<distribute::DataParallel>(
                                       distribute::DataParallelOptions{.cluster = ClusterSpec{}})
                                 : nullptr);
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
  auto plain = train_small(false);
  auto dp = train_small(true);
  ASSERT_EQ(plain.size(), dp.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(at::equal(plain[i], dp[i])) << i;
}

TEST(DataParallel, BadOptionsAreClearErrors) {
  auto msg = error_of([] { distribute::DataParallel({.devices = {"cuda:0"}, .cluster = ClusterSpec{}}); });
  EXPECT_NE(msg.find("cuda:0"), std::string::npos) << msg;
  msg = error_of([] { distribute::distribution_from_config(Json{{"type", "model_parallel"}}); });
  EXPECT_NE(msg.find("data_parallel"), std::string::npos) << msg;
  msg = error_of([] { distribute::distribution_from_config(Json{{"type", "data_parallel"}, {"bucket_mb", 4}}); });
  EXPECT_NE(msg.find("bucket_mb"), std::string::npos) << msg;
}

// --- several processes ----------------------------------------------------------------

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

bool have_fashion_mnist() {
  const char* d = std::getenv("KILN_FASHION_MNIST_DIR");
  std::string dir = d && *d ? d : "/usr/share/datasets/fashion-mnist";
  return path_exists(dir + "/train-labels-idx1-ubyte.gz") || path_exists(dir + "/train-labels-idx1-ubyte");
}

// Starts `kiln ARGS` with extra environment, output to `log`.
pid_t spawn(const std::vector<std::string>& args, const std::map<std::string, std::string>& extra_env,
            const std::string& log) {
  std::vector<std::string> argv_s = {cli_path()};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e, k = kv.substr(0, kv.find('='));
    if (!extra_env.count(k)) env_s.push_back(kv);
  }
  for (auto& [k, v] : extra_env) env_s.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

// Waits for `pid` at most `seconds`; SIGKILLs it after that. Exit status, or
// -1 when it had to be killed.
int wait_bounded(pid_t pid, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    int st = 0;
    pid_t r = ::waitpid(pid, &st, WNOHANG);
    if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &st, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling a child's exit, not hiding a race
  }
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

class MultiProcess : public ::testing::Test {
 protected:
  TempDir dir_;

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
  std::vector<std::string> run_ranks(int n, const std::string& spec_path, double timeout_s = 240) {
    const int port = free_port();
    std::vector<pid_t> pids;
    for (int r = 0; r < n; ++r)
      pids.push_back(spawn({"train", spec_path},
                           {{"RANK", std::to_string(r)},
                            {"WORLD_SIZE", std::to_string(n)},
                            {"LOCAL_RANK", std::to_string(r)},
                            {"LOCAL_WORLD_SIZE", std::to_string(n)},
                            {"MASTER_ADDR", "127.0.0.1"},
                            {"MASTER_PORT", std::to_string(port)},
                            {"KILN_NUM_THREADS", "1"}},
                           log(r)));
    std::vector<std::string> out;
    for (int r = 0; r < n; ++r) {
      const int code = wait_bounded(pids[r], timeout_s);
      out.push_back(slurp(log(r)));
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
}

// Two more ways to train data-parallel, each against one process:
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
  for (const Json& extra : {accumulate, Json{{"distribution", {{"type", "data_parallel"}, {"auto_shard", "off"}}}}}) {
    SCOPED_TRACE(extra.dump());
    TempDir out;
    const std::string one = out.path() + "/one", two = out.path() + "/two";
    auto single = run_command(cli_path() + " --threads 1 train " + spec("one.json", 2, one, extra));
    ASSERT_EQ(single.exit_code, 0) << single.output;
    auto outs = run_ranks(2, spec("two.json", 2, two, extra));
    auto a = weights_of(one + "/1"), b = weights_of(two + "/1");
    ASSERT_EQ(a.size(), b.size()) << outs[0];
    for (size_t i = 0; i < a.size(); ++i) {
      const double diff = (a[i].second - b[i].second).abs().max().item<double>();
      EXPECT_LT(diff, 1e-4) << a[i].first;
    }
    EXPECT_NEAR(metric_in(single.output, "test_accuracy"), metric_in(outs[0], "test_accuracy"), 0.0021) << outs[0];
  }
}

}  // namespace
}  // namespace kiln
