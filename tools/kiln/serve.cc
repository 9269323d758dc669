// kiln serve: the model server (TF Serving-like flags).
//
//   kiln serve --model_name mnist --model_base_path models/mnist [--rest_api_port 8501|auto|0]
//   kiln serve --model_config_file models.config [--model_config_file_poll_wait_seconds 30]
//              [--enable_batching --batching_parameters_file batching.config]
//              [--file_system_poll_wait_seconds 1] [--rest_api_bind 127.0.0.1] [--port 8500]
//              [--ssl_cert server.crt --ssl_key server.key [--ssl_client_ca ca.crt]]
//              [--ssl_config_file ssl.config]
//              [--bearer_token_file token.txt]
//              [--enable_admin_routes [--admin_token_file admin.txt]]
//
// When every front end is listening it prints one line on stdout:
//   kiln serve: ready rest_port=8501 grpc_port=-1
// (-1: not started; --rest_api_port/--port 0 or -1 turn a front end off,
// `auto` lets the kernel pick a free port). Runs until SIGINT or SIGTERM. docs/SERVING.md has the rest.
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <fstream>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>

#include "kiln/core/error.h"
#include "kiln/serving/core/server_core.h"
#include "kiln/serving/frontend.h"
#include "kiln/serving/rest/rest_server.h"
#include "kiln/serving/tls.h"
#include "tools/kiln/cli.h"

namespace kiln::cli {
namespace {

// SIGINT/SIGTERM -> a byte on this pipe, which run_serve waits on. Threads
// that libraries started before run_serve (OpenBLAS, gRPC) do not block
// the signals, and one of them could take a signal meant for sigwait: the
// default action then ended the process mid-shutdown (exit status -15 about
// one time in three when SIGTERM came right after the ready line). A handler
// runs on whichever thread gets it.
int stop_pipe[2] = {-1, -1};
extern "C" void on_stop_signal(int sig) {
  char c = static_cast<char>(sig);
  ssize_t n = ::write(stop_pipe[1], &c, 1);
  (void)n;
}

// Waits on stop_pipe in a thread of its own, from before the models load,
// and bounds the shutdown that a stop signal starts: past the deadline it
// logs and ends the process. What shutdown waits for last is ServerCore's
// load threads, and a load can outlast any deadline (a read from a hung
// network file system, a long warmup), so a signal during one kept the
// server alive. Nothing is lost by ending then: serving writes no files.
class StopWatcher {
 public:
  explicit StopWatcher(double deadline_seconds) : deadline_seconds_(deadline_seconds) {
    thread_ = std::thread([this] { run(); });
  }
  ~StopWatcher() {
    finished();
    thread_.join();
  }
  bool stop_requested() {
    std::lock_guard<std::mutex> l(mu_);
    return signal_ != 0;
  }
  // Blocks until SIGINT or SIGTERM; returns it.
  int wait_for_stop() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return signal_ != 0; });
    return signal_;
  }
  // The shutdown is over (or the server ends on an error): no deadline.
  void finished() {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (finished_) return;
      finished_ = true;
    }
    cv_.notify_all();
    const char wake = 0;  // ends the read below when no signal came
    ssize_t n = ::write(stop_pipe[1], &wake, 1);
    (void)n;
  }

 private:
  void run() {
    // The one server thread that takes SIGINT/SIGTERM (the others block them).
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
    char got = 0;
    while (::read(stop_pipe[0], &got, 1) < 0 && errno == EINTR) {
    }
    std::unique_lock<std::mutex> l(mu_);
    if (got == 0 || finished_) return;
    signal_ = got;
    spdlog::info("serving: signal {}, shutting down", signal_);
    cv_.notify_all();
    if (cv_.wait_for(l, std::chrono::duration<double>(deadline_seconds_), [&] { return finished_; })) return;
    spdlog::error(
        "serving: shutdown did not finish within {} s of the signal (a model version is still loading or "
        "unloading); exiting without waiting for it",
        deadline_seconds_);
    spdlog::shutdown();  // flushes the log
    std::cout.flush();
    ::_exit(0);
  }

  const double deadline_seconds_;
  std::mutex mu_;
  std::condition_variable cv_;
  int signal_ = 0;         // guarded by mu_
  bool finished_ = false;  // guarded by mu_
  std::thread thread_;
};

