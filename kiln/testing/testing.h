// Test helpers shared by every kiln test binary.
#pragma once

#include <string>

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

// Runs a shell command, returns {exit code, stdout+stderr}.
struct CommandResult {
  int exit_code;
  std::string output;
};
CommandResult run_command(const std::string& command);

}  // namespace kiln
