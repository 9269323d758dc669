#include "kiln/distribute/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/core/json.h"
#include "kiln/core/subprocess.h"

namespace kiln::distribute {
// Named, so that the unity build (several .cc files of this folder in one
// translation unit) never mixes these helpers with another file's.
namespace launcher_internal {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kMaxNprocPerNode = 1024;
constexpr int kMaxNnodes = 65536;
constexpr int kMaxRestarts = 1000000;
constexpr int kMaxThreadsPerRank = 65536;
constexpr int kMaxNumPs = 64;
constexpr int kMaxNumWorkers = 1024;
constexpr double kMaxGraceSeconds = 86400;
// A line longer than this is passed on in pieces of this size.
constexpr size_t kMaxLine = 64 * 1024;
// How long output is still read after the last task exited (only processes
// that left their task's process group can still hold a pipe then).
constexpr auto kDrainAfterExit = std::chrono::seconds(2);

// Signals the launcher handles while launch() runs: the forwarded ones and
// SIGCHLD.
constexpr int kHandled[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};

// The self-pipe's write end; the handler writes the signal's number to it,
// and the poll() loop reads it.
std::atomic<int> g_wake_fd{-1};
std::atomic<bool> g_running{false};

extern "C" void on_launcher_signal(int sig) {
  const int saved = errno;
  const int fd = g_wake_fd.load();
  const unsigned char b = static_cast<unsigned char>(sig);
  if (fd >= 0) (void)!write(fd, &b, 1);  // full pipe: a wake-up is pending anyway
  errno = saved;
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

// Writes all of `s`; gives up silently on a closed reader (EPIPE), as a
// launcher piped into `head` should.
void write_all(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    ssize_t n = write(fd, s.data() + done, s.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      poll(&p, 1, -1);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      return;
    }
  }
}

void say(int err_fd, const std::string& line) { write_all(err_fd, "kiln launch: " + line + "\n"); }

// Installs the launcher's handlers and the self-pipe; the destructor puts the
// previous handlers back.
class SignalScope {
 public:
  SignalScope() {
    if (pipe2(fds_, O_CLOEXEC | O_NONBLOCK) != 0)
      throw IOError(std::string("kiln launch: cannot create a pipe: ") + std::strerror(errno));
    g_wake_fd.store(fds_[1]);
    struct sigaction sa {};
    sa.sa_handler = on_launcher_signal;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < std::size(kHandled); ++i) {
      sa.sa_flags = SA_RESTART | (kHandled[i] == SIGCHLD ? SA_NOCLDSTOP : 0);
      sigaction(kHandled[i], &sa, &old_[i]);
    }
  }
  ~SignalScope() {
    for (size_t i = 0; i < std::size(kHandled); ++i) sigaction(kHandled[i], &old_[i], nullptr);
    g_wake_fd.store(-1);
    close(fds_[0]);
    close(fds_[1]);
  }
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

  int read_fd() const { return fds_[0]; }

  // The signals received since the last call (SIGCHLD possibly repeated).
  std::vector<int> take() {
    std::vector<int> sigs;
    unsigned char buf[256];
    ssize_t n;
    while ((n = read(fds_[0], buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR))
      for (ssize_t i = 0; i < n; ++i) sigs.push_back(buf[i]);
    return sigs;
  }

 private:
  int fds_[2] = {-1, -1};
  struct sigaction old_[std::size(kHandled)];
};

// One of a task's pipes (stdout or stderr): reads what it has, passes whole
// lines on with the task's prefix.
class LineForwarder {
 public:
  LineForwarder(int fd, int dest, std::string prefix) : fd_(fd), dest_(dest), prefix_(std::move(prefix)) {}
  ~LineForwarder() { close_fd(); }
  LineForwarder(const LineForwarder&) = delete;
  LineForwarder& operator=(const LineForwarder&) = delete;

  bool open() const { return fd_ >= 0; }
  int fd() const { return fd_; }

  // Reads what is there now (the fd is non-blocking); at EOF passes on the
  // last partial line and closes. `all`: read until the pipe is empty.
  void read_available(bool all) {
    char buf[16384];
    while (fd_ >= 0) {
      ssize_t n = read(fd_, buf, sizeof buf);
      if (n > 0) {
        pending_.append(buf, static_cast<size_t>(n));
        emit_lines();
        if (!all) return;
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && errno == EAGAIN) {
        return;
      } else {
        finish();
        return;
      }
    }
  }

