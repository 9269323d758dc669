// Scale-out (issue #4, §6): three `kiln serve` replicas on the same model
// repository behind nginx (Debian's /usr/sbin/nginx). Load goes through
// nginx from several client threads while each replica in turn is
// SIGKILLed and restarted; not one request may fail, and requests must keep flowing
// while the replica is down. Everything waits on conditions (the ready
// line, request counters, nginx accepting) with deadlines, never on sleeps.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <regex>
#include <thread>

#include "kiln/serving/serving_test_util.h"
#include "kiln/serving/test_process.h"

namespace kiln::serving {
namespace {

using namespace kiln::serving::testing;
using SteadyClock = std::chrono::steady_clock;

const char* kNginx = "/usr/sbin/nginx";

// A loopback port nobody listens on right now (bound, read, released).
int free_port() {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  int port = -1;
  if (bind(s, (sockaddr*)&a, sizeof a) == 0 && getsockname(s, (sockaddr*)&a, &len) == 0) port = ntohs(a.sin_port);
  close(s);
  return port;
}

// Polls `cond` until it holds or `timeout_s` passes.
bool wait_until(const std::function<bool()>& cond, double timeout_s) {
  auto deadline = SteadyClock::now() + std::chrono::duration<double>(timeout_s);
  while (!cond()) {
    if (SteadyClock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// Successful predict requests a replica counted (its Prometheus metrics).
int64_t replica_ok_predicts(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(1, 0);
  auto r = c.Get("/metrics");
  if (!r || r->status != 200) return -1;
  std::regex line(R"re(kiln_requests_total\{[^}]*api="predict"[^}]*code="OK"[^}]*\} ([0-9.e+]+))re");
  int64_t n = 0;
  for (std::sregex_iterator it(r->body.begin(), r->body.end(), line), end; it != end; ++it)
    n += (int64_t)std::stod((*it)[1]);
  return n;
}

class Replica {
 public:
  Replica(const std::string& dir, int index, int rest_port) : dir_(dir), index_(index) { start(rest_port); }

  // Starts `kiln serve` (rest_port 0 = ephemeral) and waits for its ready line.
  void start(int rest_port) {
    proc_ = std::make_unique<ChildProcess>(
        std::vector<std::string>{cli_path(), "serve", "--model_name", "tiny", "--model_base_path", dir_ + "/m",
                                 "--rest_api_port", std::to_string(rest_port), "--port=-1",
                                 "--file_system_poll_wait_seconds", "0", "--rest_api_num_threads", "8"},
        dir_ + "/replica" + std::to_string(index_) + ".log");
    ASSERT_TRUE(proc_->started());
    std::string ready = proc_->wait_for_line("kiln serve: ready", 120);
    ASSERT_FALSE(ready.empty()) << "replica " << index_ << " did not start:\n" << proc_->stderr_text();
    ASSERT_EQ(std::sscanf(ready.c_str(), "kiln serve: ready rest_port=%d", &port_), 1) << ready;
    if (rest_port > 0) {
      ASSERT_EQ(port_, rest_port);
    }
  }
  void kill_now() { proc_->kill_now(); }
  int stop() { return proc_->stop(); }
  int port() const { return port_; }

 private:
  std::string dir_;
  int index_;
  int port_ = -1;
  std::unique_ptr<ChildProcess> proc_;
};

std::string nginx_config(const std::string& dir, int listen_port, const std::vector<int>& upstreams) {
  std::ostringstream c;
  c << "daemon off;\nworker_processes 1;\npid " << dir << "/nginx.pid;\nerror_log " << dir << "/nginx_error.log warn;\n"
    << "events { worker_connections 1024; }\n"
    << "http {\n  access_log off;\n";
  for (const char* t : {"client_body", "proxy", "fastcgi", "uwsgi", "scgi"})
    c << "  " << t << "_temp_path " << dir << "/" << t << "_temp;\n";
  c << "  upstream kiln {\n";
  // A failed replica is skipped for 1 s, then tried again (and put back when it answers).
  for (int p : upstreams) c << "    server 127.0.0.1:" << p << " max_fails=1 fail_timeout=1s;\n";
  c << "    keepalive 16;\n  }\n"
    << "  server {\n    listen 127.0.0.1:" << listen_port << ";\n"
    << "    location / {\n      proxy_pass http://kiln;\n      proxy_http_version 1.1;\n"
    << "      proxy_set_header Connection \"\";\n"
    // Predict is a pure function of its body, so retrying a POST whose
    // replica died mid-request on another replica is safe: non_idempotent.
    << "      proxy_next_upstream error timeout http_502 http_503 http_504 non_idempotent;\n"
    << "      proxy_connect_timeout 1s;\n      proxy_read_timeout 30s;\n    }\n  }\n}\n";
  return c.str();
}

TEST(ScaleOut, ReplicaKilledAndRestartedBehindNginxLosesNoRequest) {
  if (access(kNginx, X_OK) != 0)
    GTEST_SKIP() << kNginx << " is not installed (apt-get install nginx); the scale-out test through nginx did not run";
  TempDir dir;
  save_tiny_model(dir.path() + "/m/1", 1.0f);

  std::vector<std::unique_ptr<Replica>> replicas;
  for (int i = 0; i < 3; ++i) {
    replicas.push_back(std::make_unique<Replica>(dir.path(), i, 0));
    if (HasFatalFailure()) return;
  }
  std::vector<int> ports;
  for (auto& r : replicas) ports.push_back(r->port());

  // nginx on a free loopback port; if another process takes the port between
  // free_port() and nginx's bind, nginx exits and we try another.
  std::unique_ptr<ChildProcess> nginx;
  int lb_port = -1;
  for (int attempt = 0; attempt < 3 && !nginx; ++attempt) {
    lb_port = free_port();
    ASSERT_GT(lb_port, 0);
    {
      std::ofstream f(dir.path() + "/nginx.conf");
      f << nginx_config(dir.path(), lb_port, ports);
    }
    auto p = std::make_unique<ChildProcess>(std::vector<std::string>{kNginx, "-p", dir.path(), "-c",
                                                                     dir.path() + "/nginx.conf", "-e",
                                                                     dir.path() + "/nginx_error.log"},
                                            dir.path() + "/nginx_stderr.log");
    ASSERT_TRUE(p->started());
    bool up = wait_until(
        [&] {
          httplib::Client c("127.0.0.1", lb_port);
          c.set_connection_timeout(0, 200000);
          auto r = c.Get("/v2/health/live");
          return r && r->status == 200;
        },
        20);
    if (up) nginx = std::move(p);
  }
  ASSERT_TRUE(nginx) << "nginx did not start; " << dir.path() << "/nginx_error.log:\n"
                     << read_file(dir.path() + "/nginx_error.log");

  // Load: 6 clients through nginx, each checking the answer.
  const float expected = tiny_output(1.0f, {1, 2, 3, 4});
  std::atomic<bool> stop{false};
  std::atomic<int64_t> ok{0}, failed{0};
  std::mutex failures_mu;
  std::map<std::string, int> failures;  // guarded by failures_mu
  std::vector<std::thread> clients;
  for (int i = 0; i < 6; ++i)
    clients.emplace_back([&] {
      httplib::Client c("127.0.0.1", lb_port);
      c.set_keep_alive(true);
      c.set_read_timeout(30, 0);
      while (!stop) {
        auto r = c.Post("/v1/models/tiny:predict", R"({"instances": [[1, 2, 3, 4]]})", "application/json");
        std::string why;
        if (!r) why = "transport: " + httplib::to_string(r.error());
        else if (r->status != 200) why = "HTTP " + std::to_string(r->status) + ": " + r->body;
        else if (Json::parse(r->body)["predictions"][0][0].get<float>() != expected) why = "wrong answer: " + r->body;
        if (why.empty()) {
          ++ok;
        } else {
          ++failed;
          std::lock_guard<std::mutex> l(failures_mu);
          ++failures[why];
        }
      }
    });
  auto finish = [&] {
    stop = true;
    for (auto& t : clients) t.join();
    clients.clear();
  };

  EXPECT_TRUE(wait_until([&] { return ok >= 200; }, 60)) << "load did not get going: ok=" << ok;

  // Each replica in turn: SIGKILL it mid-load (its in-flight requests die
  // with it), check requests keep flowing, restart it on the same port
  // (nginx's upstream list names the port) and wait until nginx sends it
  // traffic again.
  int64_t min_ok_while_down = INT64_MAX;
  for (auto& victim : replicas) {
    const int port = victim->port();
    victim->kill_now();
    const int64_t ok_at_kill = ok;
    EXPECT_TRUE(wait_until([&] { return ok >= ok_at_kill + 300; }, 60))
        << "requests stopped flowing while the replica on port " << port << " was down: " << ok - ok_at_kill
        << " after the kill";
    min_ok_while_down = std::min<int64_t>(min_ok_while_down, ok - ok_at_kill);
    victim->start(port);
    if (HasFatalFailure()) return finish();
    EXPECT_TRUE(wait_until([&] { return replica_ok_predicts(port) > 0; }, 60))
        << "nginx never sent requests to the restarted replica on port " << port;
    const int64_t ok_at_restart = ok;
    EXPECT_TRUE(wait_until([&] { return ok >= ok_at_restart + 200; }, 60));
  }
  finish();

  std::string why;
  for (auto& [k, v] : failures) why += std::to_string(v) + " x " + k + "\n";
  EXPECT_EQ(failed.load(), 0) << "failed requests through nginx:\n" << why;
  EXPECT_GE(min_ok_while_down, 300);
  // Every (restarted) replica served part of the load.
  for (auto& r : replicas) EXPECT_GT(replica_ok_predicts(r->port()), 0) << "replica on port " << r->port();

  nginx->stop(SIGQUIT);  // graceful: finishes its (now idle) connections
  for (auto& r : replicas) EXPECT_EQ(r->stop(), 0);
}

}  // namespace
}  // namespace kiln::serving
