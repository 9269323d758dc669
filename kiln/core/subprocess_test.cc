#include "kiln/core/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <memory>
#include <string>

#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/testing/expect_error.h"

namespace kiln {
namespace {

using std::chrono::milliseconds;

// Everything left on `fd` until EOF; closes it.
std::string read_all(int fd) {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR))
    if (n > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

// `sh -c script`, stdout on a pipe; returns what it printed.
std::string output_of(SubprocessOptions o, int* status = nullptr) {
  o.stdout_to = Stdio::kPipe;
  Subprocess p(o);
  std::string out = read_all(p.take_stdout());
  const int s = p.wait();
  if (status) *status = s;
  return out;
}

SubprocessOptions shell(const std::string& script) { return {.argv = {"/bin/sh", "-c", script}}; }

std::string temp_dir() {
  char tmpl[] = "/tmp/kiln_subprocess_XXXXXX";
  return mkdtemp(tmpl);
}

TEST(Subprocess, ExitCodes) {
  for (int code : {0, 1, 3, 127}) {
    Subprocess p(shell("exit " + std::to_string(code)));
    const int status = p.wait();
    EXPECT_TRUE(WIFEXITED(status));
    EXPECT_EQ(exit_code(status), code);
    EXPECT_EQ(p.wait(), status);  // the same on every call
    EXPECT_FALSE(p.running());
  }
}

TEST(Subprocess, ArgumentsReachTheProgramUnchanged) {
  SubprocessOptions o = shell("printf '%s|' \"$@\"");
  o.argv.insert(o.argv.end(), {"name", "a b", "", "$HOME", "*"});
  EXPECT_EQ(output_of(o), "a b||$HOME|*|");
}

TEST(Subprocess, SignalsEndTheChildAndShowInItsStatus) {
  Subprocess self_killed(shell("kill -TERM $$"));
  const int status = self_killed.wait();
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  EXPECT_EQ(exit_code(status), 128 + SIGTERM);

  Subprocess sleeper({.argv = {"sleep", "1000"}});
  sleeper.signal(SIGINT);
  EXPECT_EQ(exit_code(sleeper.wait()), 128 + SIGINT);
  sleeper.signal(SIGKILL);  // reaped: nothing happens
}

TEST(Subprocess, ExecFailureIsOneClearError) {
  expect_error<IOError>(
      [] {
        Subprocess p({.argv = {"kiln-no-such-program", "x"}});
      },
      {"cannot run `kiln-no-such-program`: No such file or directory (not found in PATH)"});
  expect_error<IOError>([] { Subprocess p({.argv = {"/nonexistent/prog"}}); },
                        {"cannot run `/nonexistent/prog`: No such file or directory"});
  expect_error<IOError>([] { Subprocess p({.argv = {"/tmp"}}); }, {"cannot run `/tmp`: Permission denied"});
  expect_error<ValueError>([] { Subprocess p(SubprocessOptions{}); }, {"empty argv"});

  Subprocess kept({.argv = {"kiln-no-such-program"}, .throw_on_exec_failure = false});
  EXPECT_EQ(kept.exec_errno(), ENOENT);
  EXPECT_EQ(exit_code(kept.wait()), 127);
  Subprocess ran(shell("exit 0"));
  EXPECT_EQ(ran.exec_errno(), 0);
}

TEST(Subprocess, EnvironmentIsTheParentsWithRemovalsAndOverrides) {
  setenv("KILN_SUBPROCESS_KEEP", "kept", 1);
  setenv("KILN_SUBPROCESS_DROP", "dropped", 1);
  setenv("KILN_SUBPROCESS_SET", "old", 1);
  SubprocessOptions o = shell(
      "echo \"$KILN_SUBPROCESS_KEEP|${KILN_SUBPROCESS_DROP-unset}|$KILN_SUBPROCESS_SET|$KILN_SUBPROCESS_NEW\"; "
      "env | grep -c '^KILN_SUBPROCESS_SET='");
  o.env_remove = {"KILN_SUBPROCESS_DROP"};
  o.env_set = {"KILN_SUBPROCESS_SET=new=value", "KILN_SUBPROCESS_NEW="};
  EXPECT_EQ(output_of(o), "kept|unset|new=value|\n1\n");
  for (const char* k : {"KILN_SUBPROCESS_KEEP", "KILN_SUBPROCESS_DROP", "KILN_SUBPROCESS_SET"}) unsetenv(k);
}

TEST(Subprocess, StreamsGoToPipesFilesOrNowhere) {
  const std::string dir = temp_dir();
  const std::string in = join_path(dir, "in"), out = join_path(dir, "out");
  atomic_write_file(in, "from a file\n");
  atomic_write_file(out, "already here\n");
  SubprocessOptions o = shell("cat; echo to-stderr >&2");
  o.stdin_from = Stdio::kFile;
  o.stdin_path = in;
  o.stdout_to = Stdio::kFile;
  o.stdout_path = out;
  o.stderr_to = Stdio::kPipe;
  Subprocess p(o);
  EXPECT_EQ(p.take_stdout(), -1);  // not piped
  const int err = p.take_stderr();
  EXPECT_EQ(p.take_stderr(), -1);  // taken
  EXPECT_EQ(read_all(err), "to-stderr\n");
  EXPECT_EQ(exit_code(p.wait()), 0);
  EXPECT_EQ(read_file(out), "already here\nfrom a file\n");  // appended

  SubprocessOptions quiet = shell("cat; echo gone; echo gone >&2");
  quiet.stdin_from = quiet.stderr_to = Stdio::kNull;
  EXPECT_EQ(output_of(quiet), "gone\n");  // stdin read as empty

  SubprocessOptions bad = shell("true");
  bad.stdout_to = Stdio::kFile;
  bad.stdout_path = join_path(dir, "no/such/dir/out");
  expect_error<IOError>([&] { Subprocess p(bad); }, {"cannot run `/bin/sh`: cannot open", "no/such/dir/out"});
  remove_all(dir);
}

TEST(Subprocess, ChildGetsNoOtherDescriptorOfTheParents) {
  int leaky[2];
  ASSERT_EQ(pipe(leaky), 0);  // not close-on-exec
  const std::string fd = std::to_string(leaky[1]);
  EXPECT_EQ(output_of(shell("if [ -e /proc/self/fd/" + fd + " ]; then echo open; else echo closed; fi")), "closed\n");
  close(leaky[0]);
  close(leaky[1]);
}

TEST(Subprocess, ChildStartsWithDefaultSignalHandling) {
  // The test binary ignores SIGPIPE; block SIGUSR1 here too.
  sigset_t usr1, old;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &usr1, &old);
  const auto previous = std::signal(SIGPIPE, SIG_IGN);
  const std::string status = output_of({.argv = {"grep", "-E", "^Sig(Blk|Ign)", "/proc/self/status"}});
  std::signal(SIGPIPE, previous);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  EXPECT_NE(status.find("SigBlk:\t0000000000000000"), std::string::npos) << status;
  const size_t at = status.find("SigIgn:\t");
  ASSERT_NE(at, std::string::npos) << status;
  const unsigned long long ignored = std::stoull(status.substr(at + 8, 16), nullptr, 16);
  EXPECT_EQ(ignored & (1ULL << (SIGPIPE - 1)), 0u) << status;
}

// A shell leading its own process group that starts `sleep 1000` in the
// background and then runs `then`; the test process is the reaper of its
// orphans meanwhile, so it can wait for the background sleep itself.
class ShellWithBackgroundSleep {
 public:
  explicit ShellWithBackgroundSleep(const std::string& then) {
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    SubprocessOptions o = shell("sleep 1000 & echo $!; " + then);
    o.stdout_to = Stdio::kPipe;
    o.new_process_group = true;
    process_ = std::make_unique<Subprocess>(o);
    const int out = process_->take_stdout();
    std::string line;
    char c;
    while (read(out, &c, 1) == 1 && c != '\n') line += c;
    close(out);
    background_ = std::stoi(line);
  }
  ~ShellWithBackgroundSleep() { prctl(PR_SET_CHILD_SUBREAPER, 0); }

