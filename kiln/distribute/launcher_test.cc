// kiln launch: the launcher run in-process (ranks, or a parameter-server
// job's tasks, are `sh -c` scripts whose output goes to temp files) and
// through the built CLI.
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/core/json.h"
#include "kiln/distribute/launcher.h"
#include "kiln/testing/expect_error.h"
#include "kiln/testing/testing.h"

extern char** environ;

// Named, so that the unity build (this folder's tests in one translation
// unit) never mixes these helpers with another test file's.
namespace kiln::distribute::launcher_test {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines;
}

// Runs launch() with a shell script per rank; the prefixed lines land in
// files of a temp dir.
struct LaunchResult {
  int status = -1;
  std::string out, err;
  double seconds = 0;
};

class Launcher : public ::testing::Test {
 protected:
  LaunchResult run(LaunchOptions o, const std::string& script) {
    o.command = {"sh", "-c", script};
    return run_command(o);
  }
  LaunchResult run_command(LaunchOptions o) {
    const std::string out_path = dir_.path() + "/out.txt", err_path = dir_.path() + "/err.txt";
    int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    EXPECT_GE(out, 0);
    EXPECT_GE(err, 0);
    o.out_fd = out;
    o.err_fd = err;
    LaunchResult r;
    auto start = Clock::now();
    r.status = launch(o);
    r.seconds = seconds_since(start);
    close(out);
    close(err);
    r.out = read_file(out_path);
    r.err = read_file(err_path);
    return r;
  }
  std::string path(const std::string& name) const { return dir_.path() + "/" + name; }

  TempDir dir_;
};

// The lines of `text` that start with `prefix`, in order.
std::vector<std::string> with_prefix(const std::string& text, const std::string& prefix) {
  std::vector<std::string> out;
  for (auto& l : lines_of(text))
    if (l.rfind(prefix, 0) == 0) out.push_back(l.substr(prefix.size()));
  return out;
}

TEST_F(Launcher, PrefixesLinesAndSetsRankEnvironment) {
  LaunchOptions o;
  o.nproc_per_node = 3;
  o.threads_per_rank = 2;
  LaunchResult r = run(o, "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $KILN_NUM_THREADS\"; echo \"err $RANK\" >&2");
  EXPECT_EQ(r.status, 0) << r.err;
  std::vector<std::string> out = lines_of(r.out);
  std::sort(out.begin(), out.end());
  EXPECT_EQ(out, (std::vector<std::string>{"[rank0] 0 3 0 2", "[rank1] 1 3 1 2", "[rank2] 2 3 2 2"}));
  std::vector<std::string> err = lines_of(r.err);
  std::sort(err.begin(), err.end());
  EXPECT_EQ(err, (std::vector<std::string>{"[rank0] err 0", "[rank1] err 1", "[rank2] err 2"}));
}

TEST_F(Launcher, SetsTorchrunVariablesForOneNodeOfMany) {
  LaunchOptions o;
  o.nproc_per_node = 2;
  o.nnodes = 3;
  o.node_rank = 2;
  o.master_addr = "10.0.0.7";
  o.master_port = 12345;
  o.threads_per_rank = 3;
  LaunchResult r =
      run(o,
          "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $NODE_RANK $MASTER_ADDR "
          "$MASTER_PORT $KILN_RESTART_COUNT $TORCHELASTIC_RESTART_COUNT $OMP_NUM_THREADS $OPENBLAS_NUM_THREADS "
          "$MKL_NUM_THREADS\"");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(with_prefix(r.out, "[rank4] "), (std::vector<std::string>{"4 6 0 2 2 2 10.0.0.7 12345 0 0 3 3 3"}));
  EXPECT_EQ(with_prefix(r.out, "[rank5] "), (std::vector<std::string>{"5 6 1 2 2 2 10.0.0.7 12345 0 0 3 3 3"}));
}

TEST_F(Launcher, PassesWholeLinesAndAFinalPartialLine) {
  LaunchOptions o;
  o.nproc_per_node = 2;
  // Many lines from both ranks at once: each comes out whole, in order.
  LaunchResult r =
      run(o,
          "i=0; while [ $i -lt 3000 ]; do echo \"line $i of rank $RANK\"; i=$((i+1)); done; printf 'last'; "
          "printf 'no newline' >&2");
  EXPECT_EQ(r.status, 0) << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string prefix = "[rank" + std::to_string(rank) + "] ";
    std::vector<std::string> got = with_prefix(r.out, prefix);
    ASSERT_EQ(got.size(), 3001u);
    for (int i = 0; i < 3000; ++i) ASSERT_EQ(got[i], "line " + std::to_string(i) + " of rank " + std::to_string(rank));
    EXPECT_EQ(got[3000], "last");
    EXPECT_EQ(with_prefix(r.err, prefix), (std::vector<std::string>{"no newline"}));
  }
  EXPECT_EQ(lines_of(r.out).size(), 6002u);  // nothing but prefixed lines
  EXPECT_EQ(r.out.back(), '\n');
}

