// `kiln serve` as a user runs it: a real process on loopback, port 0, the
// ready line parsed from stdout, SIGTERM to stop.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "kiln/serving/serving_test_util.h"

extern char** environ;

namespace kiln::serving {
namespace {

using namespace kiln::serving::testing;

struct Process {
  pid_t pid = -1;
  FILE* out = nullptr;
  explicit Process(const std::vector<std::string>& args) {
    int fds[2];
    EXPECT_EQ(pipe(fds), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    EXPECT_EQ(posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    out = fdopen(fds[0], "r");
  }
  // The first line starting with `prefix` (blocks until the process prints it or exits).
  std::string line_starting(const std::string& prefix) {
    char buf[4096];
    while (fgets(buf, sizeof buf, out))
      if (std::string(buf).rfind(prefix, 0) == 0) return buf;
    return "";
  }
  int stop() {
    kill(pid, SIGTERM);
    int status = 0;
    waitpid(pid, &status, 0);
    fclose(out);
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  ~Process() {
    if (pid > 0) stop();
  }
};

TEST(KilnServe, StartsOnAnEphemeralPortAndServesTheModel) {
  TempDir dir;
  save_tiny_model(dir.path() + "/m/1", 1.0f);
  {
    std::ofstream f(dir.path() + "/batching.config");
    f << "max_batch_size { value: 8 }\nbatch_timeout_micros { value: 100 }\n";
  }
  {
    std::ofstream f(dir.path() + "/models.config");
    f << "model_config_list { config { name: \"tiny\" base_path: \"" << dir.path() << "/m\" } }\n";
  }
  Process p({cli_path(), "serve", "--model_config_file", dir.path() + "/models.config", "--rest_api_port", "0",
             "--port=-1", "--enable_batching", "--batching_parameters_file", dir.path() + "/batching.config",
             "--file_system_poll_wait_seconds", "0"});
  std::string ready = p.line_starting("kiln serve: ready");
  ASSERT_FALSE(ready.empty());
  int port = 0;
  ASSERT_EQ(std::sscanf(ready.c_str(), "kiln serve: ready rest_port=%d", &port), 1) << ready;
  httplib::Client c("127.0.0.1", port);
  auto r = c.Post("/v1/models/tiny:predict", R"({"instances": [[1,2,3,4]]})", "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_FLOAT_EQ(Json::parse(r->body)["predictions"][0][0].get<float>(), tiny_output(1.0f, {1, 2, 3, 4}));
  r = c.Get("/v1/models/tiny");
  ASSERT_TRUE(r);
  EXPECT_NE(r->body.find("AVAILABLE"), std::string::npos);
  c.stop();  // close the keep-alive connection before the server shuts down
  EXPECT_EQ(p.stop(), 0);
}

TEST(KilnServe, UserErrorsAreOneLineAndExitCode2) {
  auto r = run_command(cli_path() + " serve --rest_api_port 0 2>&1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("kiln: error: kiln serve needs --model_base_path"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace kiln::serving
