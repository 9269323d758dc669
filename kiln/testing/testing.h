// Test helpers shared by every kiln test binary.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

// True in the AddressSanitizer build (scripts/sanitize.sh): its allocator
// quarantines freed memory and ignores malloc_trim, so tests that measure
// the process's resident memory skip there.
#if defined(__SANITIZE_ADDRESS__)
#define KILN_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KILN_UNDER_ASAN 1
#endif
#endif
#ifndef KILN_UNDER_ASAN
#define KILN_UNDER_ASAN 0
#endif

namespace kiln {

// A fresh directory under $TMPDIR, removed (recursively) on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Absolute path of a file in the source tree ("kiln/losses/testdata/x.json").
std::string source_path(const std::string& relative);

// The built `kiln` CLI binary (set by CMake through KILN_CLI).
std::string cli_path();
// Whether this build has the CLI (a KILN_FULL=OFF build has none; tests
// that run it skip there).
bool have_cli();
#define KILN_SKIP_WITHOUT_CLI() \
  if (!::kiln::have_cli()) GTEST_SKIP() << "this build has no kiln CLI (KILN_FULL=OFF)"

// The python that has kiln's Python peers and checkers (onnxruntime, torch,
// ...): $KILN_PYTHON if set, else the project's .venv (scripts/setup.sh),
// else "python3".
std::string python_path();

// Whether checks that need outside tools (ONNX Runtime, Chromium and the npm
// packages, ...) must run: KILN_REQUIRE_CHECKS=1, which scripts/test.sh (CI)
// sets. Elsewhere such a check skips with a message naming what is missing.
bool checks_required();
#define KILN_SKIP_OR_FAIL(message)                                                                  \
  do {                                                                                              \
    if (::kiln::checks_required()) GTEST_FAIL() << message << " (KILN_REQUIRE_CHECKS=1: must run)"; \
    GTEST_SKIP() << message;                                                                        \
  } while (0)

// Runs a shell command, returns {exit code, stdout+stderr}.
struct CommandResult {
  int exit_code;
  std::string output;
};
CommandResult run_command(const std::string& command);

// Starts argv[0] (a path) in the background with stdout and stderr to
// `log_path`, the environment plus `extra_env` (replacing what it names);
// returns its pid, or -1.
pid_t spawn_logged(const std::vector<std::string>& argv, const std::string& log_path,
                   const std::map<std::string, std::string>& extra_env = {});
// A loopback TCP port nobody listens on right now (bound, read, released),
// or -1.
int free_loopback_port();
// The environment of rank `rank` of a `size`-rank job on this host meeting
// at 127.0.0.1:`master_port` (torchrun's variables, one thread per rank),
// plus `extra` (which wins).
std::map<std::string, std::string> rank_env(int rank, int size, int master_port,
                                            const std::map<std::string, std::string>& extra = {});
// Waits at most `seconds` for `pid`, SIGKILLs it after that. Its exit
// status (128 + signal if killed by one), or -1 when it had to be killed.
int wait_bounded(pid_t pid, double seconds);

// Fashion-MNIST is installed (Debian's dataset-fashion-mnist, or
// $KILN_FASHION_MNIST_DIR).
bool have_fashion_mnist();
// A BackupAndRestore directory holds a finished checkpoint (names starting
// with '.' are in-progress temporaries).
bool has_checkpoint(const std::string& backup_dir);

}  // namespace kiln