TEST_F(Launcher, CutsOverlongLines) {
  LaunchOptions o;
  LaunchResult r = run(o, "head -c 70000 /dev/zero | tr '\\0' x; echo; echo end");
  EXPECT_EQ(r.status, 0) << r.err;
  std::vector<std::string> got = with_prefix(r.out, "[rank0] ");
  ASSERT_EQ(got.size(), 3u);
  // EXPECT_TRUE: a failure should not print 64 KiB of x.
  EXPECT_TRUE(got[0] == std::string(65536, 'x')) << got[0].size();
  EXPECT_TRUE(got[1] == std::string(70000 - 65536, 'x')) << got[1].size();
  EXPECT_EQ(got[2], "end");
}

TEST_F(Launcher, FailingRankStopsTheOthers) {
  LaunchOptions o;
  o.nproc_per_node = 2;
  o.grace_seconds = 30;  // SIGTERM ends `sleep` at once; SIGKILL would come too late for the bound below
  LaunchResult r = run(o, "if [ $RANK = 1 ]; then exit 3; fi; exec sleep 1000");
  EXPECT_EQ(r.status, 3);
  EXPECT_LT(r.seconds, 20);
  std::vector<std::string> err = lines_of(r.err);
  ASSERT_EQ(err.size(), 1u) << r.err;
  EXPECT_TRUE(std::regex_match(
      err[0], std::regex(R"(kiln launch: rank 1 \(pid \d+\) exited with status 3; stopping the other ranks)")))
      << err[0];
}

TEST_F(Launcher, KilledRankReports128PlusTheSignal) {
  LaunchOptions o;
  o.nproc_per_node = 2;
  LaunchResult r = run(o, "if [ $RANK = 0 ]; then kill -9 $$; fi; exec sleep 1000");
  EXPECT_EQ(r.status, 128 + 9);
  std::vector<std::string> err = lines_of(r.err);
  ASSERT_EQ(err.size(), 1u) << r.err;
  EXPECT_TRUE(std::regex_match(err[0], std::regex(R"(kiln launch: rank 0 \(pid \d+\) was killed by signal 9 )"
                                                  R"(\(SIGKILL\); stopping the other ranks)")))
      << err[0];
}

TEST_F(Launcher, SigkillsARankThatIgnoresSigtermAfterTheGracePeriod) {
  ASSERT_EQ(mkfifo(path("ready").c_str(), 0600), 0);
  LaunchOptions o;
  o.nproc_per_node = 2;
  o.grace_seconds = 0.5;
  // Rank 1 fails once rank 0 ignores SIGTERM (the FIFO's open blocks until
  // both ends are there).
  LaunchResult r = run(o, "if [ $RANK = 0 ]; then trap '' TERM; echo > " + path("ready") +
                              "; exec sleep 1000; fi; read x < " + path("ready") + "; exit 4");
  EXPECT_EQ(r.status, 4) << r.err;
  EXPECT_GE(r.seconds, 0.5);
  EXPECT_LT(r.seconds, 20);
}

