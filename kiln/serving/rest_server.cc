#include "kiln/serving/rest_server.h"

#include <spdlog/spdlog.h>

#include <sys/socket.h>

#include <cerrno>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <regex>
#include <set>
#include <thread>

#include "kiln/core/error.h"
#include "kiln/serving/httplib.h"
#include "kiln/serving/inference.h"
#include "kiln/serving/rest_codec.h"
#include "kiln/serving/tensor_proto.h"
#include "kiln/serving/tls.h"

namespace kiln::serving {

namespace {

using Req = httplib::Request;
using Res = httplib::Response;

const char* kModel = "([^/:]+)";
const char* kSel = "(?:/versions/([0-9]+)|/labels/([^/:]+))?";

int64_t micros(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t).count();
}

// Plain HTTP, or HTTPS when options.tls is set (checked first, so a bad
// certificate or key is a ValueError here rather than failed handshakes).
std::unique_ptr<httplib::Server> make_http_server(const FrontendOptions& o) {
  check_tls_options(o.tls, "REST TLS");
  if (!o.tls.enabled()) return std::make_unique<httplib::Server>();
  auto s = std::make_unique<httplib::SSLServer>([tls = o.tls](SSL_CTX& ctx) { return configure_ssl_ctx(&ctx, tls); });
  if (!s->is_valid())
    throw ValueError(
        "REST TLS: OpenSSL refused the certificate or key; check them with "
        "`openssl x509 -in CERT -noout` and `openssl pkey -in KEY -noout`");
  return s;
}

// cpp-httplib's TaskQueue with a pool that grows. httplib keeps a
// connection on one thread for as long as it stays open (keep-alive), so
// its fixed ThreadPool let the first num_threads clients hold every thread
// and the next client waited until one of them closed (idle keep-alive:
// 5 s; an active one: 1,000 requests). Here a job that finds no idle
// thread starts one, up to `max_threads`; threads above `min_threads` end
// after `idle` without work.
class ElasticTaskQueue : public httplib::TaskQueue {
 public:
  ElasticTaskQueue(size_t min_threads, size_t max_threads, std::chrono::seconds idle)
      : min_(min_threads), max_(std::max(min_threads, max_threads)), idle_timeout_(idle) {
    std::lock_guard<std::mutex> l(mu_);
    for (size_t i = 0; i < min_; ++i) spawn_locked();
  }
  ~ElasticTaskQueue() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    std::lock_guard<std::mutex> l(mu_);
    jobs_.push_back(std::move(fn));
    reap_locked();
    if (idle_ < jobs_.size() && threads_.size() < max_)
      spawn_locked();
    else
      cv_.notify_one();
  }

  void shutdown() override {
    std::list<std::thread> all;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (shutdown_) return;
      shutdown_ = true;
    }
    cv_.notify_all();
    for (;;) {  // workers finish their jobs (httplib has closed the listener)
      std::thread t;
      {
        std::lock_guard<std::mutex> l(mu_);
        if (threads_.empty()) break;
        t = std::move(threads_.front());
        threads_.pop_front();
      }
      t.join();
    }
  }

 private:
  void spawn_locked() {
    threads_.emplace_back([this] { work(); });
  }

  // Joins threads that ended on their idle timeout (they only return).
  void reap_locked() {
    for (auto id : exited_)
      for (auto it = threads_.begin(); it != threads_.end(); ++it)
        if (it->get_id() == id) {
          it->join();
          threads_.erase(it);
          break;
        }
    exited_.clear();
  }

  void work() {
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      ++idle_;
      bool woke = cv_.wait_for(l, idle_timeout_, [&] { return shutdown_ || !jobs_.empty(); });
      --idle_;
      if (!jobs_.empty()) {
        auto fn = std::move(jobs_.front());
        jobs_.pop_front();
        l.unlock();
        fn();
        l.lock();
        continue;
      }
      if (shutdown_) return;
      if (!woke && threads_.size() - exited_.size() > min_) break;
    }
    exited_.push_back(std::this_thread::get_id());
  }

  const size_t min_, max_;
  const std::chrono::seconds idle_timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;  // guarded by mu_
  std::list<std::thread> threads_;          // guarded by mu_
  std::vector<std::thread::id> exited_;     // guarded by mu_: ended, not yet joined
  size_t idle_ = 0;                         // guarded by mu_
  bool shutdown_ = false;                   // guarded by mu_
};

}  // namespace

