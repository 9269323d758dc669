#include "kiln/testing/testing.h"

#include <unistd.h>

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <array>
#include <cstdlib>
#include <stdexcept>

#include "kiln/core/io.h"

namespace kiln {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string templ = std::string(base && *base ? base : "/tmp") + "/kiln_test_XXXXXX";
  if (!::mkdtemp(templ.data())) throw std::runtime_error("mkdtemp failed");
  path_ = templ;
}

TempDir::~TempDir() { remove_all(path_); }

std::string source_path(const std::string& relative) { return std::string(KILN_SOURCE_DIR) + "/" + relative; }

std::string cli_path() {
  const char* p = std::getenv("KILN_CLI");
  if (p && *p) return p;
  return std::string(KILN_BINARY_DIR) + "/kiln";
}

bool have_cli() { return ::access(cli_path().c_str(), X_OK) == 0; }

CommandResult run_command(const std::string& command) {
  std::string full = command + " 2>&1";
  FILE* f = ::popen(full.c_str(), "r");
  if (!f) throw std::runtime_error("popen failed: " + command);
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), f)) > 0) out.append(buf.data(), n);
  int status = ::pclose(f);
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return {code, out};
}

}  // namespace kiln