TEST_F(Launcher, RestartsTheGroupAfterAFailure) {
  // Rank 1 fails the first time only (a marker file remembers it).
  const std::string script = "if [ $RANK = 1 ] && [ ! -e " + path("failed") + " ]; then touch " + path("failed") +
                             "; exit 5; fi; echo \"ok $RANK $KILN_RESTART_COUNT $TORCHELASTIC_RESTART_COUNT\"";
  LaunchOptions o;
  o.nproc_per_node = 2;
  o.max_restarts = 1;
  LaunchResult r = run(o, script);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(with_prefix(r.out, "[rank1] "), (std::vector<std::string>{"ok 1 1 1"}));
  EXPECT_NE(r.out.find("[rank0] ok 0 1 1\n"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("kiln launch: restarting all ranks (restart 1 of 1)\n"), std::string::npos) << r.err;

  std::remove(path("failed").c_str());
  o.max_restarts = 0;
  r = run(o, script);
  EXPECT_EQ(r.status, 5);
  EXPECT_EQ(with_prefix(r.out, "[rank1] "), std::vector<std::string>{});
  EXPECT_EQ(r.err.find("restarting"), std::string::npos) << r.err;
}

TEST_F(Launcher, GivesUpWhenRestartsRunOut) {
  LaunchOptions o;
  o.nproc_per_node = 1;
  o.max_restarts = 2;
  LaunchResult r = run(o, "echo \"try $KILN_RESTART_COUNT\"; exit 6");
  EXPECT_EQ(r.status, 6);
  EXPECT_EQ(with_prefix(r.out, "[rank0] "), (std::vector<std::string>{"try 0", "try 1", "try 2"}));
  EXPECT_NE(r.err.find("restart 2 of 2"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("restart 3"), std::string::npos) << r.err;
}

TEST_F(Launcher, ProgramThatCannotRunExits127) {
  LaunchOptions o;
  o.nproc_per_node = 2;
  o.command = {"kiln_launcher_test_no_such_program"};  // looked up in PATH
  LaunchResult r = run_command(o);
  EXPECT_EQ(r.status, 127);
  std::vector<std::string> err = lines_of(r.err);
  ASSERT_EQ(err.size(), 1u) << r.err;
  EXPECT_TRUE(std::regex_match(err[0], std::regex(R"(kiln launch: rank [01] \(pid \d+\) could not run )"
                                                  R"(`kiln_launcher_test_no_such_program`: No such file or )"
                                                  R"(directory \(exit status 127\).*)")))
      << err[0];

  o.command = {path("")};  // a directory
  r = run_command(o);
  EXPECT_EQ(r.status, 127);
  EXPECT_NE(r.err.find("could not run"), std::string::npos) << r.err;
}

TEST_F(Launcher, SplitsTheHostCoresBetweenRanks) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  const int cores = CPU_COUNT(&set);
  EXPECT_EQ(available_cores(), cores);
  LaunchOptions o;
  for (int n : {1, 2, 3, 64}) {
    o.nproc_per_node = n;
    EXPECT_EQ(threads_per_rank(o), std::max(1, cores / n)) << n;
  }
  o.threads_per_rank = 5;
  EXPECT_EQ(threads_per_rank(o), 5);

  o.nproc_per_node = 2;
  o.threads_per_rank = 0;
  LaunchResult r = run(o, "echo \"$KILN_NUM_THREADS $OMP_NUM_THREADS $OPENBLAS_NUM_THREADS $MKL_NUM_THREADS\"");
  const std::string t = std::to_string(std::max(1, cores / 2));
  EXPECT_EQ(with_prefix(r.out, "[rank1] "), std::vector<std::string>{t + " " + t + " " + t + " " + t});
}

TEST_F(Launcher, RejectsBadOptionsNamingTheValueAndRange) {
  auto bad = [](auto change, const std::vector<std::string>& parts) {
    LaunchOptions o;
    o.command = {"true"};
    change(o);
    expect_error<ValueError>([&] { launch(o); }, parts);
  };
  bad([](LaunchOptions& o) { o.nproc_per_node = 0; }, {"--nproc_per_node", "[1, 1024]", "nproc_per_node=0"});
  bad([](LaunchOptions& o) { o.nnodes = -2; }, {"--nnodes", "nnodes=-2"});
  bad(
      [](LaunchOptions& o) {
        o.nnodes = 2;
        o.node_rank = 2;
      },
      {"--node_rank", "[0, 1]", "node_rank=2"});
  bad([](LaunchOptions& o) { o.master_port = 70000; }, {"--master_port", "[1, 65535]", "master_port=70000"});
  bad([](LaunchOptions& o) { o.max_restarts = -1; }, {"--max_restarts", "max_restarts=-1"});
  bad([](LaunchOptions& o) { o.threads_per_rank = -1; }, {"--threads_per_rank", "threads_per_rank=-1"});
  bad([](LaunchOptions& o) { o.grace_seconds = -1; }, {"--grace_seconds", "grace_seconds=-1"});
  bad([](LaunchOptions& o) { o.master_addr = ""; }, {"--master_addr"});
  bad([](LaunchOptions& o) { o.command.clear(); },
      {"kiln launch: no program to run; put it after `--`, e.g. kiln launch --nproc_per_node 2 -- kiln train "
       "spec.json"});
}

TEST_F(Launcher, RestoresTheSignalHandlers) {
  struct sigaction mine {};
  mine.sa_handler = [](int) {};
  sigemptyset(&mine.sa_mask);
  struct sigaction saved {};
  ASSERT_EQ(sigaction(SIGHUP, &mine, &saved), 0);
  struct sigaction before[4], after[4];
  const int sigs[4] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};
  for (int i = 0; i < 4; ++i) sigaction(sigs[i], nullptr, &before[i]);
  LaunchOptions o;
  o.nproc_per_node = 2;
  EXPECT_EQ(run(o, "true").status, 0);
  for (int i = 0; i < 4; ++i) {
    sigaction(sigs[i], nullptr, &after[i]);
    EXPECT_EQ(after[i].sa_handler, before[i].sa_handler) << sigs[i];
  }
  EXPECT_EQ(after[2].sa_handler, mine.sa_handler);
  sigaction(SIGHUP, &saved, nullptr);
}

