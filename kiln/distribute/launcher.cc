#include "kiln/distribute/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
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
#include <string>
#include <thread>
#include <vector>

#include "kiln/core/error.h"

extern char** environ;

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
constexpr double kMaxGraceSeconds = 86400;
// A line longer than this is passed on in pieces of this size.
constexpr size_t kMaxLine = 64 * 1024;
// How long output is still read after the last rank exited (only processes
// that left their rank's process group can still hold a pipe then).
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

// Blocks the handled signals in this thread for its lifetime: a child
// between fork() and its own reset must not run the launcher's handler.
class BlockSignals {
 public:
  BlockSignals() {
    sigset_t set;
    sigemptyset(&set);
    for (int s : kHandled) sigaddset(&set, s);
    pthread_sigmask(SIG_BLOCK, &set, &old_);
  }
  ~BlockSignals() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

 private:
  sigset_t old_;
};

// One of a rank's pipes (stdout or stderr): reads what it has, passes whole
// lines on with the rank's prefix.
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

struct Rank {
  int rank = 0;
  pid_t pid = -1;  // also its process group
  bool alive = false;
  int exec_errno = 0;  // why exec failed, 0 if it did not
  std::unique_ptr<LineForwarder> out, err;
};

// What a child needs, built before fork (only async-signal-safe calls
// between fork and exec).
struct Prepared {
  std::string file;  // what execvp gets
  std::vector<std::string> argv;
  std::vector<std::string> base_env;  // the launcher's, less the variables set per rank
  int threads = 1;
};

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

Prepared prepare(const LaunchOptions& o) {
  Prepared p;
  p.argv = o.command;
  p.file = o.command[0];
  if (p.file == "kiln") {
    char buf[4096];
    ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) throw IOError("kiln launch: cannot find the kiln executable (/proc/self/exe)");
    p.file.assign(buf, static_cast<size_t>(n));
  }
  for (char** e = environ; e && *e; ++e) {
    std::string s = *e;
    bool ours = false;
    for (const char* k : kRankVariables) {
      size_t len = std::strlen(k);
      if (s.size() > len && s.compare(0, len, k) == 0 && s[len] == '=') ours = true;
    }
    if (!ours) p.base_env.push_back(std::move(s));
  }
  p.threads = threads_per_rank(o);
  return p;
}

// Makes `from` the child's descriptor `to` (kept across exec).
void move_fd(int from, int to) {
  if (from == to)
    fcntl(to, F_SETFD, 0);
  else
    dup2(from, to);
}