  // Passes on what is left and closes the pipe.
  void finish() {
    if (!pending_.empty()) write_all(dest_, prefix_ + pending_ + "\n");
    pending_.clear();
    close_fd();
  }

 private:
  void emit_lines() {
    std::string out;
    size_t start = 0;
    for (;;) {
      const size_t nl = pending_.find('\n', start);
      if (nl == std::string::npos || nl - start > kMaxLine) {
        if (pending_.size() - start < kMaxLine) break;  // wait for the rest of the line
        // An over-long line: pass on a piece (whatever the reads' sizes).
        out += prefix_;
        out.append(pending_, start, kMaxLine);
        out += '\n';
        start += kMaxLine;
        continue;
      }
      out += prefix_;
      out.append(pending_, start, nl + 1 - start);
      start = nl + 1;
    }
    pending_.erase(0, start);
    if (!out.empty()) write_all(dest_, out);
  }
  void close_fd() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

  int fd_;
  int dest_;
  std::string prefix_;
  std::string pending_;
};

// What the launcher does when a task exits; the mode decides it per task.
enum class OnExit {
  // A rank: a failure stops every task (launch() may then start the whole
  // group again).
  kFailureStopsJob,
  // The chief of a parameter-server job: any exit ends the job.
  kEndsJob,
  // A worker or ps task: a failure restarts it alone while it has restarts
  // left; the others go on.
  kRestartAlone,
};

// One process of the job, as its mode defines it.
struct TaskSpec {
  std::string name;              // in the launcher's lines: "rank 1", "worker 0"
  std::string prefix;            // of its output lines: "[rank1] ", "[worker0] "
  std::vector<std::string> env;  // "K=V" set for it, besides the restart count
  OnExit on_exit = OnExit::kFailureStopsJob;
};

// Everything a start of a task needs.
struct Prepared {
  std::string file;  // what exec runs (a name without '/' is searched in PATH)
  std::vector<std::string> argv;
  std::vector<std::string> unset_env;          // the launcher's variables the tasks do not inherit
  std::vector<std::string> restart_variables;  // set to the task's restart count
  std::vector<TaskSpec> tasks;
  std::string unit;        // "rank" or "task", in the launcher's lines
  int group_restarts = 0;  // restarts of the whole group (rank mode)
};

// A running (or exited) task.
struct Task {
  const TaskSpec* spec = nullptr;
  int restarts = 0;                     // its own restarts (kRestartAlone)
  std::unique_ptr<Subprocess> process;  // leads a process group of its own
  bool alive = false;
  std::unique_ptr<LineForwarder> out, err;
};

// The variables the launcher sets, removed from what the tasks inherit.
const char* const kRankVariables[] = {"RANK",
                                      "WORLD_SIZE",
                                      "LOCAL_RANK",
                                      "LOCAL_WORLD_SIZE",
                                      "GROUP_RANK",
                                      "NODE_RANK",
                                      "GROUP_WORLD_SIZE",
                                      "MASTER_ADDR",
                                      "MASTER_PORT",
                                      "TORCHELASTIC_RESTART_COUNT",
                                      "TORCHELASTIC_MAX_RESTARTS",
                                      "KILN_RESTART_COUNT",
                                      "KILN_NUM_THREADS",
                                      "OMP_NUM_THREADS",
                                      "OPENBLAS_NUM_THREADS",
                                      "MKL_NUM_THREADS"};

std::string variable(const char* k, const std::string& v) { return std::string(k) + "=" + v; }

void add_thread_variables(std::vector<std::string>& env, int threads) {
  for (const char* k : {"KILN_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"})
    env.push_back(variable(k, std::to_string(threads)));
}

// The ranks of this host, with torchrun's variables.
std::vector<TaskSpec> rank_tasks(const LaunchOptions& o) {
  const int threads = threads_per_rank(o);
  std::vector<TaskSpec> tasks(o.nproc_per_node);
  for (int local = 0; local < o.nproc_per_node; ++local) {
    const int rank = o.node_rank * o.nproc_per_node + local;
    TaskSpec& t = tasks[local];
    t.name = "rank " + std::to_string(rank);
    t.prefix = "[rank" + std::to_string(rank) + "] ";
    t.env = {variable("RANK", std::to_string(rank)),
             variable("WORLD_SIZE", std::to_string(o.nnodes * o.nproc_per_node)),
             variable("LOCAL_RANK", std::to_string(local)),
             variable("LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node)),
             variable("GROUP_RANK", std::to_string(o.node_rank)),
             variable("NODE_RANK", std::to_string(o.node_rank)),
             variable("GROUP_WORLD_SIZE", std::to_string(o.nnodes)),
             variable("MASTER_ADDR", o.master_addr),
             variable("MASTER_PORT", std::to_string(o.master_port)),
             variable("TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts))};
    add_thread_variables(t.env, threads);
  }
  return tasks;
}

// `n` distinct free ports of 127.0.0.1: each stays bound (to port 0: the
// kernel picks) until all are chosen, so no two are the same.
std::vector<int> free_loopback_ports(int n) {
  std::vector<int> fds, ports;
  auto close_all = [&fds] {
    for (int fd : fds) close(fd);
  };
  for (int i = 0; i < n; ++i) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0) fds.push_back(fd);
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      const int e = errno;
      close_all();
      throw IOError(std::string("kiln launch: cannot pick a free port on 127.0.0.1: ") + std::strerror(e));
    }
    ports.push_back(ntohs(a.sin_port));
  }
  close_all();
  return ports;
}

// 1 chief, num_workers workers and num_ps ps tasks, each with TF_CONFIG
// (tf.distribute's format) naming a port of its own on 127.0.0.1.
std::vector<TaskSpec> ps_tasks(const LaunchOptions& o) {
  const std::vector<std::pair<const char*, int>> roles = {{"chief", 1}, {"worker", o.num_workers}, {"ps", o.num_ps}};
  const std::vector<int> ports = free_loopback_ports(1 + o.num_workers + o.num_ps);
  Json cluster = Json::object();
  size_t next = 0;
  for (auto& [role, count] : roles) {
    Json& list = cluster[role] = Json::array();
    for (int i = 0; i < count; ++i) list.push_back("127.0.0.1:" + std::to_string(ports[next++]));
  }
  std::vector<TaskSpec> tasks;
  for (auto& [role, count] : roles)
    for (int i = 0; i < count; ++i) {
      const std::string type = role;
      Json config = Json::object();
      config["cluster"] = cluster;
      config["task"] = Json::object();
      config["task"]["type"] = type;
      config["task"]["index"] = i;
      TaskSpec t;
      t.name = type + " " + std::to_string(i);
      t.prefix = "[" + type + std::to_string(i) + "] ";
      t.env = {variable("TF_CONFIG", config.dump())};
      // A ps task serves variables: one thread; the chief and the workers
      // compute.
      add_thread_variables(t.env, type == "ps" ? 1 : threads_per_rank(o));
      t.on_exit = type == "chief" ? OnExit::kEndsJob : OnExit::kRestartAlone;
      tasks.push_back(std::move(t));
    }
  return tasks;
}

Prepared prepare(const LaunchOptions& o) {
  const bool ps = o.num_ps > 0;
  Prepared p;
  p.argv = o.command;
  p.file = o.command[0];
  if (p.file == "kiln") {
    char buf[4096];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) throw IOError("kiln launch: cannot find the kiln executable (/proc/self/exe)");
    p.file.assign(buf, static_cast<size_t>(n));
  }
  // A parameter-server task inherits none of torchrun's variables either:
  // kiln's resolvers would take it for a data-parallel rank.
  p.unset_env.assign(std::begin(kRankVariables), std::end(kRankVariables));
  if (ps) p.unset_env.push_back("TF_CONFIG");
  if (ps) {
    p.restart_variables = {"KILN_RESTART_COUNT"};
    p.tasks = ps_tasks(o);
    p.unit = "task";
  } else {
    p.restart_variables = {"TORCHELASTIC_RESTART_COUNT", "KILN_RESTART_COUNT"};
    p.tasks = rank_tasks(o);
    p.unit = "rank";
    p.group_restarts = o.max_restarts;
  }
  return p;
}

// Starts one task as its `restart`th start. IOError when no process could be
// started; a program that cannot be executed is a task that exits 127 with
// exec's errno kept (the launcher reports it like any other exit).
void spawn(const LaunchOptions& o, const Prepared& p, int restart, Task& t) {
  SubprocessOptions so{.program = p.file, .argv = p.argv, .env_remove = p.unset_env, .env_set = t.spec->env};
  for (const std::string& k : p.restart_variables) so.env_set.push_back(variable(k.c_str(), std::to_string(restart)));
  so.stdin_from = Stdio::kNull;
  so.stdout_to = so.stderr_to = Stdio::kPipe;
  so.new_process_group = true;
  so.throw_on_exec_failure = false;
  t.process = std::make_unique<Subprocess>(so);
  t.alive = true;
  const int out = t.process->take_stdout(), err = t.process->take_stderr();
  fcntl(out, F_SETFL, O_NONBLOCK);
  fcntl(err, F_SETFL, O_NONBLOCK);
  t.out = std::make_unique<LineForwarder>(out, o.out_fd, t.spec->prefix);
  t.err = std::make_unique<LineForwarder>(err, o.err_fd, t.spec->prefix);
}

struct Outcome {
  int status = 0;       // 0: every rank exited 0 (or the chief did)
  int interrupted = 0;  // the signal that stopped the launcher, 0 if none
};

// One start of the whole group, until every task has exited.
class Group {
 public:
  Group(const LaunchOptions& o, const Prepared& p, int restart, SignalScope& signals)
      : o_(o), p_(p), restart_(restart), signals_(signals) {}
  // Only reached with tasks alive when an exception ends the group early:
  // each Subprocess kills and reaps its own.
  ~Group() = default;
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  Outcome run() {
    tasks_.resize(p_.tasks.size());
    for (size_t i = 0; i < tasks_.size(); ++i) tasks_[i].spec = &p_.tasks[i];
    for (size_t i = 0; i < tasks_.size() && !stopping_; ++i) try {
        spawn(o_, p_, restart_, tasks_[i]);
      } catch (const IOError& e) {
        fail("cannot start " + tasks_[i].spec->name + ": " + e.what(), 1);
      }
    loop();
    return outcome_;
  }