TEST_F(Launcher, RejectsASecondLaunchWhileOneRuns) {
  // The first launch's rank holds until the FIFO opens; the second call
  // comes while it runs.
  ASSERT_EQ(mkfifo(path("go").c_str(), 0600), 0);
  LaunchOptions first;
  first.command = {"sh", "-c", "read x < " + path("go")};
  first.out_fd = first.err_fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
  int status = -1;
  std::thread t([&] { status = launch(first); });
  // Opening the FIFO for writing returns once the rank opened it to read:
  // the first launch() is running by then.
  int fd = open(path("go").c_str(), O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  LaunchOptions second;
  second.command = {"true"};
  expect_error<StateError>([&] { launch(second); }, {"already running"});
  EXPECT_EQ(write(fd, "x\n", 2), 2);
  close(fd);
  t.join();
  close(first.out_fd);
  EXPECT_EQ(status, 0);
}

// --- parameter-server mode ---------------------------------------------------------------------

// Sets T (chief, worker or ps) and I (its index) from the task's TF_CONFIG.
const std::string kTaskOfTfConfig = R"sh(T=$(echo "$TF_CONFIG" | sed 's/.*"type": *"\([a-z]*\)".*/\1/'); )sh"
                                    R"sh(I=$(echo "$TF_CONFIG" | sed 's/.*"index": *\([0-9]*\).*/\1/'); )sh";

// Sets (or unsets) a variable of this process for the scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      setenv(name, value, 1);
    else
      unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      setenv(name_.c_str(), old_->c_str(), 1);
    else
      unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

LaunchOptions ps_options(int num_ps, int num_workers) {
  LaunchOptions o;
  o.num_ps = num_ps;
  o.num_workers = num_workers;
  o.grace_seconds = 30;  // SIGTERM ends `sleep` at once; SIGKILL would come too late for the bounds
  return o;
}

TEST_F(Launcher, PsModeGivesEachTaskItsTfConfig) {
  // The launcher's own torchrun variables and TF_CONFIG reach no task.
  ScopedEnv rank("RANK", "5"), world("WORLD_SIZE", "9"), master("MASTER_ADDR", "10.1.1.1"),
      tf("TF_CONFIG", "{\"stale\": true}");
  ASSERT_EQ(mkfifo(path("done").c_str(), 0600), 0);
  const int workers = 2, ps = 2;
  LaunchOptions o = ps_options(ps, workers);
  // The chief waits for a line from every other task (it holds the FIFO open
  // both ways, so its reads block instead of seeing EOF between writers);
  // its exit would stop them.
  LaunchResult r = run(o, kTaskOfTfConfig +
                              "echo \"$TF_CONFIG\"; echo \"env ${RANK-unset} ${WORLD_SIZE-unset} ${MASTER_ADDR-unset} "
                              "$KILN_RESTART_COUNT $KILN_NUM_THREADS $OMP_NUM_THREADS\"; if [ $T = chief ]; then "
                              "exec 3<> " +
                              path("done") + "; n=0; while [ $n -lt " + std::to_string(workers + ps) +
                              " ]; do read x <&3; n=$((n+1)); done; else echo $T$I > " + path("done") + "; fi");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err.find("restart"), std::string::npos) << r.err;
  const std::string threads = std::to_string(std::max(1, available_cores() / (1 + workers)));
  EXPECT_EQ(threads_per_rank(o), std::max(1, available_cores() / (1 + workers)));
  const std::vector<std::pair<std::string, int>> roles = {{"chief", 1}, {"worker", workers}, {"ps", ps}};
  std::optional<Json> cluster;
  std::vector<int> ports;
  for (auto& [type, count] : roles)
    for (int i = 0; i < count; ++i) {
      const std::string prefix = "[" + type + std::to_string(i) + "] ";
      std::vector<std::string> got = with_prefix(r.out, prefix);
      ASSERT_EQ(got.size(), 2u) << prefix << "\n" << r.out;
      const std::string t = type == "ps" ? "1" : threads;
      EXPECT_EQ(got[1], "env unset unset unset 0 " + t + " " + t) << prefix;
      const Json config = parse_json(got[0], prefix + "TF_CONFIG");
      ASSERT_TRUE(config.is_object()) << got[0];
      EXPECT_EQ(config.size(), 2u) << got[0];
      EXPECT_EQ(config["task"].size(), 2u) << got[0];
      EXPECT_EQ(config["task"]["type"], type) << got[0];
      EXPECT_EQ(config["task"]["index"], i) << got[0];
      if (!cluster) cluster = config["cluster"];
      EXPECT_EQ(config["cluster"], *cluster) << "every task sees the same cluster";
    }
  ASSERT_TRUE(cluster && cluster->is_object());
  EXPECT_EQ(cluster->size(), 3u) << cluster->dump();
  for (auto& [type, count] : roles) {
    ASSERT_TRUE(cluster->contains(type)) << cluster->dump();
    const Json& list = (*cluster)[type];
    ASSERT_EQ(list.size(), static_cast<size_t>(count)) << cluster->dump();
    for (const Json& address : list) {
      std::smatch m;
      const std::string a = address.get<std::string>();
      ASSERT_TRUE(std::regex_match(a, m, std::regex(R"(127\.0\.0\.1:(\d+))"))) << a;
      ports.push_back(std::stoi(m[1]));
      EXPECT_GT(ports.back(), 0);
      EXPECT_LT(ports.back(), 65536);
    }
  }
  std::sort(ports.begin(), ports.end());
  EXPECT_EQ(std::adjacent_find(ports.begin(), ports.end()), ports.end()) << cluster->dump();
}