struct RestServer::Impl {
  ServerCore& core;
  FrontendOptions o;
  std::unique_ptr<httplib::Server> server;  // an SSLServer with TLS
  httplib::Server& svr;
  std::thread thread;
  int port = -1;
  int listen_fd = -1;  // the listening socket, set by httplib's socket-options hook

  Impl(ServerCore& c, FrontendOptions opts) : core(c), o(std::move(opts)), server(make_http_server(o)), svr(*server) {}

  static void reply(Res& res, int code, const Json& j) {
    res.status = code;
    res.set_content(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), "application/json");
  }
  static void error(Res& res, const Status& s) { reply(res, http_status(s.code), Json{{"error", s.message}}); }

  ModelSpec spec_from(const Req& req, bool tfs) {
    ModelSpec s;
    s.name = req.matches[1];
    if (!is_valid_model_name(s.name))
      throw ServingError(Code::kInvalidArgument, "invalid model name \"" + s.name + "\"");
    if (req.matches.size() > 2 && req.matches[2].matched) {
      const std::string v = req.matches[2];
      if (v.size() > 18) throw ServingError(Code::kInvalidArgument, "version number too large: " + v);
      s.version = std::stoll(v);
    }
    if (tfs && req.matches.size() > 3 && req.matches[3].matched) s.label = std::string(req.matches[3]);
    return s;
  }

  Deadline deadline_of(const Req& req) {
    if (!req.has_header("X-Request-Timeout-Ms")) return std::nullopt;
    std::string v = req.get_header_value("X-Request-Timeout-Ms");
    try {
      size_t used = 0;
      long long ms = std::stoll(v, &used);
      if (used != v.size() || ms < 0) throw 0;
      return Clock::now() + std::chrono::milliseconds(ms);
    } catch (...) {
      throw ServingError(Code::kInvalidArgument, "X-Request-Timeout-Ms must be a non-negative integer. Received: " + v);
    }
  }

  bool authorized(const Req& req, Res& res) {
    if (o.bearer_token.empty()) return true;
    if (bearer_token_matches(req.get_header_value("Authorization"), o.bearer_token)) return true;
    res.set_header("WWW-Authenticate", "Bearer");
    error(res, {Code::kUnauthenticated,
                req.has_header("Authorization")
                    ? "wrong bearer token; send the server's token as \"Authorization: Bearer <token>\""
                    : "missing bearer token; send \"Authorization: Bearer <token>\""});
    return false;
  }

  void admin(const Req& req) {
    AdminCheck c = check_admin(o, req.get_header_value("Authorization"));
    if (!c.allowed) throw ServingError(c.unauthenticated ? Code::kUnauthenticated : Code::kPermissionDenied, c.message);
  }

  // Wraps a handler: auth (unless `open`: the health checks), error mapping,
  // never lets an exception escape.
  template <class F>
  httplib::Server::Handler wrap(F f, bool open = false) {
    return [this, f, open](const Req& req, Res& res) {
      if (!open && !authorized(req, res)) return;
      try {
        f(req, res);
      } catch (...) {
        error(res, status_of_current_exception());
      }
    };
  }

  void tfs_predict(const Req& req, Res& res) {
    ModelSpec spec = spec_from(req, true);
    std::string api = req.matches[4];
    RequestTiming t;
    Status st;
    int64_t version = 0;
    try {
      Deadline deadline = deadline_of(req);
      auto h = core.get(spec);
      version = h->version;
      auto t0 = Clock::now();
      if (api == "predict") {
        PredictCall call;
        if (!decode_predict_fast(req.body, h->signatures(), &call))
          call = decode_predict_request(parse_request_json(req.body, o.max_json_depth), h->signatures());
        t.parse_us = micros(t0);
        TensorMap out = core.predict(*h, call.signature_name, call.inputs, deadline, &t);
        auto t1 = Clock::now();
        res.status = 200;
        res.set_content(predict_response_text(out, call.row_format), "application/json");
        t.serialize_us = micros(t1);
      } else {
        classify_or_regress(*h, api, parse_request_json(req.body, o.max_json_depth), deadline, t, res);
      }
    } catch (...) {
      st = status_of_current_exception();
      error(res, st);
    }
    core.record_request(spec.name, version, "rest", api, st, t);
  }

  void classify_or_regress(const ServableHandle& h, const std::string& api, const Json& body, Deadline deadline,
                           RequestTiming& t, Res& res) {
    auto t0 = Clock::now();
    if (!body.is_object()) throw ServingError(Code::kInvalidArgument, "the request body must be a JSON object");
    InferenceSignature sig = inference_signature(h.signatures(), body.value("signature_name", std::string()),
                                                 api == "classify" ? InferenceApi::kClassify : InferenceApi::kRegress);
    if (!body.contains("examples") || !body["examples"].is_array() || body["examples"].empty())
      throw ServingError(Code::kInvalidArgument, "\"examples\" must be a non-empty list of {feature: value} objects");
    Json instances = Json::array();
    for (auto& ex : body["examples"]) {
      if (!ex.is_object()) throw ServingError(Code::kInvalidArgument, "each example must be an object");
      Json merged = body.contains("context") && body["context"].is_object() ? body["context"] : Json::object();
      for (auto& [k, v] : ex.items()) merged[k] = v;
      instances.push_back(merged);
    }
    PredictCall call =
        decode_predict_request(Json{{"signature_name", sig.name}, {"instances", instances}}, h.signatures());
    t.parse_us = micros(t0);
    TensorMap out = core.predict(h, sig.name, call.inputs, deadline, &t);
    auto t1 = Clock::now();
    Json results = Json::array();
    if (sig.api == InferenceApi::kClassify) {
      Classifications c = classifications_of(sig, out);
      for (int64_t i = 0; i < c.examples; ++i) {
        Json row = Json::array();
        for (int64_t k = 0; k < c.classes; ++k) row.push_back(Json::array({c.label(i, k), c.score(i, k)}));
        results.push_back(row);
      }
    } else {
      for (float v : regressions_of(sig, out)) results.push_back(v);
    }
    reply(res, 200, Json{{"results", results}});
    t.serialize_us = micros(t1);
  }

  Json kserve_tensor_meta(const Json& specs) {
    Json out = Json::array();
    for (auto& [name, s] : specs.items()) {
      Json shape = Json::array();
      for (auto& d : s["shape"]) shape.push_back(d.is_null() ? -1 : d.get<int64_t>());
      at::ScalarType st = at::kFloat;
      try {
        st = dtype_from_string_safe(s.value("dtype", "float32"));
      } catch (...) {
      }
      out.push_back(Json{{"name", name}, {"datatype", kserve_datatype(st)}, {"shape", shape}});
    }
    return out;
  }

  static at::ScalarType dtype_from_string_safe(const std::string& d);

  void kserve_infer(const Req& req, Res& res) {
    ModelSpec spec = spec_from(req, false);
    RequestTiming t;
    Status st;
    int64_t version = 0;
    try {
      Deadline deadline = deadline_of(req);
      auto h = core.get(spec);
      version = h->version;
      auto t0 = Clock::now();
      KServeInferBody body;
      if (!decode_kserve_infer_fast(req.body, &body))
        body = decode_kserve_infer(parse_request_json(req.body, o.max_json_depth));
      const Json& sig = h->signatures()[kDefaultSignature];
      TensorMap inputs;
      for (auto& in : body.inputs) {
        const std::string& name = in.name;
        if (!sig["inputs"].contains(name)) throw ServingError(Code::kInvalidArgument, "unknown input \"" + name + "\"");
        at::ScalarType dt;
        const std::string& datatype = in.datatype;
        if (!kserve_to_scalar_type(datatype, &dt))
          throw ServingError(Code::kInvalidArgument,
                             "unsupported datatype \"" + datatype + "\" for input \"" + name + "\"");
        at::ScalarType want = dtype_from_string_safe(sig["inputs"][name].value("dtype", "float32"));
        if (dt != want)
          throw ServingError(Code::kInvalidArgument, "input \"" + name + "\" has datatype " + datatype +
                                                         "; the model expects " + kserve_datatype(want));
        int64_t n = 1;
        for (auto d : in.shape) n *= d;
        const std::string where = "input \"" + name + "\"";
        at::Tensor flat = in.has_numbers
                              ? checked_numbers_to_tensor(in.numbers, {(int64_t)in.numbers.size()}, dt, where)
                              : json_to_tensor(in.data, dt, where).reshape({-1});
        if (flat.numel() != n)
          throw ServingError(Code::kInvalidArgument, where + ": shape " + Json(in.shape).dump() + " holds " +
                                                         std::to_string(n) + " values; data has " +
                                                         std::to_string(flat.numel()));
        inputs[name] = flat.reshape(in.shape);
      }
      t.parse_us = micros(t0);
      TensorMap out = core.predict(*h, kDefaultSignature, inputs, deadline, &t);
      auto t1 = Clock::now();
      std::set<std::string> wanted;
      for (auto& o : body.outputs) {
        if (!out.count(o)) throw ServingError(Code::kInvalidArgument, "unknown output \"" + o + "\"");
        wanted.insert(o);
      }
      Json outs = Json::array();
      for (auto& [name, v] : out) {
        if (!wanted.empty() && !wanted.count(name)) continue;
        Json shape = Json::array();
        for (auto d : v.sizes()) shape.push_back(d);
        outs.push_back(Json{{"name", name},
                            {"datatype", kserve_datatype(v.scalar_type())},
                            {"shape", shape},
                            {"data", tensor_to_json(v.reshape({-1}))}});
      }
      Json r{{"model_name", h->model_name}, {"model_version", std::to_string(h->version)}, {"outputs", outs}};
      if (!body.id.is_null()) r["id"] = body.id;
      reply(res, 200, r);
      t.serialize_us = micros(t1);
    } catch (...) {
      st = status_of_current_exception();
      error(res, st);
    }
    core.record_request(spec.name, version, "kserve_rest", "infer", st, t);
  }

  void routes() {
    std::string m = kModel, sel = kSel;
    // --- TF Serving REST v1 ---
    svr.Get("/v1/models/" + m + sel,
            wrap([this](const Req& req, Res& res) { reply(res, 200, core.model_status_json(spec_from(req, true))); }));
    svr.Get("/v1/models/" + m + sel + "/metadata", wrap([this](const Req& req, Res& res) {
              auto h = core.get(spec_from(req, true));
              reply(res, 200, tfs_metadata_json(*h));
            }));
    svr.Post("/v1/models/" + m + sel + ":(predict|classify|regress)",
             wrap([this](const Req& req, Res& res) { tfs_predict(req, res); }));
    // Admin routes: always routed, so a call while they are off gets a 403
    // naming the flag; their own token (check_admin) instead of the bearer one.
    {
      svr.Post("/v1/models/" + m + ":load",
               wrap(
                   [this](const Req& req, Res& res) {
                     admin(req);
                     std::string name = req.matches[1];
                     Json body = req.body.empty() ? Json::object() : parse_request_json(req.body, o.max_json_depth);
                     body["name"] = name;
                     ModelServerConfig c = parse_model_config_json(Json{{"model_config_list", Json::array({body})}});
                     core.load_model(c.models[0]);
                     reply(res, 200, Json{{"status", "loading"}, {"model", name}});
                   },
                   true));
      svr.Post("/v1/models/" + m + ":unload", wrap(
                                                  [this](const Req& req, Res& res) {
                                                    admin(req);
                                                    std::string name = req.matches[1];
                                                    core.unload_model(name);
                                                    reply(res, 200, Json{{"status", "unloading"}, {"model", name}});
                                                  },
                                                  true));
      svr.Post("/v1/config:reload", wrap(
                                        [this](const Req& req, Res& res) {
                                          admin(req);
                                          if (json_depth(req.body, o.max_json_depth) > o.max_json_depth)
                                            throw ServingError(Code::kInvalidArgument, "config nesting too deep");
                                          core.reload_config(parse_model_config(req.body));
                                          reply(res, 200, core.config().to_json());
                                        },
                                        true));
    }
    // --- KServe v2 ---
    // Health checks answer without a token: Kubernetes probes and load
    // balancers call them without credentials, and they reveal only up/ready.
    svr.Get("/v2/health/live", wrap([](const Req&, Res& res) { reply(res, 200, Json{{"live", true}}); }, true));
    svr.Get("/v2/health/ready", wrap(
                                    [this](const Req&, Res& res) {
                                      bool r = core.ready();
                                      reply(res, r ? 200 : 400, Json{{"ready", r}});
                                    },
                                    true));
    svr.Get("/v2", wrap([](const Req&, Res& res) {
              reply(res, 200, Json{{"name", "kiln"}, {"version", "1"}, {"extensions", Json::array()}});
            }));
    std::string vsel = "(?:/versions/([0-9]+))?";
    svr.Get("/v2/models/" + m + vsel, wrap([this](const Req& req, Res& res) {
              ModelSpec spec = spec_from(req, false);
              auto h = core.get(spec);
              Json versions = Json::array();
              for (auto& s : core.model_status({spec.name, spec.version, std::nullopt}))
                if (s.state == VersionState::kReady) versions.push_back(std::to_string(s.version));
              const Json& sig = h->signatures()[kDefaultSignature];
              reply(res, 200,
                    Json{{"name", spec.name},
                         {"versions", versions},
                         {"platform", "kiln"},
                         {"inputs", kserve_tensor_meta(sig["inputs"])},
                         {"outputs", kserve_tensor_meta(sig["outputs"])}});
            }));
    svr.Get("/v2/models/" + m + vsel + "/ready", wrap([this](const Req& req, Res& res) {
              ModelSpec spec = spec_from(req, false);
              core.model_status(spec);  // NOT_FOUND for an unknown model/version
              bool r = core.is_ready(spec);
              reply(res, r ? 200 : 400, Json{{"name", spec.name}, {"ready", r}});
            }));
    svr.Post("/v2/models/" + m + vsel + "/infer", wrap([this](const Req& req, Res& res) { kserve_infer(req, res); }));
    // --- metrics ---
    auto metrics = wrap([this](const Req&, Res& res) {
      res.status = 200;
      res.set_content(core.metrics().expose(), "text/plain; version=0.0.4; charset=utf-8");
    });
    svr.Get("/monitoring/prometheus/metrics", metrics);
    svr.Get("/metrics", metrics);

    svr.set_error_handler([](const Req& req, Res& res) {
      if (!res.body.empty()) return;
      std::string msg = res.status == 404   ? "no route for " + req.method + " " + req.path
                        : res.status == 413 ? "request body too large"
                                            : "HTTP error " + std::to_string(res.status);
      res.set_content(Json{{"error", msg}}.dump(), "application/json");
    });
    svr.set_exception_handler([](const Req&, Res& res, std::exception_ptr ep) {
      Status s;
      try {
        std::rethrow_exception(ep);
      } catch (...) {
        s = status_of_current_exception();
      }
      error(res, s);
    });
  }
};