 private:
  bool any_alive() const {
    return std::any_of(tasks_.begin(), tasks_.end(), [](const Task& t) { return t.alive; });
  }

  void loop() {
    std::vector<pollfd> fds;
    std::vector<LineForwarder*> streams;
    for (;;) {
      const bool alive = any_alive();
      fds.clear();
      streams.clear();
      fds.push_back({signals_.read_fd(), POLLIN, 0});
      for (auto& t : tasks_)
        for (LineForwarder* s : {t.out.get(), t.err.get()})
          if (s && s->open()) streams.push_back(s);
      for (auto& s : retired_)
        if (s->open()) streams.push_back(s.get());
      for (LineForwarder* s : streams) fds.push_back({s->fd(), POLLIN, 0});
      if (!alive && streams.empty()) return;
      const auto now = Clock::now();
      if (!alive && now >= drain_deadline_) {
        // Only a process that left its task's group can hold these now.
        for (LineForwarder* s : streams) {
          s->read_available(true);
          s->finish();
        }
        return;
      }
      if (alive && stopping_ && !killed_ && now >= kill_deadline_) {
        kill_all(SIGKILL);
        killed_ = true;
      }
      int timeout = -1;
      if (!alive) timeout = ms_until(drain_deadline_, now);
      if (alive && stopping_ && !killed_) timeout = ms_until(kill_deadline_, now);
      int n = poll(fds.data(), fds.size(), timeout);
      if (n < 0) {
        if (errno == EINTR) continue;
        throw IOError(std::string("kiln launch: poll: ") + std::strerror(errno));
      }
      if (n == 0) continue;
      if (fds[0].revents) {
        bool child = false;
        for (int sig : signals_.take()) {
          if (sig == SIGCHLD)
            child = true;
          else
            forward(sig);
        }
        if (child) reap();
      }
      for (size_t i = 1; i < fds.size(); ++i)
        if (fds[i].revents) streams[i - 1]->read_available(false);
    }
  }

