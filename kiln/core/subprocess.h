// Starting a child program and waiting for it: the one fork+exec of kiln
// (the launcher's tasks, the tuner's command trials, `kiln retrain`).
//
//   Subprocess p({.argv = {"kiln", "train", "spec.json"}, .stdout_to = Stdio::kPipe});
//   int fd = p.take_stdout();          // the caller reads (and closes) it
//   ...
//   int status = p.wait();             // a waitpid status; exit_code(status)
//
// What every child gets, whatever the options:
// - It dies with the thread that started it (PR_SET_PDEATHSIG SIGKILL; a
//   child whose parent is already gone exits 127 before exec).
// - No descriptor of the parent's but its stdin/stdout/stderr (the others
//   are marked close-on-exec in the child): a child holding a pipe of the
//   caller's would keep that pipe's reader waiting for EOF.
// - Default signal handling: handlers of the parent's never run in it (every
//   signal is blocked from fork to exec), the signal mask is empty and
//   SIGPIPE is at its default (as Python's subprocess does), so a program
//   writing to a reader that is gone ends instead of running on.
// - A program that cannot be executed is one clear error: exec's errno comes
//   back through a close-on-exec pipe, and the constructor throws IOError
//   "cannot run `prog`: No such file or directory" (unless
//   throw_on_exec_failure is false: then exec_errno() says it, and the child
//   has exited 127).
//
// Why fork+exec and not posix_spawn: every caller needs PR_SET_PDEATHSIG,
// which posix_spawn cannot set (it has no hook between fork and exec).
//
// Thread safety: a Subprocess is used by one thread at a time; starting
// several from different threads at once is fine.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace kiln {

// Where one of the child's standard streams goes.
enum class Stdio {
  kInherit,  // the parent's
  kNull,     // /dev/null
  kPipe,     // a pipe whose other end the parent takes (take_stdout/take_stderr)
  kFile,     // a file, created if missing and appended to (stdin: read)
};

struct SubprocessOptions {
  // What exec runs: a path, or a name without '/' searched in PATH; empty:
  // argv[0]. Errors name it.
  std::string program;
  // The arguments, argv[0] (the name the program sees) first.
  std::vector<std::string> argv;
  // The child's environment: the parent's, less the variables named in
  // env_remove, with env_set ("NAME=value") added, replacing the parent's
  // value of the same name.
  std::vector<std::string> env_remove;
  std::vector<std::string> env_set;
  Stdio stdin_from = Stdio::kInherit;
  Stdio stdout_to = Stdio::kInherit;
  Stdio stderr_to = Stdio::kInherit;
  std::string stdin_path, stdout_path, stderr_path;  // for Stdio::kFile
  // The child leads a process group of its own (its pid is the group's id):
  // signal() then reaches everything it started, and when it exits what is
  // left of its group is killed before it is reaped (its zombie keeps the
  // group's id from being reused until then). false: it stays in the
  // parent's group (a Ctrl-C at the terminal reaches it too).
  bool new_process_group = false;
  bool throw_on_exec_failure = true;
};

// The shell's exit code of a waitpid status: the exit status, or 128 + the
// signal that killed it.
int exit_code(int wait_status);

class Subprocess {
 public:
  // Starts the child. IOError naming the program when a pipe, a file or the
  // fork fails, or (see above) when exec fails.
  explicit Subprocess(const SubprocessOptions& options);
  // A child still running is killed (SIGKILL, its group too) and reaped.
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  // exec's errno; 0 when exec succeeded.
  int exec_errno() const { return exec_errno_; }

  // The parent's ends of the Stdio::kPipe streams, handed over to the caller
  // (who closes them); -1 if not piped or already taken.
  int take_stdout();
  int take_stderr();

  // Sends `sig` to the child (to its whole group with new_process_group).
  // Nothing once it has been reaped.
  void signal(int sig);

  // Waits for the child to exit; returns its waitpid status (the same on
  // every later call).
  int wait();
  // The same, but returns nothing if it is still running after `timeout`
  // (zero: just checks).
  std::optional<int> wait_for(std::chrono::milliseconds timeout);
  bool running() const { return !status_; }

 private:
  bool reap(bool block);

  pid_t pid_ = -1;
  bool own_group_ = false;
  int exec_errno_ = 0;
  int stdout_fd_ = -1, stderr_fd_ = -1;
  std::optional<int> status_;
};

}  // namespace kiln