struct ServeOptions {
  std::string model_name = "default";
  std::string model_base_path;
  std::string model_platform = "kiln";
  std::string model_config_file;
  double model_config_file_poll_wait_seconds = 0;
  std::string port = "8500";           // gRPC: N, auto, or 0/-1 (off)
  std::string rest_api_port = "8501";  // REST: N, auto, or 0/-1 (off)
  std::string rest_api_bind = "127.0.0.1";
  std::string grpc_bind = "127.0.0.1";
  int rest_api_num_threads = 0;  // 0: FrontendOptions' default (the CPU count)
  int rest_api_max_threads = 0;  // accepted and ignored (the thread-per-connection server's cap)
  int64_t max_body_bytes = 64 << 20;
  bool enable_batching = false;
  std::string batching_parameters_file;
  int num_compute_threads = 0;  // without batching: 0 = on the I/O threads, N = N compute threads
  double file_system_poll_wait_seconds = 1;
  bool enable_model_warmup = true;
  bool resource_preserving = false;
  std::string bearer_token_file;
  bool enable_admin_routes = false;
  std::string admin_token_file;
  std::string ssl_cert, ssl_key;  // kiln's: HTTPS and gRPC TLS
  std::string ssl_client_ca;      // kiln's: mutual TLS wherever ssl_cert applies
  std::string ssl_config_file;    // TF Serving's: gRPC TLS (SSLConfig text proto)
};

// TLS for REST and gRPC from the flags. TF Serving's --ssl_config_file
// covers gRPC only (its REST API has no TLS), and keeps doing only that here;
// kiln's --ssl_cert/--ssl_key (and --ssl_client_ca with them) cover REST, and
// gRPC too unless --ssl_config_file is given. So mutual TLS on REST is asked
// for explicitly, never switched on by a gRPC config's client_verify.
void tls_from_flags(const ServeOptions& o, serving::TlsOptions* rest, serving::TlsOptions* grpc) {
  using namespace kiln::serving;
  if (o.ssl_cert.empty() != o.ssl_key.empty())
    throw ValueError(o.ssl_cert.empty() ? "--ssl_key needs --ssl_cert (the certificate that goes with the key)"
                                        : "--ssl_cert needs --ssl_key (the certificate's private key)");
  if (!o.ssl_client_ca.empty() && o.ssl_cert.empty())
    throw ValueError(
        "--ssl_client_ca needs --ssl_cert and --ssl_key: client certificates are checked in the TLS "
        "handshake (for gRPC alone, set custom_ca and client_verify in --ssl_config_file)");
  if (!o.ssl_cert.empty()) {
    rest->cert_pem = read_option_file(o.ssl_cert, "--ssl_cert");
    rest->key_pem = read_option_file(o.ssl_key, "--ssl_key");
    if (!o.ssl_client_ca.empty()) {
      rest->client_ca_pem = read_option_file(o.ssl_client_ca, "--ssl_client_ca");
      check_client_ca(rest->client_ca_pem, "--ssl_client_ca " + o.ssl_client_ca);
      rest->client_verify = true;
    }
    check_tls_options(*rest, "--ssl_cert " + o.ssl_cert + " / --ssl_key " + o.ssl_key);
    *grpc = *rest;
  }
  if (!o.ssl_config_file.empty()) {
    const std::string source = "--ssl_config_file " + o.ssl_config_file;
    *grpc = parse_ssl_config(read_option_file(o.ssl_config_file, "--ssl_config_file"), source);
    check_tls_options(*grpc, source);
  }
}

// --port / --rest_api_port: a port number; `auto` (the kernel picks a free
// one: FrontendOptions::port 0); 0 or -1: off (-1 as kiln always took; 0 as
// TF Serving's --rest_api_port). ValueError naming the flag otherwise.
int parse_port(const std::string& value, const std::string& flag) {
  if (value == "auto") return 0;
  size_t used = 0;
  long n = -2;
  try {
    n = std::stol(value, &used);
  } catch (...) {
    used = 0;
  }
  if (used == value.size() && (n == 0 || n == -1)) return -1;
  if (used != value.size() || n < 1 || n > 65535)
    throw ValueError(flag + " must be a port number (1-65535), `auto` (a free port) or 0 (off). Received: " + flag +
                     "=" + value);
  return static_cast<int>(n);
}

// One token on one line (trailing white space dropped); ValueError naming the flag otherwise.
std::string read_token_file(const std::string& path, const std::string& flag) {
  std::string token = read_option_file(path, flag);
  while (!token.empty() && std::isspace((unsigned char)token.back())) token.pop_back();
  if (token.empty()) throw ValueError(flag + " " + path + " is empty; put the token clients must send in it");
  if (token.find_first_of(" \t\r\n") != std::string::npos)
    throw ValueError(flag + " " + path + ": the token contains white space; put one token on one line");
  return token;
}

