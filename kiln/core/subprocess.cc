#include "kiln/core/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "kiln/core/error.h"

extern char** environ;

namespace kiln {
namespace {

void close_fd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

// The name of a "NAME=value" entry (all of it without '=').
std::string_view name_of(std::string_view entry) { return entry.substr(0, entry.find('=')); }

std::vector<std::string> child_environment(const SubprocessOptions& o) {
  std::vector<std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const std::string_view name = name_of(*e);
    bool replaced = false;
    for (const std::string& k : o.env_remove) replaced = replaced || name == k;
    for (const std::string& kv : o.env_set) replaced = replaced || name == name_of(kv);
    if (!replaced) env.emplace_back(*e);
  }
  env.insert(env.end(), o.env_set.begin(), o.env_set.end());
  return env;
}

// The descriptors the child's stdin, stdout and stderr come from (-1:
// inherited) and the parent's ends of the pipes; all close-on-exec here.
struct Streams {
  int child[3] = {-1, -1, -1};
  int parent[3] = {-1, -1, -1};
  ~Streams() {
    for (int i = 0; i < 3; ++i) {
      close_fd(child[i]);
      close_fd(parent[i]);
    }
  }
};

void open_stream(int index, Stdio how, const std::string& path, const std::string& program, Streams& s) {
  const bool input = index == 0;
  switch (how) {
    case Stdio::kInherit:
      return;
    case Stdio::kNull:
      s.child[index] = open("/dev/null", (input ? O_RDONLY : O_WRONLY) | O_CLOEXEC);
      break;
    case Stdio::kFile:
      s.child[index] = input ? open(path.c_str(), O_RDONLY | O_CLOEXEC)
                             : open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (s.child[index] < 0)
        throw IOError("cannot run `" + program + "`: cannot open " + path + ": " + std::strerror(errno));
      return;
    case Stdio::kPipe: {
      int fds[2];
      if (pipe2(fds, O_CLOEXEC) != 0) break;
      s.child[index] = input ? fds[0] : fds[1];
      s.parent[index] = input ? fds[1] : fds[0];
      return;
    }
  }
  if (s.child[index] < 0) throw IOError("cannot run `" + program + "`: " + std::strerror(errno));
}

// Blocks every signal in this thread for its lifetime: between fork and
// exec no handler of the parent's may run in the child.
class BlockAllSignals {
 public:
  BlockAllSignals() {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old_);
  }
  ~BlockAllSignals() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

 private:
  sigset_t old_;
};

// In the child, between fork and exec: async-signal-safe calls only.
[[noreturn]] void exec_child(const SubprocessOptions& o, const char* program, pid_t parent, int from[3],
                             char* const* argv, char* const* envp, int status_fd) {
  if (o.new_process_group) setpgid(0, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127);  // the parent is gone already
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; ++sig) {
    struct sigaction old {};
    if (sigaction(sig, nullptr, &old) != 0) continue;
    const bool handled = (old.sa_flags & SA_SIGINFO) || (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN);
    if (handled || sig == SIGPIPE) sigaction(sig, &dfl, nullptr);
  }
  // A source among 0..2 could be overwritten by another's dup2: move it up.
  for (int i = 0; i < 3; ++i)
    if (from[i] >= 0 && from[i] < 3) from[i] = fcntl(from[i], F_DUPFD_CLOEXEC, 3);
  for (int i = 0; i < 3; ++i)
    if (from[i] >= 0) dup2(from[i], i);
  if (close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) != 0)  // kernels before 5.11
    for (int fd = 3; fd < 4096; ++fd) fcntl(fd, F_SETFD, FD_CLOEXEC);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  execvpe(program, argv, envp);
  const int e = errno;
  (void)!write(status_fd, &e, sizeof e);
  _exit(127);
}

}  // namespace

int exit_code(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 1;
}

