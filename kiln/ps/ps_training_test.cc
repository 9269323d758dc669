// Parameter-server jobs for real: a chief, 2 ps tasks and 3 workers, each a
// `kiln train` process with its own TF_CONFIG on loopback, training on
// Fashion-MNIST; workers and ps tasks are SIGKILLed mid-training, in both
// modes, and once through `kiln launch`, which restarts the killed worker.
#include <gtest/gtest.h>

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "kiln/core/json.h"
#include "kiln/testing/testing.h"

namespace kiln {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Waits (bounded) until `path` contains `text`.
bool wait_for_text(const std::string& path, const std::string& text, double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (read_file(path).find(text) != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

Json job_spec(const std::string& mode, const std::string& out) {
  Json s = Json::parse(R"({
    "model": {"layers": [{"class_name": "Dense", "config": {"units": 64, "activation": "relu", "name": "up"}},
                         {"class_name": "Dense", "config": {"units": 10, "name": "head"}}],
              "input_shape": [784], "name": "mlp"},
    "data": {"source": "fashion_mnist", "scale": "1/255", "flatten": true, "limit": 8192, "test_limit": 1000},
    "compile": {"optimizer": {"class_name": "SGD", "config": {"learning_rate": 0.1}},
                "loss": {"class_name": "SparseCategoricalCrossentropy", "config": {"from_logits": true}},
                "metrics": ["accuracy"]},
    "fit": {"batch_size": 32, "epochs": 3, "seed": 3, "verbose": 2},
    "distribution": {"type": "parameter_server", "worker_timeout_seconds": 2, "ps_timeout_seconds": 30}
  })");
  s["distribution"]["mode"] = mode;
  if (mode == "sync") s["distribution"]["backup_workers"] = 1;
  s["output"] = {{"base_dir", out}};
  return s;
}

// The chief's summary line, parsed.
struct Summary {
  bool found = false;
  int64_t steps = 0, rescheduled = 0, lost = 0, restarts = 0, restores = 0, failed = 0, dropped = 0, staleness = 0;
};
Summary summary_of(const std::string& log) {
  static const std::regex re(
      R"(Parameter servers: (?:a?sync), 3 workers, 2 ps: (\d+) steps, (\d+) rescheduled, (\d+) workers? lost \((\d+) restarts?\), (\d+) ps restores?, (\d+) failed, (\d+) dropped, max staleness (\d+))");
  std::smatch m;
  Summary s;
  if (!std::regex_search(log, m, re)) return s;
  s.found = true;
  int64_t* f[] = {&s.steps, &s.rescheduled, &s.lost, &s.restarts, &s.restores, &s.failed, &s.dropped, &s.staleness};
  for (int i = 0; i < 8; ++i) *f[i] = std::stoll(m[i + 1]);
  return s;
}

// Each epoch's training loss, from the chief's verbose-2 lines.
std::vector<double> epoch_losses(const std::string& log) {
  static const std::regex re(R"(/step - loss: ([0-9.]+))");
  std::vector<double> out;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back(std::stod((*it)[1]));
  return out;
}

double test_accuracy(const std::string& log) {
  std::smatch m;
  static const std::regex re(R"(test_accuracy: ([0-9.]+))");
  return std::regex_search(log, m, re) ? std::stod(m[1]) : -1;
}

// A chief, 2 ps tasks and 3 workers started by hand, as on real hosts.
class PsJob {
 public:
  PsJob(const std::string& mode) {
    Json spec = job_spec(mode, dir_.path() + "/out");
    spec_ = dir_.path() + "/spec.json";
    std::ofstream(spec_) << spec.dump();
    Json cluster;
    auto addr = [] { return "127.0.0.1:" + std::to_string(free_loopback_port()); };
    cluster["chief"] = {addr()};
    cluster["worker"] = {addr(), addr(), addr()};
    cluster["ps"] = {addr(), addr()};
    cluster_ = cluster;
    for (int i = 0; i < 2; ++i) start("ps", i);
    for (int i = 0; i < 3; ++i) start("worker", i);
    start("chief", 0);
  }
  ~PsJob() {
    for (auto& [name, pid] : pids_)
      if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
  }

  void start(const std::string& type, int index) {
    const std::string name = type + std::to_string(index);
    Json tf{{"cluster", cluster_}, {"task", {{"type", type}, {"index", index}}}};
    pids_[name] = spawn_logged({cli_path(), "train", spec_}, log(name) + (restarts_[name]++ ? ".again" : ""),
                               {{"TF_CONFIG", tf.dump()}, {"KILN_NUM_THREADS", "1"}, {"OMP_NUM_THREADS", "1"}});
    ASSERT_GT(pids_[name], 0) << name;
  }
  void sigkill(const std::string& name) {
    ASSERT_EQ(kill(pids_[name], SIGKILL), 0);
    waitpid(pids_[name], nullptr, 0);
    pids_[name] = -1;
  }
  // The chief's exit status; then every other task must end by itself
  // (workers told DONE, ps tasks shut down by the chief).
  int finish(double seconds) {
    const int chief = wait_bounded(pids_["chief0"], seconds);
    pids_["chief0"] = -1;
    for (auto& [name, pid] : pids_)
      if (pid > 0) {
        EXPECT_EQ(wait_bounded(pid, 20), 0) << name << " did not end cleanly after the chief:\n"
                                            << read_file(log(name)) << read_file(log(name) + ".again");
        pid = -1;
      }
    return chief;
  }
  std::string log(const std::string& name) const { return dir_.path() + "/" + name + ".log"; }

 private:
  TempDir dir_;
  std::string spec_;
  Json cluster_;
  std::map<std::string, pid_t> pids_;
  std::map<std::string, int> restarts_;
};

// `redone`: a restore makes the steps since the checkpoint run again.
void expect_trained(const std::string& chief_log, const Summary& s, const std::string& mode, bool redone = false) {
  ASSERT_TRUE(s.found) << chief_log;
  // Every step of 3 epochs was done: 8192 / 32 = 256 per epoch (sync: 128 of 2 gradients).
  const int64_t steps = mode == "sync" ? 3 * 128 : 3 * 256;
  if (redone)
    EXPECT_GE(s.steps, steps) << chief_log;
  else
    EXPECT_EQ(s.steps, steps) << chief_log;
  const auto losses = epoch_losses(chief_log);
  ASSERT_EQ(losses.size(), 3u) << chief_log;
  EXPECT_LT(losses.back(), losses.front()) << chief_log;
  // Chance is 0.1; 3 epochs usually end above 0.7. A run restored from the
  // epoch-2 checkpoint redoes its steps while the replacement ps task warms
  // up, and on a loaded machine (CI runs two test binaries at once) its sync
  // steps drop more late gradients: 0.678 was seen there, so it gets 0.6.
  EXPECT_GT(test_accuracy(chief_log), redone ? 0.6 : 0.7) << chief_log;
  EXPECT_NE(chief_log.find("Saved model to"), std::string::npos) << chief_log;
  if (mode == "sync") EXPECT_EQ(s.staleness, 0) << "a synchronous step uses the values of the step before";
}

class ParameterServerJob : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    KILN_SKIP_WITHOUT_CLI();
    if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (dataset-fashion-mnist)";
  }
};