  static int ms_until(Clock::time_point t, Clock::time_point now) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - now).count() + 1;
    return static_cast<int>(std::clamp<long long>(ms, 0, 1 << 30));
  }

  // Collects the tasks that exited and does what their OnExit says.
  void reap() {
    bool reaped = false;
    for (auto& t : tasks_) {
      if (!t.alive) continue;
      // What is left of its group is killed as it is reaped.
      const std::optional<int> status = t.process->wait_for(std::chrono::milliseconds(0));
      if (!status) continue;
      t.alive = false;
      reaped = true;
      // Its last words come before the launcher's line about it.
      t.out->read_available(true);
      t.err->read_available(true);
      if (!stopping_) exited(t, *status);
    }
    if (reaped && !any_alive()) drain_deadline_ = Clock::now() + kDrainAfterExit;
  }

  void exited(Task& t, int status) {
    const int code = exit_code(status);
    std::string what = t.spec->name + " (pid " + std::to_string(t.process->pid()) + ") ";
    if (t.process->exec_errno() != 0)
      what += "could not run `" + o_.command[0] + "`: " + std::strerror(t.process->exec_errno()) + " (exit status " +
              std::to_string(code) + ")";
    else if (WIFSIGNALED(status))
      what += "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" + signal_name(WTERMSIG(status)) + ")";
    else
      what += "exited with status " + std::to_string(code);
    switch (t.spec->on_exit) {
      case OnExit::kFailureStopsJob:
        if (code != 0) fail(what, code);
        return;
      case OnExit::kEndsJob:
        fail(what, code);
        return;
      case OnExit::kRestartAlone:
        if (code != 0) restart_alone(t, what);
        return;
    }
  }

  // A failed task starts again by itself while it has restarts left.
  void restart_alone(Task& t, const std::string& what) {
    const std::string of = std::to_string(o_.max_restarts);
    if (t.restarts >= o_.max_restarts) {
      say(o_.err_fd, what + "; no restart left (--max_restarts " + of + "); the job goes on without it");
      return;
    }
    ++t.restarts;
    say(o_.err_fd, what + "; restarting it (restart " + std::to_string(t.restarts) + " of " + of + ")");
    // Whatever escaped its group may still write to the old pipes.
    retired_.push_back(std::move(t.out));
    retired_.push_back(std::move(t.err));
    try {
      spawn(o_, p_, restart_ + t.restarts, t);
    } catch (const IOError& e) {
      say(o_.err_fd, "cannot restart " + t.spec->name + ": " + e.what() + "; the job goes on without it");
    }
  }

  // Ends the group with `code`: says why (a zero exit that stops nothing
  // needs no line) and stops the other tasks.
  void fail(const std::string& what, int code) {
    outcome_.status = code;
    const bool others = any_alive();
    if (code != 0 || others) say(o_.err_fd, what + (others ? "; stopping the other " + p_.unit + "s" : ""));
    kill_all(SIGTERM);
    start_stopping();
  }

  void forward(int sig) {
    say(o_.err_fd, "got " + signal_name(sig) + "; passing it to every " + p_.unit);
    if (outcome_.interrupted == 0) {
      outcome_.interrupted = sig;
      if (outcome_.status == 0) outcome_.status = 128 + sig;
    }
    kill_all(sig);
    start_stopping();
  }

  void start_stopping() {
    if (stopping_) return;
    stopping_ = true;
    kill_deadline_ =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.grace_seconds));
    if (o_.grace_seconds <= 0) {
      kill_all(SIGKILL);
      killed_ = true;
    }
  }

  void kill_all(int sig) {
    for (auto& t : tasks_)
      if (t.alive) t.process->signal(sig);
  }

  const LaunchOptions& o_;
  const Prepared& p_;
  const int restart_;
  SignalScope& signals_;
  std::vector<Task> tasks_;
  // The pipes of restarted tasks' earlier processes.
  std::vector<std::unique_ptr<LineForwarder>> retired_;
  Outcome outcome_;
  bool stopping_ = false;  // the job is ending: a task failed, the chief exited or the launcher was interrupted
  bool killed_ = false;    // SIGKILL sent to every live task
  Clock::time_point kill_deadline_{};
  Clock::time_point drain_deadline_{};
};