TEST_F(Launcher, PsModeRestartsAKilledWorkerAlone) {
  ASSERT_EQ(mkfifo(path("back").c_str(), 0600), 0);
  LaunchOptions o = ps_options(1, 2);
  o.max_restarts = 3;
  // Worker 1 kills itself on its first start; started again, it tells the
  // chief through the FIFO (whose open blocks until both ends are there)
  // and finishes. The others run until the chief is done.
  // Worker 0 and ps 0 leave a file once their line is out, and the chief
  // waits for both (60 s at most), so it cannot end the job before they
  // have spoken.
  const std::string started = path("started-");
  LaunchResult r =
      run(o, kTaskOfTfConfig + "echo \"start $KILN_RESTART_COUNT $TF_CONFIG\"; case $T in chief) i=0; until [ -e " +
                 started + "worker0 ] && [ -e " + started +
                 "ps0 ]; do i=$((i+1)); if [ $i -gt 600 ]; then exit 9; fi; sleep 0.1; done; read x < " + path("back") +
                 "; echo \"chief got $x\";; worker) if [ $I = 1 ]; then "
                 "if [ $KILN_RESTART_COUNT = 0 ]; then kill -9 $$; fi; echo back > " +
                 path("back") + "; exit 0; fi; touch " + started + "$T$I; exec sleep 1000;; *) touch " + started +
                 "$T$I; exec sleep 1000;; esac");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_LT(r.seconds, 20);
  std::vector<std::string> chief = with_prefix(r.out, "[chief0] ");
  ASSERT_EQ(chief.size(), 2u) << r.out;  // started once
  EXPECT_EQ(chief[0].rfind("start 0 {", 0), 0u) << chief[0];
  EXPECT_EQ(chief[1], "chief got back");
  std::vector<std::string> worker1 = with_prefix(r.out, "[worker1] ");
  ASSERT_EQ(worker1.size(), 2u) << r.out;
  EXPECT_EQ(worker1[0].rfind("start 0 {", 0), 0u) << worker1[0];
  EXPECT_EQ(worker1[1], "start 1 " + worker1[0].substr(std::string("start 0 ").size())) << "the same TF_CONFIG";
  EXPECT_EQ(with_prefix(r.out, "[worker0] ").size(), 1u) << r.out;  // untouched
  EXPECT_EQ(with_prefix(r.out, "[ps0] ").size(), 1u) << r.out;
  std::vector<std::string> err = lines_of(r.err);
  ASSERT_EQ(err.size(), 2u) << r.err;
  EXPECT_TRUE(std::regex_match(err[0], std::regex(R"(kiln launch: worker 1 \(pid \d+\) was killed by signal 9 )"
                                                  R"(\(SIGKILL\); restarting it \(restart 1 of 3\))")))
      << err[0];
  EXPECT_TRUE(std::regex_match(
      err[1], std::regex(R"(kiln launch: chief 0 \(pid \d+\) exited with status 0; stopping the other tasks)")))
      << err[1];
}