at::ScalarType RestServer::Impl::dtype_from_string_safe(const std::string& d) {
  static const std::map<std::string, at::ScalarType> m{
      {"float32", at::kFloat}, {"float64", at::kDouble}, {"float16", at::kHalf}, {"bfloat16", at::kBFloat16},
      {"int64", at::kLong},    {"int32", at::kInt},      {"int16", at::kShort},  {"int8", at::kChar},
      {"uint8", at::kByte},    {"bool", at::kBool}};
  auto it = m.find(d);
  return it == m.end() ? at::kFloat : it->second;
}

RestServer::RestServer(ServerCore& core, FrontendOptions options)
    : impl_(std::make_unique<Impl>(core, std::move(options))) {
  impl_->routes();
  impl_->svr.set_payload_max_length(impl_->o.max_body_bytes);
  size_t n = (size_t)std::max(1, impl_->o.num_threads), most = (size_t)std::max(1, impl_->o.max_rest_threads);
  impl_->svr.new_task_queue = [n, most] { return new ElasticTaskQueue(n, most, std::chrono::seconds(30)); };
  impl_->svr.set_read_timeout(30, 0);
  // cpp-httplib writes a response's headers and body with separate send()s;
  // with Nagle on, the body waits for the client's delayed ACK (40 ms on
  // Linux): every keep-alive request took 40+ ms (bench/serving_bench.sh).
  impl_->svr.set_tcp_nodelay(true);
  // Its default closes a keep-alive connection after 5 requests, so clients
  // reconnect every 5th request. A connection holds a worker thread while
  // open; the pool grows to max_rest_threads (ElasticTaskQueue), and past
  // that the count bounds how long a queued connection waits for a turn.
  impl_->svr.set_keep_alive_max_count(1000);
  // Debian's cpp-httplib listens with a backlog of 5 (compiled in): a burst
  // of new connections (32 clients connecting at once while earlier requests
  // still run) overflowed the accept queue, and some connections were reset
  // (bench/serving_bench.sh: 3-27 of ~1,000 requests failed with ECONNRESET;
  // `nstat` showed TcpExtListenOverflows). Keep the listening socket to
  // raise the backlog after bind (see start()). SO_REUSEADDR only, not
  // httplib's default SO_REUSEPORT, so a second server on the same port fails
  // to bind instead of silently sharing its traffic.
  impl_->svr.set_socket_options([impl = impl_.get()](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    impl->listen_fd = sock;
  });
}