// Starts one rank. Returns false (errno set) when no process could be started.
bool spawn(const LaunchOptions& o, const Prepared& p, int restart, Rank& r, int local) {
  const int world = o.nnodes * o.nproc_per_node;
  std::vector<std::string> env = p.base_env;
  auto set = [&env](const char* k, const std::string& v) { env.push_back(std::string(k) + "=" + v); };
  set("RANK", std::to_string(r.rank));
  set("WORLD_SIZE", std::to_string(world));
  set("LOCAL_RANK", std::to_string(local));
  set("LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node));
  set("GROUP_RANK", std::to_string(o.node_rank));
  set("NODE_RANK", std::to_string(o.node_rank));
  set("GROUP_WORLD_SIZE", std::to_string(o.nnodes));
  set("MASTER_ADDR", o.master_addr);
  set("MASTER_PORT", std::to_string(o.master_port));
  set("TORCHELASTIC_RESTART_COUNT", std::to_string(restart));
  set("TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts));
  set("KILN_RESTART_COUNT", std::to_string(restart));
  for (const char* k : {"KILN_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"})
    set(k, std::to_string(p.threads));
  std::vector<char*> cargv, cenv;
  for (auto& a : p.argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (auto& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);

  int out[2] = {-1, -1}, err[2] = {-1, -1}, status[2] = {-1, -1};
  int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  auto close_all = [&] {
    for (int fd : {out[0], out[1], err[0], err[1], status[0], status[1], devnull})
      if (fd >= 0) close(fd);
  };
  if (devnull < 0 || pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0 || pipe2(status, O_CLOEXEC) != 0) {
    int e = errno;
    close_all();
    errno = e;
    return false;
  }
  const pid_t parent = getpid();
  pid_t pid;
  {
    BlockSignals blocked;
    pid = fork();
    if (pid == 0) {
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);  // the launcher is gone already
      // Handlers and ignored signals go back to their defaults (the test
      // binary ignores SIGPIPE; ignored signals survive exec).
      for (int s : kHandled) signal(s, SIG_DFL);
      signal(SIGPIPE, SIG_DFL);
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      move_fd(devnull, 0);
      move_fd(out[1], 1);
      move_fd(err[1], 2);
      // No descriptor of the launcher's reaches the program (a rank holding
      // a pipe of the caller's would keep its reader waiting for EOF).
      if (close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) != 0)  // kernels before 5.11
        for (int fd = 3; fd < 4096; ++fd) fcntl(fd, F_SETFD, FD_CLOEXEC);
      execvpe(p.file.c_str(), cargv.data(), cenv.data());
      int e = errno;
      (void)!write(status[1], &e, sizeof e);
      _exit(127);
    }
  }
  if (pid < 0) {
    int e = errno;
    close_all();
    errno = e;
    return false;
  }
  setpgid(pid, pid);  // also here: no window where a kill of the group misses it
  close(out[1]);
  close(err[1]);
  close(status[1]);
  close(devnull);
  // Wait for exec (the status pipe closes) or its errno.
  int e = 0;
  ssize_t n;
  while ((n = read(status[0], &e, sizeof e)) < 0 && errno == EINTR) {
  }
  close(status[0]);
  r.pid = pid;
  r.alive = true;
  r.exec_errno = n == static_cast<ssize_t>(sizeof e) ? e : 0;
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(err[0], F_SETFL, O_NONBLOCK);
  const std::string prefix = "[rank" + std::to_string(r.rank) + "] ";
  r.out = std::make_unique<LineForwarder>(out[0], o.out_fd, prefix);
  r.err = std::make_unique<LineForwarder>(err[0], o.err_fd, prefix);
  return true;
}

int exit_code(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

struct Outcome {
  int status = 0;       // 0: every rank exited 0
  int interrupted = 0;  // the signal that stopped the launcher, 0 if none
};

// One start of the whole group, until every rank has exited.
class Round {
 public:
  Round(const LaunchOptions& o, const Prepared& p, int restart, SignalScope& signals)
      : o_(o), p_(p), restart_(restart), signals_(signals) {}
  // Only reached with ranks alive when an exception ends the round early.
  ~Round() {
    kill_all(SIGKILL);
    for (auto& r : ranks_)
      if (r.alive) waitpid(r.pid, nullptr, 0);
  }
  Round(const Round&) = delete;
  Round& operator=(const Round&) = delete;

  Outcome run() {
    ranks_.resize(o_.nproc_per_node);
    for (int local = 0; local < o_.nproc_per_node && !stopping_; ++local) {
      Rank& r = ranks_[local];
      r.rank = o_.node_rank * o_.nproc_per_node + local;
      if (!spawn(o_, p_, restart_, r, local)) {
        const int e = errno;
        fail("cannot start rank " + std::to_string(r.rank) + ": " + std::strerror(e), 1);
      }
    }
    loop();
    return outcome_;
  }

 private:
  bool any_alive() const {
    return std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.alive; });
  }

  void loop() {
    std::vector<pollfd> fds;
    std::vector<LineForwarder*> streams;
    for (;;) {
      const bool alive = any_alive();
      fds.clear();
      streams.clear();
      fds.push_back({signals_.read_fd(), POLLIN, 0});
      for (auto& r : ranks_)
        for (LineForwarder* s : {r.out.get(), r.err.get()})
          if (s && s->open()) {
            fds.push_back({s->fd(), POLLIN, 0});
            streams.push_back(s);
          }
      if (!alive && streams.empty()) return;
      const auto now = Clock::now();
      if (!alive && now >= drain_deadline_) {
        // Only a process that left its rank's group can hold these now.
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

  // Collects the ranks that exited.
  void reap() {
    for (auto& r : ranks_) {
      if (!r.alive) continue;
      siginfo_t info{};
      // WNOWAIT: the zombie keeps its pid (= the group's id) reserved until
      // what is left of its group has been killed.
      if (waitid(P_PID, r.pid, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid != r.pid) continue;
      kill(-r.pid, SIGKILL);
      int status = 0;
      while (waitpid(r.pid, &status, 0) < 0 && errno == EINTR) {
      }
      r.alive = false;
      if (!any_alive()) drain_deadline_ = Clock::now() + kDrainAfterExit;
      // Its last words come before the launcher's line about it.
      r.out->read_available(true);
      r.err->read_available(true);
      const int code = exit_code(status);
      if (code == 0 || stopping_) continue;
      std::string cause;
      if (r.exec_errno != 0)
        cause = "could not run `" + o_.command[0] + "`: " + std::strerror(r.exec_errno) + " (exit status " +
                std::to_string(code) + ")";
      else if (WIFSIGNALED(status))
        cause = "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" + signal_name(WTERMSIG(status)) + ")";
      else
        cause = "exited with status " + std::to_string(code);
      fail("rank " + std::to_string(r.rank) + " (pid " + std::to_string(r.pid) + ") " + cause, code);
    }
  }

  // Records the group's failure, says why and stops the other ranks.
  void fail(const std::string& what, int code) {
    outcome_.status = code;
    say(o_.err_fd, what + (any_alive() ? "; stopping the other ranks" : ""));
    kill_all(SIGTERM);
    start_stopping();
  }

  void forward(int sig) {
    say(o_.err_fd, "got " + signal_name(sig) + "; passing it to every rank");
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
    for (auto& r : ranks_)
      if (r.alive) kill(-r.pid, sig);
  }

  const LaunchOptions& o_;
  const Prepared& p_;
  const int restart_;
  SignalScope& signals_;
  std::vector<Rank> ranks_;
  Outcome outcome_;
  bool stopping_ = false;  // a rank failed or the launcher was interrupted
  bool killed_ = false;    // SIGKILL sent to every live rank
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
  check_range("threads_per_rank", o.threads_per_rank, 0, kMaxThreadsPerRank, " (0: the host's cores / nproc_per_node)");
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
  return std::max(1, available_cores() / std::max(1, o.nproc_per_node));
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
    Outcome r = Round(o, p, restart, signals).run();
    if (r.status == 0 || r.interrupted != 0 || restart >= o.max_restarts) return r.status;
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