  Subprocess& process() { return *process_; }
  // Expects the background sleep (an orphan once the shell is gone) to have
  // been killed by SIGKILL.
  void expect_background_killed() {
    int status = 0;
    while (waitpid(background_, &status, 0) < 0 && errno == EINTR) {
    }
    ASSERT_TRUE(WIFSIGNALED(status)) << status;
    EXPECT_EQ(WTERMSIG(status), SIGKILL);
  }

 private:
  std::unique_ptr<Subprocess> process_;
  pid_t background_ = -1;
};

TEST(Subprocess, TimeoutThenKillLeavesNoProcessBehind) {
  ShellWithBackgroundSleep sh("exec sleep 1000");
  Subprocess& p = sh.process();
  EXPECT_EQ(p.wait_for(milliseconds(0)), std::nullopt);
  EXPECT_EQ(p.wait_for(milliseconds(100)), std::nullopt);
  EXPECT_TRUE(p.running());
  p.signal(SIGKILL);
  const auto status = p.wait_for(milliseconds(30000));  // only a hang reaches the limit
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(exit_code(*status), 128 + SIGKILL);
  sh.expect_background_killed();
}

TEST(Subprocess, WhatTheChildLeftInItsGroupIsKilledWhenItExits) {
  ShellWithBackgroundSleep sh("exit 0");
  EXPECT_EQ(exit_code(sh.process().wait()), 0);
  sh.expect_background_killed();
}

TEST(Subprocess, DestructorKillsAndReapsARunningChild) {
  pid_t pid;
  {
    Subprocess p({.argv = {"sleep", "1000"}});
    pid = p.pid();
  }
  int status;
  EXPECT_EQ(waitpid(pid, &status, WNOHANG), -1);  // already reaped
  EXPECT_EQ(errno, ECHILD);
}

}  // namespace
}  // namespace kiln