TEST_F(Launcher, PsModeGoesOnWithoutATaskThatHasNoRestartLeft) {
  LaunchOptions o = ps_options(1, 1);
  o.max_restarts = 1;
  // The ps task always fails; the chief finishes once the launcher said it
  // gave up on it (its line in the launcher's stderr file; 60 s at most).
  LaunchResult r =
      run(o, kTaskOfTfConfig +
                 "case $T in ps) echo \"try $KILN_RESTART_COUNT\"; exit 4;; worker) exec sleep 1000;; "
                 "chief) i=0; until grep -q 'no restart left' " +
                 path("err.txt") + "; do i=$((i+1)); if [ $i -gt 600 ]; then exit 9; fi; sleep 0.1; done;; esac");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(with_prefix(r.out, "[ps0] "), (std::vector<std::string>{"try 0", "try 1"}));
  std::vector<std::string> err = lines_of(r.err);
  ASSERT_EQ(err.size(), 3u) << r.err;
  EXPECT_TRUE(std::regex_match(err[0], std::regex(R"(kiln launch: ps 0 \(pid \d+\) exited with status 4; )"
                                                  R"(restarting it \(restart 1 of 1\))")))
      << err[0];
  EXPECT_TRUE(
      std::regex_match(err[1], std::regex(R"(kiln launch: ps 0 \(pid \d+\) exited with status 4; )"
                                          R"(no restart left \(--max_restarts 1\); the job goes on without it)")))
      << err[1];
  EXPECT_TRUE(std::regex_match(
      err[2], std::regex(R"(kiln launch: chief 0 \(pid \d+\) exited with status 0; stopping the other tasks)")))
      << err[2];
}

TEST_F(Launcher, PsModeEndsWithTheChiefsStatusAndStopsTheRest) {
  ASSERT_EQ(mkfifo(path("ready").c_str(), 0600), 0);
  LaunchOptions o = ps_options(1, 1);
  o.grace_seconds = 0.5;
  o.max_restarts = 5;
  // The ps task ignores SIGTERM (and runs forever): SIGKILL after the grace
  // period. The chief fails once the ps task is set (the FIFO's open blocks
  // until both ends are there), and is not restarted.
  LaunchResult r = run(o, kTaskOfTfConfig + "case $T in ps) trap '' TERM; echo > " + path("ready") +
                              "; exec sleep 1000;; worker) exec sleep 1000;; chief) echo \"chief "
                              "$KILN_RESTART_COUNT\"; read x < " +
                              path("ready") + "; exit 3;; esac");
  EXPECT_EQ(r.status, 3) << r.err;
  EXPECT_GE(r.seconds, 0.5);
  EXPECT_LT(r.seconds, 20);
  EXPECT_EQ(with_prefix(r.out, "[chief0] "), std::vector<std::string>{"chief 0"});
  std::vector<std::string> err = lines_of(r.err);
  ASSERT_EQ(err.size(), 1u) << r.err;
  EXPECT_TRUE(std::regex_match(
      err[0], std::regex(R"(kiln launch: chief 0 \(pid \d+\) exited with status 3; stopping the other tasks)")))
      << err[0];

  // A chief killed by a signal: 128 + the signal.
  o.grace_seconds = 30;
  r = run(o, kTaskOfTfConfig + "case $T in ps) echo > " + path("ready") +
                 "; exec sleep 1000;; worker) exec sleep 1000;; chief) read x < " + path("ready") +
                 "; kill -9 $$;; esac");
  EXPECT_EQ(r.status, 128 + 9) << r.err;
  EXPECT_LT(r.seconds, 20);
  err = lines_of(r.err);
  ASSERT_EQ(err.size(), 1u) << r.err;
  EXPECT_TRUE(std::regex_match(err[0], std::regex(R"(kiln launch: chief 0 \(pid \d+\) was killed by signal 9 )"
                                                  R"(\(SIGKILL\); stopping the other tasks)")))
      << err[0];
}