void check_range(const char* name, long long value, long long lo, long long hi, const char* what = "") {
  if (value < lo || value > hi)
    throw ValueError(std::string("kiln launch: received an invalid value for --") + name +
                     ", expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]" + what +
                     ". Received: " + name + "=" + std::to_string(value));
}

}  // namespace
}  // namespace launcher_internal

void validate(const LaunchOptions& o) {
  using namespace launcher_internal;
  check_range("nproc_per_node", o.nproc_per_node, 1, kMaxNprocPerNode, " (ranks on this host)");
  check_range("nnodes", o.nnodes, 1, kMaxNnodes, " (hosts)");
  check_range("node_rank", o.node_rank, 0, o.nnodes - 1, " (this host's index, below --nnodes)");
  check_range("master_port", o.master_port, 1, 65535);
  check_range("max_restarts", o.max_restarts, 0, kMaxRestarts);
  check_range("threads_per_rank", o.threads_per_rank, 0, kMaxThreadsPerRank,
              " (0: the host's cores / nproc_per_node, or / (1 + num_workers) with --num_ps)");
  check_range("num_ps", o.num_ps, 0, kMaxNumPs, " (parameter-server tasks; 0: no parameter-server mode)");
  check_range("num_workers", o.num_workers, 0, kMaxNumWorkers, " (workers besides the chief, with --num_ps)");
  if (o.num_ps > 0) {
    check_range("num_workers", o.num_workers, 1, kMaxNumWorkers,
                " with --num_ps (a parameter-server job needs at least one worker)");
    // The parameter-server mode starts its own tasks, on this host only.
    using Field = std::pair<const char*, int>;
    for (auto [name, value] : {Field{"nproc_per_node", o.nproc_per_node}, Field{"nnodes", o.nnodes}})
      if (value != 1)
        throw ValueError(std::string("kiln launch: --num_ps and --") + name +
                         " do not go together: with --num_ps the launcher starts 1 chief, --num_workers workers "
                         "and --num_ps ps tasks on this host itself; drop --" +
                         name + ". Received: num_ps=" + std::to_string(o.num_ps) + ", " + name + "=" +
                         std::to_string(value));
  } else if (o.num_workers != 0) {
    throw ValueError(
        "kiln launch: --num_workers needs --num_ps (the parameter-server mode); for data-parallel ranks use "
        "--nproc_per_node. Received: num_workers=" +
        std::to_string(o.num_workers) + ", num_ps=0");
  }
  if (!(o.grace_seconds >= 0 && o.grace_seconds <= kMaxGraceSeconds))
    throw ValueError(
        "kiln launch: received an invalid value for --grace_seconds, expected a number of seconds in [0, " +
        std::to_string(static_cast<int>(kMaxGraceSeconds)) +
        "]. Received: grace_seconds=" + std::to_string(o.grace_seconds));
  if (o.master_addr.empty() || o.master_addr.find_first_of(" \t\n") != std::string::npos)
    throw ValueError(
        "kiln launch: received an invalid value for --master_addr, expected a host name or IP address. Received: "
        "master_addr='" +
        o.master_addr + "'");
  if (o.command.empty())
    throw ValueError(
        "kiln launch: no program to run; put it after `--`, e.g. kiln launch --nproc_per_node 2 -- kiln train "
        "spec.json");
  if (o.command[0].empty())
    throw ValueError(
        "kiln launch: the program to run is an empty string; put it after `--`, e.g. kiln launch "
        "--nproc_per_node 2 -- kiln train spec.json");
  if (o.out_fd < 0 || o.err_fd < 0)
    throw ValueError("kiln launch: out_fd and err_fd must be open descriptors. Received: out_fd=" +
                     std::to_string(o.out_fd) + ", err_fd=" + std::to_string(o.err_fd));
}

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