void run_serve(const ServeOptions& o) {
  using namespace kiln::serving;
  const int rest_port_flag = parse_port(o.rest_api_port, "--rest_api_port");
  const int grpc_port_flag = parse_port(o.port, "--port");
  ServerCoreOptions co;
  if (!o.model_config_file.empty()) {
    if (!o.model_base_path.empty()) throw ValueError("give either --model_config_file or --model_base_path, not both");
    co.config = read_model_config_file(o.model_config_file);
  } else if (!o.model_base_path.empty()) {
    ModelConfig m;
    m.name = o.model_name;
    m.base_path = o.model_base_path;
    m.model_platform = o.model_platform;
    co.config.models = {m};
  } else {
    throw ValueError("kiln serve needs --model_base_path DIR (with --model_name) or --model_config_file FILE");
  }
  co.file_system_poll_wait_seconds = o.file_system_poll_wait_seconds;
  co.enable_batching = o.enable_batching || !o.batching_parameters_file.empty();
  if (!o.batching_parameters_file.empty())
    co.batching = parse_batching_parameters(read_option_file(o.batching_parameters_file, "--batching_parameters_file"),
                                            "--batching_parameters_file " + o.batching_parameters_file);
  co.num_compute_threads = o.num_compute_threads;
  co.enable_warmup = o.enable_model_warmup;
  co.resource_preserving = o.resource_preserving;
  co.validate();
  TlsOptions rest_tls, grpc_tls;
  tls_from_flags(o, &rest_tls, &grpc_tls);
  std::string bearer_token;
  if (!o.bearer_token_file.empty()) bearer_token = read_token_file(o.bearer_token_file, "--bearer_token_file");

  // Signals go to on_stop_signal; the server's threads block them, and
  // StopWatcher's thread (started below, before the models load) takes them.
  if (stop_pipe[0] < 0 && ::pipe(stop_pipe) != 0) throw IOError("kiln serve: cannot create a pipe for signals");
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  FrontendOptions fo;
  // A stop signal ends the server within the front ends' drain and 5 s more,
  // whatever a model load is doing (StopWatcher).
  StopWatcher watcher(fo.drain_seconds + 5);
  ServerCore core(co);
  core.start();
  if (watcher.stop_requested()) return;  // stopped while the first versions loaded
  fo.host = o.rest_api_bind;
  fo.port = rest_port_flag;
  if (o.rest_api_num_threads > 0) fo.num_threads = o.rest_api_num_threads;
  fo.max_body_bytes = (size_t)o.max_body_bytes;
  fo.bearer_token = bearer_token;
  fo.enable_admin = o.enable_admin_routes;
  if (!o.admin_token_file.empty()) {
    if (!o.enable_admin_routes)
      throw ValueError("--admin_token_file needs --enable_admin_routes (admin routes are off without it)");
    fo.admin_token = read_token_file(o.admin_token_file, "--admin_token_file");
  }
  fo.validate();
  fo.tls = rest_tls;
  std::unique_ptr<Frontend> rest, grpc;
  int rest_port = -1, grpc_port = -1;
  if (rest_port_flag >= 0) {
    rest = std::make_unique<RestServer>(core, fo);
    rest_port = rest->start();
  }
  if (grpc_port_flag >= 0) {
    if (const FrontendFactory* f = grpc_frontend_factory()) {
      FrontendOptions go = fo;
      go.host = o.grpc_bind;
      go.port = grpc_port_flag;
      // gRPC's polling threads (one completion queue each): as many as REST's
      // I/O threads. Both front ends are asynchronous, so no thread waits for
      // a batch and the CPU count is enough.
      go.tls = grpc_tls;
      grpc = (*f)(core, go);
      grpc_port = grpc->start();
    } else {
      spdlog::warn("serving: no gRPC front end is linked into this build; --port ignored");
    }
  }
  std::cout << "kiln serve: ready rest_port=" << rest_port << " grpc_port=" << grpc_port << std::endl;

  // Config file polling: reload when the content changes.
  std::atomic<bool> done{false};
  std::thread config_poller;
  if (!o.model_config_file.empty() && o.model_config_file_poll_wait_seconds > 0) {
    config_poller = std::thread([&] {
      std::string last = read_option_file(o.model_config_file, "--model_config_file");
      std::mutex mu;
      std::condition_variable cv;
      while (!done) {
        std::unique_lock<std::mutex> l(mu);
        cv.wait_for(l, std::chrono::duration<double>(o.model_config_file_poll_wait_seconds),
                    [&] { return done.load(); });
        if (done) break;
        try {
          std::string now = read_option_file(o.model_config_file, "--model_config_file");
          if (now != last) {
            core.reload_config(parse_model_config(now, o.model_config_file));
            spdlog::info("serving: reloaded {}", o.model_config_file);
            last = now;
          }
        } catch (const std::exception& e) {
          spdlog::error("serving: config reload failed (keeping the current one): {}", e.what());
        }
      }
    });
  }
  watcher.wait_for_stop();
  done = true;
  if (config_poller.joinable()) config_poller.join();  // wakes within one poll interval
  if (grpc) grpc->stop();
  if (rest) rest->stop();
  core.stop();
}

}  // namespace