TEST_F(Launcher, RejectsParameterServerOptionsThatDoNotGoTogether) {
  auto bad = [](auto change, const std::vector<std::string>& parts) {
    LaunchOptions o;
    o.command = {"true"};
    o.num_ps = 1;
    o.num_workers = 1;
    change(o);
    expect_error<ValueError>([&] { launch(o); }, parts);
  };
  bad([](LaunchOptions& o) { o.nproc_per_node = 2; },
      {"--num_ps and --nproc_per_node do not go together", "drop --nproc_per_node", "num_ps=1", "nproc_per_node=2"});
  bad([](LaunchOptions& o) { o.nnodes = 2; }, {"--num_ps and --nnodes", "nnodes=2"});
  bad([](LaunchOptions& o) { o.num_workers = 0; }, {"--num_workers", "[1, 1024]", "num_workers=0"});
  bad([](LaunchOptions& o) { o.num_workers = 1025; }, {"--num_workers", "[0, 1024]", "num_workers=1025"});
  bad([](LaunchOptions& o) { o.num_ps = 65; }, {"--num_ps", "[0, 64]", "num_ps=65"});
  bad([](LaunchOptions& o) { o.num_ps = -1; }, {"--num_ps", "num_ps=-1"});
  bad([](LaunchOptions& o) { o.num_ps = 0; }, {"--num_workers needs --num_ps", "num_workers=1"});
}

// --- through the CLI ----------------------------------------------------------------------------

TEST_F(Launcher, CliRunsTheRanks) {
  KILN_SKIP_WITHOUT_CLI();
  CommandResult r = kiln::run_command(cli_path() + " launch --nproc_per_node 2 -- sh -c 'echo $RANK'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> lines = lines_of(r.output);
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines, (std::vector<std::string>{"[rank0] 0", "[rank1] 1"}));
}

TEST_F(Launcher, CliPassesEverythingAfterDashesVerbatim) {
  KILN_SKIP_WITHOUT_CLI();
  CommandResult r = kiln::run_command(cli_path() +
                                      " launch --nproc_per_node 2 -- sh -c 'echo \"$@\"' x --threads 1 train "
                                      "x.json --epochs 3 --nproc_per_node 5 --help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(with_prefix(r.output, "[rank1] "),
            std::vector<std::string>{"--threads 1 train x.json --epochs 3 --nproc_per_node 5 --help"})
      << r.output;
  // PROGRAM "kiln" is this kiln, with its own options.
  r = kiln::run_command(cli_path() + " launch --nproc_per_node 2 -- kiln --threads 1 show --help");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(with_prefix(r.output, "[rank0] ").empty()) << r.output;
  EXPECT_FALSE(with_prefix(r.output, "[rank1] ").empty()) << r.output;
  EXPECT_NE(r.output.find("[rank1] Usage: kiln show"), std::string::npos) << r.output;
}