int threads_per_rank(const LaunchOptions& o) {
  if (o.threads_per_rank > 0) return o.threads_per_rank;
  const int share = o.num_ps > 0 ? 1 + o.num_workers : o.nproc_per_node;
  return std::max(1, available_cores() / std::max(1, share));
}

int launch(const LaunchOptions& o) {
  using namespace launcher_internal;
  validate(o);
  bool expected = false;
  if (!g_running.compare_exchange_strong(expected, true))
    throw StateError("kiln launch: launch() is already running in this process (it owns the signal handlers)");
  struct Release {
    ~Release() { g_running.store(false); }
  } release;

  const Prepared p = prepare(o);
  SignalScope signals;
  for (int restart = 0;; ++restart) {
    Outcome r = Group(o, p, restart, signals).run();
    // (A parameter-server job restarts its tasks one by one, never the
    // whole group.)
    if (r.status == 0 || r.interrupted != 0 || restart >= p.group_restarts) return r.status;
    // A signal that came while the group was being stopped ends the job.
    for (int sig : signals.take())
      if (sig != SIGCHLD) {
        say(o.err_fd, "got " + signal_name(sig) + " while stopping the ranks; not restarting");
        return 128 + sig;
      }
    say(o.err_fd,
        "restarting all ranks (restart " + std::to_string(restart + 1) + " of " + std::to_string(o.max_restarts) + ")");
  }
}

}  // namespace kiln::distribute
