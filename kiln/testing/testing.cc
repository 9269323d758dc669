#include "kiln/testing/testing.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <thread>

#include "kiln/core/io.h"

extern char** environ;

namespace kiln {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string templ = std::string(base && *base ? base : "/tmp") + "/kiln_test_XXXXXX";
  if (!::mkdtemp(templ.data())) throw std::runtime_error("mkdtemp failed");
  path_ = templ;
}

TempDir::~TempDir() { remove_all(path_); }

std::string source_path(const std::string& relative) { return std::string(KILN_SOURCE_DIR) + "/" + relative; }

std::string python_path() {
  const char* env = std::getenv("KILN_PYTHON");
  if (env && *env) return env;
  const std::string venv = source_path(".venv/bin/python");
  if (::access(venv.c_str(), X_OK) == 0) return venv;
  return "python3";
}

bool checks_required() {
  const char* env = std::getenv("KILN_REQUIRE_CHECKS");
  return env && std::string(env) == "1";
}

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

int free_loopback_port() {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(s);
  return port;
}

std::map<std::string, std::string> rank_env(int rank, int size, int master_port,
                                            const std::map<std::string, std::string>& extra) {
  std::map<std::string, std::string> env = {{"RANK", std::to_string(rank)},
                                            {"WORLD_SIZE", std::to_string(size)},
                                            {"LOCAL_RANK", std::to_string(rank)},
                                            {"LOCAL_WORLD_SIZE", std::to_string(size)},
                                            {"MASTER_ADDR", "127.0.0.1"},
                                            {"MASTER_PORT", std::to_string(master_port)},
                                            {"KILN_NUM_THREADS", "1"}};
  for (auto& [k, v] : extra) env[k] = v;
  return env;
}

pid_t spawn_logged(const std::vector<std::string>& argv_s, const std::string& log_path,
                   const std::map<std::string, std::string>& extra_env) {
  std::vector<std::string> args = argv_s;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    if (!extra_env.count(kv.substr(0, kv.find('=')))) env_s.push_back(kv);
  }
  for (auto& [k, v] : extra_env) env_s.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

int wait_bounded(pid_t pid, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  for (;;) {
    int st = 0;
    if (::waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &st, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling a child's exit, not hiding a race
  }
}

bool have_fashion_mnist() {
  const char* d = std::getenv("KILN_FASHION_MNIST_DIR");
  const std::string dir = d && *d ? d : "/usr/share/datasets/fashion-mnist";
  return path_exists(dir + "/train-labels-idx1-ubyte.gz") || path_exists(dir + "/train-labels-idx1-ubyte");
}

bool has_checkpoint(const std::string& backup_dir) {
  if (!is_directory(backup_dir)) return false;
  for (auto& name : list_directory(backup_dir))
    if (!name.empty() && name[0] != '.') return true;
  return false;
}

}  // namespace kiln