TEST_P(ParameterServerJob, AKilledWorkersStepsAreRescheduledAndTrainingFinishes) {
  const std::string mode = GetParam();
  PsJob job(mode);
  ASSERT_TRUE(wait_for_text(job.log("chief0"), "Epoch 2/3", 120)) << read_file(job.log("chief0"));
  job.sigkill("worker1");
  ASSERT_EQ(job.finish(180), 0) << read_file(job.log("chief0"));
  const std::string log = read_file(job.log("chief0"));
  const Summary s = summary_of(log);
  expect_trained(log, s, mode);
  EXPECT_EQ(s.lost, 1) << log;
  EXPECT_NE(log.find("worker:1 lost; " + std::to_string(s.rescheduled) + " of its steps rescheduled"),
            std::string::npos)
      << log;
  if (mode == "sync") EXPECT_GT(s.dropped, 0) << "with a backup worker, some gradients come too late";
}

TEST_P(ParameterServerJob, AKilledPsIsRestoredFromTheChiefsCheckpointAndTrainingFinishes) {
  const std::string mode = GetParam();
  PsJob job(mode);
  ASSERT_TRUE(wait_for_text(job.log("chief0"), "Epoch 2/3", 120)) << read_file(job.log("chief0"));
  job.sigkill("ps1");
  job.start("ps", 1);  // what kiln launch (or a cluster manager) does
  ASSERT_EQ(job.finish(180), 0) << read_file(job.log("chief0"));
  const std::string log = read_file(job.log("chief0"));
  const Summary s = summary_of(log);
  expect_trained(log, s, mode, /*redone=*/true);
  EXPECT_GE(s.restores, 1) << log;
  EXPECT_NE(log.find("restoring the checkpoint of epoch 2, step 0"), std::string::npos) << log;
}