Command add_serve_command(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  auto* cmd = app.add_subcommand("serve", "Serve model versions over REST (TF Serving v1, KServe v2) and gRPC");
  cmd->add_option("--model_name", o->model_name, "Name of the model (with --model_base_path)");
  cmd->add_option("--model_base_path", o->model_base_path, "Directory holding <version>/ model directories");
  cmd->add_option("--model_platform", o->model_platform, "Servable kind (default kiln)");
  cmd->add_option("--model_config_file", o->model_config_file, "model_config_list (protobuf text or JSON)");
  cmd->add_option("--model_config_file_poll_wait_seconds", o->model_config_file_poll_wait_seconds,
                  "Re-read the config file this often (0: never)");
  cmd->add_option("--port", o->port, "gRPC port; auto: a free port (printed on the ready line); 0 or -1: off");
  cmd->add_option("--grpc_bind", o->grpc_bind, "gRPC listen address (default loopback)");
  cmd->add_option("--rest_api_port", o->rest_api_port,
                  "REST port; auto: a free port (printed on the ready line); 0 or -1: off");
  cmd->add_option("--rest_api_bind", o->rest_api_bind, "REST listen address (default loopback)");
  cmd->add_option("--rest_api_num_threads", o->rest_api_num_threads,
                  "REST I/O threads, each serving many connections, and gRPC's completion queues, one polling "
                  "thread each (default for both: the number of CPUs)")
      ->check(positive_integer());
  cmd->add_option("--rest_api_max_threads", o->rest_api_max_threads,
                  "Ignored (accepted for old scripts): the REST server no longer needs a thread per connection")
      ->check(positive_integer());
  cmd->add_option("--max_body_bytes", o->max_body_bytes, "Largest request body accepted (413 beyond)");
  cmd->add_flag("--enable_batching", o->enable_batching, "Batch requests per model version");
  cmd->add_option("--batching_parameters_file", o->batching_parameters_file,
                  "TF Serving batching parameters (text); max_batch_size and batch_timeout_micros left out take the "
                  "device's defaults (CPU: 32 rows, 1000 us; GPU: 256 rows, 2000 us)");
  cmd->add_option("--num_compute_threads", o->num_compute_threads,
                  "Without batching: run predictions on this many compute threads (one intra-op thread each) "
                  "instead of the I/O threads (default 0: on the I/O threads)")
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--file_system_poll_wait_seconds", o->file_system_poll_wait_seconds,
                  "Scan base paths for new versions this often (0: only at start)");
  cmd->add_option("--enable_model_warmup", o->enable_model_warmup,
                  "Replay assets/extra/warmup_requests.jsonl (default true)");
  cmd->add_flag("--resource_preserving", o->resource_preserving, "Unload the old version before loading the new one");
  cmd->add_option("--bearer_token_file", o->bearer_token_file,
                  "Require Authorization: Bearer <token in this file> (health checks excepted)");
  cmd->add_flag("--enable_admin_routes", o->enable_admin_routes,
                "Serve the admin calls (REST :load, :unload, /v1/config:reload; gRPC HandleReloadConfigRequest), "
                "which then need the admin token");
  cmd->add_option("--admin_token_file", o->admin_token_file,
                  "Admin calls need Authorization: Bearer <token in this file> (default: the --bearer_token_file "
                  "token)");
  cmd->add_option("--ssl_cert", o->ssl_cert, "PEM certificate (chain): serve HTTPS and gRPC over TLS (with --ssl_key)");
  cmd->add_option("--ssl_key", o->ssl_key, "PEM private key of --ssl_cert");
  cmd->add_option("--ssl_client_ca", o->ssl_client_ca,
                  "PEM CA certificate(s): mutual TLS wherever --ssl_cert applies (HTTPS, and gRPC unless "
                  "--ssl_config_file); clients without a certificate signed by it are refused in the handshake");
  cmd->add_option("--ssl_config_file", o->ssl_config_file,
                  "TF Serving SSLConfig (text: server_key, server_cert, custom_ca, client_verify) for gRPC only, as "
                  "in TF Serving (for REST use --ssl_cert/--ssl_key/--ssl_client_ca)");
  return {cmd, [o] { run_serve(*o); }};
}

}  // namespace kiln::cli
