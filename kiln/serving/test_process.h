// A child process for tests that run real servers (kiln serve, nginx):
// spawned with posix_spawn, stdout on a pipe read line by line with a
// deadline, stderr to a file (so that a failing test can show it).
//
//   ChildProcess p({cli_path(), "serve", ...}, dir + "/replica0.log");
//   std::string ready = p.wait_for_line("kiln serve: ready", 60);  // "" on timeout or exit
//   p.kill_now();                                                  // SIGKILL, reaped
//
// Not thread-safe; one owner. The destructor SIGTERMs and reaps a live child.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace kiln::serving::testing {

class ChildProcess {
 public:
  // stderr_path: where the child's stderr goes ("" = inherit).
  explicit ChildProcess(const std::vector<std::string>& args, const std::string& stderr_path = "")
      : stderr_path_(stderr_path) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    if (!stderr_path.empty())
      posix_spawn_file_actions_addopen(&fa, 2, stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    // The child starts with SIGPIPE at its default, as from a shell: the
    // test binary ignores it (test_main.cc), and ignored signals survive exec.
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t defaults;
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGPIPE);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
    if (posix_spawn(&pid_, argv[0], &fa, &attr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    out_fd_ = fds[0];
  }
  ~ChildProcess() {
    if (pid_ > 0) stop();
    if (out_fd_ >= 0) close(out_fd_);
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

  // The next stdout line starting with `prefix`, waiting at most timeout_s;
  // "" if the deadline passes or the child closes stdout (exits) first.
  std::string wait_for_line(const std::string& prefix, double timeout_s) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    for (;;) {
      size_t nl;
      while ((nl = buffer_.find('\n')) != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        if (line.rfind(prefix, 0) == 0) return line;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || out_fd_ < 0) return "";
      pollfd p{out_fd_, POLLIN, 0};
      if (poll(&p, 1, (int)left.count()) <= 0) continue;  // deadline re-checked above
      char buf[4096];
      ssize_t n = read(out_fd_, buf, sizeof buf);
      if (n <= 0) return "";  // EOF: the child exited
      buffer_.append(buf, (size_t)n);
    }
  }

  // Reads stdout until enough(what was read) holds, the child closes it
  // (exits) or timeout_s passes; returns what was read (with what
  // wait_for_line left unread). Drains the pipe, so a child that logs a
  // lot to stdout does not block on it.
  std::string read_until(const std::function<bool(const std::string&)>& enough, double timeout_s) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    std::string out = std::move(buffer_);
    buffer_.clear();
    while (!enough(out) && out_fd_ >= 0) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{out_fd_, POLLIN, 0};
      if (poll(&p, 1, (int)left.count()) <= 0) continue;  // deadline re-checked above
      char buf[4096];
      ssize_t n = read(out_fd_, buf, sizeof buf);
      if (n <= 0) break;  // EOF: the child exited
      out.append(buf, (size_t)n);
    }
    return out;
  }

  // SIGKILL and reap (a crash, as far as the child's peers can tell).
  void kill_now() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  // `sig` (SIGTERM by default), reaped; the exit code, or -1 if killed by a signal.
  int stop(int sig = SIGTERM) {
    if (pid_ <= 0) return -1;
    kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  // stop() bounded: `sig`, then the exit code once the child exits within
  // timeout_s (-1 if a signal ended it); -2 if it is still alive then, after
  // which it is SIGKILLed and reaped.
  int stop_within(double timeout_s, int sig = SIGTERM) {
    if (pid_ <= 0) return -1;
    kill(pid_, sig);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    int status = 0;
    while (waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill_now();
        return -2;
      }
      // Polling the child's exit with a deadline (no event to wait on).
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  // The captured stderr (for failure messages).
  std::string stderr_text() const {
    if (stderr_path_.empty()) return "";
    std::ifstream f(stderr_path_);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::string buffer_;
  std::string stderr_path_;
};

}  // namespace kiln::serving::testing