TEST_F(Launcher, CliReportsBadArgumentsOnOneLine) {
  KILN_SKIP_WITHOUT_CLI();
  for (const std::string& args :
       {std::string("launch --nproc_per_node 0 -- true"), std::string("launch --nproc_per_node 2"),
        std::string("launch --nproc_per_node 2 --"), std::string("launch --nproc_per_node 2 true"),
        std::string("launch --nproc_per_node two -- true"), std::string("launch --master_port 0 -- true"),
        std::string("launch --num_ps 1 --num_workers 1 --nproc_per_node 2 -- true"),
        std::string("launch --num_workers 2 -- true"), std::string("launch --num_ps 1 -- true")}) {
    CommandResult r = kiln::run_command(cli_path() + " " + args);
    EXPECT_EQ(r.exit_code, 2) << args << ": " << r.output;
    std::vector<std::string> lines = lines_of(r.output);
    ASSERT_EQ(lines.size(), 1u) << args << ": " << r.output;
    EXPECT_EQ(lines[0].rfind("kiln: error: ", 0), 0u) << lines[0];
  }
  CommandResult r = kiln::run_command(cli_path() + " launch --nproc_per_node 0 -- true");
  EXPECT_NE(r.output.find("--nproc_per_node"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[1, 1024]"), std::string::npos) << r.output;
  r = kiln::run_command(cli_path() + " launch --nproc_per_node 2 --");
  EXPECT_NE(r.output.find("no program to run; put it after `--`"), std::string::npos) << r.output;
  r = kiln::run_command(cli_path() + " launch --nproc_per_node 2 true");
  EXPECT_NE(r.output.find("put the program after `--`"), std::string::npos) << r.output;
  r = kiln::run_command(cli_path() + " launch --num-ps 1 --num-workers 1 --nproc_per_node 2 -- true");
  EXPECT_NE(r.output.find("--num_ps and --nproc_per_node do not go together"), std::string::npos) << r.output;
}

TEST_F(Launcher, CliRunsAParameterServerJob) {
  KILN_SKIP_WITHOUT_CLI();
  ASSERT_EQ(mkfifo(path("done").c_str(), 0600), 0);
  // The chief waits for a line from the worker and the ps task.
  {
    std::ofstream script(path("task.sh"));
    script << kTaskOfTfConfig << "echo \"$T $I $KILN_RESTART_COUNT\"\n"
           << "if [ $T = chief ]; then exec 3<> " << path("done") << "; read x <&3; read x <&3; else echo $T > "
           << path("done") << "; fi\n";
  }
  CommandResult r =
      kiln::run_command(cli_path() + " launch --num_ps 1 --num_workers 1 --max_restarts 2 -- sh " + path("task.sh"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(with_prefix(r.output, "[chief0] "), std::vector<std::string>{"chief 0 0"}) << r.output;
  EXPECT_EQ(with_prefix(r.output, "[worker0] "), std::vector<std::string>{"worker 0 0"}) << r.output;
  EXPECT_EQ(with_prefix(r.output, "[ps0] "), std::vector<std::string>{"ps 0 0"}) << r.output;
}

TEST_F(Launcher, CliExitsWithTheFailingRanksStatus) {
  KILN_SKIP_WITHOUT_CLI();
  CommandResult r = kiln::run_command(cli_path() +
                                      " launch --nproc_per_node 2 -- sh -c 'if [ $RANK = 1 ]; then exit 7; fi; "
                                      "exec sleep 1000'");
  EXPECT_EQ(r.exit_code, 7) << r.output;
  EXPECT_NE(r.output.find("kiln launch: rank 1 (pid "), std::string::npos) << r.output;
}

// A `kiln launch` subprocess with its stdout+stderr on a pipe.
class CliProcess {
 public:
  explicit CliProcess(const std::vector<std::string>& args) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t defaults;
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGPIPE);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], &fa, &attr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    fd_ = fds[0];
  }
  ~CliProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) close(fd_);
  }
  pid_t pid() const { return pid_; }
  const std::string& output() const { return output_; }

  // Reads until `done(output)` holds, EOF or the deadline; true if it held.
  template <class F>
  bool read_until(F done, double seconds) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int>(seconds * 1000));
    while (!done(output_) && !eof_) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char buf[4096];
      ssize_t n = read(fd_, buf, sizeof buf);
      if (n <= 0)
        eof_ = true;
      else
        output_.append(buf, static_cast<size_t>(n));
    }
    return done(output_);
  }
  // Reads to EOF (the launcher's exit closes the pipe: its ranks never held
  // it) and returns the exit status (128+signal if killed); -1 if EOF did
  // not come within `seconds`.
  int wait(double seconds) {
    read_until([](const std::string&) { return false; }, seconds);
    if (!eof_) return -1;
    int status = 0;
    if (waitpid(pid_, &status, 0) != pid_) return -1;
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  bool eof_ = false;
  std::string output_;
};

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST_F(Launcher, CliForwardsSignalsToEveryRank) {
  KILN_SKIP_WITHOUT_CLI();
  // SIGINT also checks that a rank's leftovers go with it: the background
  // `sleep` of a non-interactive shell ignores SIGINT, so only the group's
  // SIGKILL after its shell exited ends it (else the pipe never closes).
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) {
    const std::string name = sig == SIGTERM ? "TERM" : sig == SIGINT ? "INT" : "HUP";
    CliProcess p({cli_path(), "launch", "--nproc_per_node", "2", "--", "sh", "-c",
                  "trap 'echo got " + name + "; exit 0' " + name + "; echo ready; sleep 1000 & wait"});
    ASSERT_GT(p.pid(), 0);
    ASSERT_TRUE(
        p.read_until([](const std::string& s) { return has(s, "[rank0] ready\n") && has(s, "[rank1] ready\n"); }, 120))
        << p.output();
    ASSERT_EQ(kill(p.pid(), sig), 0);
    const int status = p.wait(60);
    EXPECT_EQ(status, 128 + sig) << name << ": " << p.output();
    EXPECT_TRUE(has(p.output(), "[rank0] got " + name + "\n")) << p.output();
    EXPECT_TRUE(has(p.output(), "[rank1] got " + name + "\n")) << p.output();
    EXPECT_TRUE(has(p.output(), "kiln launch: got SIG" + name + "; passing it to every rank\n")) << p.output();
  }
}

}  // namespace
}  // namespace kiln::distribute::launcher_test