INSTANTIATE_TEST_SUITE_P(Modes, ParameterServerJob, ::testing::Values("async", "sync"),
                         [](const auto& info) { return info.param; });

// The pid of `launcher`'s child whose TF_CONFIG names this task, or -1.
pid_t task_pid(pid_t launcher, const std::string& type, int index) {
  const std::string want = "\"task\":{\"type\":\"" + type + "\",\"index\":" + std::to_string(index) + "}";
  DIR* d = opendir("/proc");
  pid_t found = -1;
  while (dirent* e = d ? readdir(d) : nullptr) {
    const pid_t pid = atoi(e->d_name);
    if (pid <= 0) continue;
    std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
    const auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid != launcher) continue;
    std::string env = read_file("/proc/" + std::to_string(pid) + "/environ");
    if (env.find(want) != std::string::npos) found = pid;
  }
  if (d) closedir(d);
  return found;
}

TEST(ParameterServerLaunch, KilnLaunchRestartsAKilledWorkerAndTheJobFinishes) {
  KILN_SKIP_WITHOUT_CLI();
  if (!have_fashion_mnist()) GTEST_SKIP() << "Fashion-MNIST is not installed (dataset-fashion-mnist)";
  TempDir dir;
  const std::string spec = dir.path() + "/spec.json", out = dir.path() + "/launch.log";
  std::ofstream(spec) << job_spec("async", dir.path() + "/out").dump();
  const pid_t launcher = spawn_logged({cli_path(), "launch", "--num_ps", "2", "--num_workers", "3", "--max_restarts",
                                       "1", "--grace_seconds", "5", "--", cli_path(), "train", spec},
                                      out);
  ASSERT_GT(launcher, 0);
  ASSERT_TRUE(wait_for_text(out, "[chief0] Epoch 2/3", 120)) << read_file(out);
  const pid_t worker = task_pid(launcher, "worker", 1);
  ASSERT_GT(worker, 0) << "no worker 1 under the launcher";
  ASSERT_EQ(kill(worker, SIGKILL), 0);
  ASSERT_EQ(wait_bounded(launcher, 240), 0) << read_file(out);
  const std::string log = read_file(out);
  EXPECT_NE(log.find("kiln launch: worker 1 (pid " + std::to_string(worker) +
                     ") was killed by signal 9 (SIGKILL); restarting it (restart 1 of 1)"),
            std::string::npos)
      << log;
  static const std::regex prefix(R"(\[chief0\] )");
  const Summary s = summary_of(std::regex_replace(log, prefix, ""));
  expect_trained(std::regex_replace(log, prefix, ""), s, "async");
  EXPECT_EQ(s.lost, 1) << log;
}

}  // namespace
}  // namespace kiln