RestServer::~RestServer() { stop(); }

int RestServer::start() {
  if (impl_->port >= 0) return impl_->port;
  impl_->o.validate();
  // A client that disconnects while its answer is written must not kill the
  // server: OpenSSL writes with write(), and on a reset connection that
  // raises SIGPIPE, whose default ends the process (plain HTTP sends with
  // MSG_NOSIGNAL). `kiln serve` already had it ignored once gRPC's library
  // initialised; a process embedding only the REST front end did not.
  // Ignored, the write returns EPIPE and only that connection ends.
  std::signal(SIGPIPE, SIG_IGN);
  int port = impl_->o.port == 0 ? impl_->svr.bind_to_any_port(impl_->o.host)
                                : (impl_->svr.bind_to_port(impl_->o.host, impl_->o.port) ? impl_->o.port : -1);
  if (port < 0)
    throw IOError("REST server: cannot bind " + impl_->o.host + ":" + std::to_string(impl_->o.port) +
                  " (in use or not permitted); choose another --rest_api_port");
  impl_->port = port;
  // listen() again on a listening socket only changes its backlog (Linux).
  if (impl_->listen_fd >= 0 && ::listen(impl_->listen_fd, SOMAXCONN) != 0)
    spdlog::warn("serving: could not raise the REST listen backlog: {}", std::strerror(errno));
  impl_->thread = std::thread([this] { impl_->svr.listen_after_bind(); });
  spdlog::info("serving: REST API on {}://{}:{}{}", impl_->o.tls.enabled() ? "https" : "http", impl_->o.host, port,
               impl_->o.tls.enabled() && impl_->o.tls.client_verify ? " (client certificates required)" : "");
  return port;
}

void RestServer::stop() {
  if (impl_->port < 0) return;
  // stop() only acts on a running listener: wait until the thread got there.
  while (!impl_->svr.is_running()) std::this_thread::yield();
  impl_->svr.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->port = -1;
}

}  // namespace kiln::serving