Subprocess::Subprocess(const SubprocessOptions& o) : own_group_(o.new_process_group) {
  if (o.argv.empty() || (o.program.empty() && o.argv[0].empty()))
    throw ValueError("Subprocess needs a program to run. Received: an empty argv");
  const std::string& program = o.program.empty() ? o.argv[0] : o.program;
  // Everything the child needs is built before fork.
  const std::vector<std::string> env = child_environment(o);
  std::vector<char*> cargv, cenv;
  for (auto& a : o.argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (auto& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  Streams s;
  open_stream(0, o.stdin_from, o.stdin_path, program, s);
  open_stream(1, o.stdout_to, o.stdout_path, program, s);
  open_stream(2, o.stderr_to, o.stderr_path, program, s);
  int status[2];
  if (pipe2(status, O_CLOEXEC) != 0) throw IOError("cannot run `" + program + "`: " + std::strerror(errno));

  const pid_t parent = getpid();
  {
    BlockAllSignals blocked;
    pid_ = fork();
    if (pid_ == 0) exec_child(o, program.c_str(), parent, s.child, cargv.data(), cenv.data(), status[1]);
  }
  const int fork_errno = errno;
  close(status[1]);
  if (pid_ < 0) {
    close(status[0]);
    throw IOError("cannot run `" + program + "`: fork: " + std::strerror(fork_errno));
  }
  if (own_group_) setpgid(pid_, pid_);  // also here: no window where a signal to the group misses it
  // The status pipe closes at exec, or brings exec's errno.
  int e = 0;
  ssize_t n;
  while ((n = read(status[0], &e, sizeof e)) < 0 && errno == EINTR) {
  }
  close(status[0]);
  exec_errno_ = n == static_cast<ssize_t>(sizeof e) ? e : 0;
  if (exec_errno_ != 0 && o.throw_on_exec_failure) {
    wait();
    std::string what = "cannot run `" + program + "`: " + std::strerror(exec_errno_);
    if (exec_errno_ == ENOENT && program.find('/') == std::string::npos) what += " (not found in PATH)";
    throw IOError(what);
  }
  std::swap(stdout_fd_, s.parent[1]);
  std::swap(stderr_fd_, s.parent[2]);
}

Subprocess::~Subprocess() {
  close_fd(stdout_fd_);
  close_fd(stderr_fd_);
  if (running()) {
    signal(SIGKILL);
    wait();
  }
}

int Subprocess::take_stdout() { return std::exchange(stdout_fd_, -1); }
int Subprocess::take_stderr() { return std::exchange(stderr_fd_, -1); }

void Subprocess::signal(int sig) {
  if (running()) kill(own_group_ ? -pid_ : pid_, sig);
}

int Subprocess::wait() {
  reap(true);
  return *status_;
}

std::optional<int> Subprocess::wait_for(std::chrono::milliseconds timeout) {
  if (status_ || reap(false) || timeout.count() <= 0) return status_;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // A pidfd turns readable when the child exits.
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    if (pidfd >= 0) {
      pollfd p{pidfd, POLLIN, 0};
      poll(&p, 1, static_cast<int>(std::min<long long>(left.count() + 1, 1 << 30)));
    } else {  // kernels before 5.3
      usleep(static_cast<useconds_t>(std::min<long long>(left.count(), 10) * 1000));
    }
    if (reap(false)) break;
  }
  if (pidfd >= 0) close(pidfd);
  reap(false);
  return status_;
}

bool Subprocess::reap(bool block) {
  if (status_) return true;
  siginfo_t info{};
  // WNOWAIT: the zombie keeps its pid (its group's id) reserved until what
  // is left of its group has been killed.
  int rc;
  while ((rc = waitid(P_PID, pid_, &info, WEXITED | WNOWAIT | (block ? 0 : WNOHANG))) != 0 && errno == EINTR) {
  }
  if (rc != 0 || info.si_pid != pid_) {
    if (rc != 0 && errno == ECHILD) status_ = 0;  // reaped elsewhere (SIGCHLD ignored): its status is lost
    return status_.has_value();
  }
  if (own_group_) kill(-pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  status_ = status;
  return true;
}

}  // namespace kiln
