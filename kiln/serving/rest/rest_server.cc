#include "kiln/serving/rest/rest_server.h"

// Boost 1.74's asio/awaitable.hpp uses std::exchange without including
// <utility>: include it first.
#include <utility>

#include <spdlog/spdlog.h>

#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <csignal>
#include <cstring>
#include <future>
#include <list>
#include <mutex>
#include <optional>
#include <regex>
#include <set>
#include <thread>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/core/string_tensor.h"
#include "kiln/core/tensor_json.h"
#include "kiln/serving/api/kserve_v2.h"
#include "kiln/serving/api/run_inference.h"
#include "kiln/serving/api/tfs_v1.h"
#include "kiln/serving/codec/inference.h"
#include "kiln/serving/codec/rest_codec.h"
#include "kiln/serving/codec/tensor_proto.h"
#include "kiln/serving/tls.h"

namespace kiln::serving {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
// Connections run on their I/O thread's io_context, so their sockets and
// timers use its concrete executor. The default (any_io_executor) boxes the
// executor and copies it on every operation: with it, kiln's own code was
// 32% of the server's samples on an empty GET, without it 28%.
using Executor = asio::io_context::executor_type;
using Socket = asio::basic_stream_socket<tcp, Executor>;
using TcpStream = beast::basic_stream<tcp, Executor>;
using Request = http::request<http::string_body>;

// Waiting for a request's headers (an idle keep-alive connection included),
// a TLS handshake or a write; then the connection closes.
constexpr auto kIoTimeout = std::chrono::seconds(30);
// Reading one request body (up to max_body_bytes).
constexpr auto kBodyTimeout = std::chrono::seconds(120);
// After an error answer whose request body was not read (413, 400): how long
// the rest of it is read and dropped, so that the client reads the answer
// instead of a reset.
constexpr auto kLingerTimeout = std::chrono::seconds(2);
constexpr uint32_t kHeaderLimit = 64 << 10;
constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";

const char* const kModel = "([^/:]+)";
const char* const kSel = "(?:/versions/([0-9]+)|/labels/([^/:]+))?";

int64_t micros(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t).count();
}

// One answer.
struct Reply {
  int status = 200;
  std::string body;
  const char* content_type = "application/json";
  bool bearer_challenge = false;  // a 401: add "WWW-Authenticate: Bearer"
};

Reply json_reply(int status, const Json& j) {
  return {status, j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)};
}
Reply error_reply(const Status& s) { return json_reply(http_status(s.code), Json{{"error", s.message}}); }

// Answers that come from another thread (predict_async's `done`) pass
// through it: stop() closes it before it destroys the I/O contexts, so a
// late answer is dropped instead of being posted to a destroyed one.
struct Gate {
  std::mutex mu;
  bool open = true;  // guarded by mu
};

// Sends one answer to the connection it came from; callable from any thread, once.
using Responder = std::function<void(Reply)>;

// A connection as the routing sees it (Conn<Stream> below: plain or TLS).
// Lives on one I/O thread: every member runs there.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(asio::io_context::executor_type exec, std::shared_ptr<Gate> gate)
      : exec_(std::move(exec)), gate_(std::move(gate)) {}
  virtual ~Connection() = default;
  // Writes the answer to the request being handled.
  virtual void send(Reply reply) = 0;
  // stop(): close now if waiting for a request; otherwise after the answer.
  virtual void drain() = 0;
  // For an answer given later from another thread. Holds the connection
  // weakly: its worker's list owns it, and a connection that ended (client
  // gone, server stopped) drops the answer.
  Responder responder() {
    return [gate = gate_, exec = exec_, weak = weak_from_this()](Reply r) {
      std::lock_guard<std::mutex> l(gate->mu);
      if (!gate->open) return;
      if (auto c = weak.lock())
        asio::post(exec, [c = std::move(c), r = std::move(r)]() mutable { c->send(std::move(r)); });
    };
  }
  std::list<std::shared_ptr<Connection>>::iterator self;  // in its worker's list

 private:
  asio::io_context::executor_type exec_;
  std::shared_ptr<Gate> gate_;
};

// One I/O thread: its loop and the connections it serves.
struct Worker {
  asio::io_context ctx{1};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> guard{ctx.get_executor()};
  std::list<std::shared_ptr<Connection>> conns;  // only touched on `thread` (and by stop() after joining it)
  std::thread thread;
};

// A routed request, as a handler sees it. `m` points into `path`.
struct Call {
  const Request& req;
  const std::string& path;
  std::smatch m;
  Connection& conn;
  bool matched(size_t i) const { return i < m.size() && m[i].matched; }
  std::string match(size_t i) const { return matched(i) ? m[i].str() : std::string(); }
};

std::string header(const Request& req, std::string_view name) {
  auto it = req.find(beast::string_view(name.data(), name.size()));
  return it == req.end() ? std::string() : std::string(it->value());
}
bool has_header(const Request& req, std::string_view name) {
  return req.find(beast::string_view(name.data(), name.size())) != req.end();
}

// %XX decoding of the path, as cpp-httplib did before routing.
std::string decode_path(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  auto hex = [](char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
  };
  for (size_t i = 0; i < s.size(); ++i) {
    int hi = 0, lo = 0;
    if (s[i] == '%' && i + 2 < s.size() + 0 && (hi = hex(s[i + 1])) >= 0 && (lo = hex(s[i + 2])) >= 0) {
      out += static_cast<char>(hi * 16 + lo);
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

// Everything but the connections: options, routes, the I/O threads and the
// acceptor. One acceptor (on the first I/O thread) hands each new socket to
// the next I/O thread in turn; a connection then stays on that thread, so
// its reads, handler and writes never need a lock.
class RestEngine {
 public:
  RestEngine(ServerCore& core, FrontendOptions o);
  ~RestEngine() { stop(); }
  int start();
  void stop();

  // Routes and runs one request on its connection's thread: the answer, or
  // nullopt when it comes later through conn.responder().
  std::optional<Reply> handle(const Request& req, Connection& conn);
  bool draining() const { return draining_.load(std::memory_order_relaxed); }
  const FrontendOptions& options() const { return o_; }
  void forget(Worker& w, Connection& c) {
    w.conns.erase(c.self);
    open_.fetch_sub(1);
  }

 private:
  struct Route {
    http::verb method;
    std::string exact;   // non-empty: the path
    std::string prefix;  // with `re`: checked first, cheaply
    std::regex re;
    bool open = false;  // no bearer token (health checks; admin calls check their own)
    std::function<std::optional<Reply>(Call&)> fn;
  };
  void add(http::verb method, std::string exact, std::function<std::optional<Reply>(Call&)> fn, bool open = false) {
    routes_.push_back({method, std::move(exact), "", std::regex(), open, std::move(fn)});
  }
  void add_re(http::verb method, std::string prefix, const std::string& re,
              std::function<std::optional<Reply>(Call&)> fn, bool open = false) {
    routes_.push_back({method, "", std::move(prefix), std::regex(re, std::regex::optimize), open, std::move(fn)});
  }
  void routes();
  void accept();
  void open_connection(Worker& w, Socket s);

  std::optional<Reply> unauthorized(const Request& req) const;
  void admin(const Request& req) const;
  ModelSpec spec_from(const Call& c, bool tfs) const;
  Deadline deadline_of(const Request& req) const;
  std::optional<Reply> tfs_predict(Call& c);
  std::optional<Reply> kserve_infer(Call& c);
  // predict_async, then (on whichever thread `done` runs) encode the
  // outputs, record the request and answer through the connection.
  template <class Encode>
  void predict_then(Connection& conn, ServableHandlePtr h, std::string signature, TensorMap inputs, Deadline deadline,
                    std::string model, const char* protocol, std::string api, int64_t parse_us, Encode encode);

  ServerCore& core_;
  FrontendOptions o_;
  std::vector<Route> routes_;
  std::unique_ptr<asio::ssl::context> ssl_;  // with TLS; outlives every connection
  std::vector<std::unique_ptr<Worker>> workers_;
  std::unique_ptr<tcp::acceptor> acceptor_;      // on workers_[0]
  std::unique_ptr<asio::steady_timer> backoff_;  // accept errors (EMFILE): retry later
  size_t next_ = 0;                              // round robin; on workers_[0]'s thread
  std::atomic<bool> draining_{false};
  std::atomic<int> open_{0};  // connections in the workers' lists
  std::shared_ptr<Gate> gate_;
  int port_ = -1;
};

// One HTTP/1.1 connection: read a request (headers, then the body, checked
// against the limits as they arrive), handle it, write the answer, repeat.
// One request at a time, so pipelined requests wait in `buf_` for their turn.
template <class Stream>
class Conn final : public Connection {
  static constexpr bool kTls = !std::is_same_v<Stream, TcpStream>;

 public:
  template <class... Args>
  Conn(RestEngine& engine, Worker& w, std::shared_ptr<Gate> gate, Args&&... stream_args)
      : Connection(w.ctx.get_executor(), std::move(gate)),
        engine_(engine),
        worker_(w),
        stream_(std::forward<Args>(stream_args)...) {
    buf_.reserve(16 << 10);  // else each recv reads at most the free capacity (512 bytes)
  }

  void start() {
    if constexpr (kTls) {
      phase_ = kIdle;
      lowest().expires_after(kIoTimeout);
      stream_.async_handshake(asio::ssl::stream_base::server, [self = me()](beast::error_code ec) {
        if (ec) return self->close();
        self->read();
      });
    } else {
      read();
    }
  }

  void send(Reply r) override {
    if (phase_ == kClosed) return;
    phase_ = kWriting;
    res_ = {};
    res_.version(req_.version());
    res_.result(static_cast<unsigned>(r.status));
    res_.set(http::field::content_type, r.content_type);
    if (r.bearer_challenge) res_.set(http::field::www_authenticate, "Bearer");
    res_.body() = std::move(r.body);
    res_.prepare_payload();
    if (req_.method() == http::verb::head) res_.body().clear();  // Content-Length stays
    keep_alive_ = keep_alive_ && req_.keep_alive() && !engine_.draining();
    res_.keep_alive(keep_alive_);
    lowest().expires_after(kIoTimeout);
    http::async_write(stream_, res_, [self = me()](beast::error_code ec, size_t) {
      if (ec) return self->close();
      if (!self->keep_alive_) return self->body_read_ ? self->close() : self->linger();
      self->read();
    });
  }

  void drain() override {
    if (phase_ == kIdle || phase_ == kLingering) close();
  }

 private:
  enum Phase { kIdle, kReadingBody, kHandling, kWriting, kLingering, kClosed };

  std::shared_ptr<Conn> me() { return std::static_pointer_cast<Conn>(shared_from_this()); }
  TcpStream& lowest() { return beast::get_lowest_layer(stream_); }

  void read() {
    if (engine_.draining()) return close();
    phase_ = kIdle;
    body_read_ = false;
    parser_.emplace();
    parser_->header_limit(kHeaderLimit);
    parser_->body_limit(engine_.options().max_body_bytes);
    lowest().expires_after(kIoTimeout);
    http::async_read_header(stream_, buf_, *parser_,
                            [self = me()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  void on_header(beast::error_code ec) {
    if (phase_ == kClosed) return;  // drain() closed it as the request arrived
    if (ec) return on_read_error(ec);
    if (parser_->is_done()) return on_request();
    phase_ = kReadingBody;
    // A Content-Length over the limit already failed above (body_limit),
    // before any of the body was read.
    if (beast::iequals(parser_->get()[http::field::expect], "100-continue")) {
      lowest().expires_after(kIoTimeout);
      asio::async_write(stream_, asio::buffer(kContinue.data(), kContinue.size()),
                        [self = me()](beast::error_code ec, size_t) {
                          if (ec) return self->close();
                          self->read_body();
                        });
      return;
    }
    read_body();
  }

  void read_body() {
    lowest().expires_after(kBodyTimeout);
    http::async_read(stream_, buf_, *parser_, [self = me()](beast::error_code ec, size_t) {
      if (ec) return self->on_read_error(ec);
      self->on_request();
    });
  }

  void on_read_error(beast::error_code ec) {
    if (phase_ == kClosed) return;
    const bool started = phase_ == kReadingBody || buf_.size() > 0;
    auto fail = [&](int status, std::string msg) {
      keep_alive_ = false;
      phase_ = kHandling;
      req_ = {};
      req_.version(11);
      send(json_reply(status, Json{{"error", std::move(msg)}}));
    };
    if (ec == http::error::body_limit) return fail(413, "request body too large");
    if (ec == http::error::header_limit) return fail(431, "request header fields too large");
    if (ec == http::error::end_of_stream || ec == http::error::partial_message || ec == beast::error::timeout ||
        ec.category() != http::make_error_code(http::error::bad_target).category() || !started)
      return close();
    fail(400, "malformed HTTP request: " + ec.message());
  }

  void on_request() {
    phase_ = kHandling;
    body_read_ = true;
    keep_alive_ = true;
    req_ = parser_->release();
    std::optional<Reply> r = engine_.handle(req_, *this);
    if (r) send(std::move(*r));
  }

  // The answer said "Connection: close" but the request's body may still be
  // arriving: stop sending, drop what comes for a while, then close, so the
  // client gets the answer rather than a reset.
  void linger() {
    phase_ = kLingering;
    beast::error_code ignored;
    lowest().socket().shutdown(tcp::socket::shutdown_send, ignored);
    lowest().expires_after(kLingerTimeout);
    discard();
  }
  void discard() {
    if (scratch_.empty()) scratch_.resize(64 << 10);
    lowest().async_read_some(asio::buffer(scratch_), [self = me()](beast::error_code ec, size_t) {
      if (ec) return self->close();
      self->discard();
    });
  }

  void close() {
    if (phase_ == kClosed) return;
    auto keep = shared_from_this();  // the worker's list may hold the last reference
    phase_ = kClosed;
    beast::error_code ignored;
    lowest().socket().shutdown(tcp::socket::shutdown_both, ignored);
    lowest().close();
    engine_.forget(worker_, *this);
  }

  RestEngine& engine_;
  Worker& worker_;
  Stream stream_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  Request req_;  // the request being handled
  http::response<http::string_body> res_;
  std::vector<char> scratch_;  // linger()
  Phase phase_ = kIdle;
  bool keep_alive_ = true;
  bool body_read_ = false;  // the whole request was read (a keep-alive answer is possible)
};

}  // namespace

RestEngine::RestEngine(ServerCore& core, FrontendOptions o) : core_(core), o_(std::move(o)) {
  // Checked here, so a bad certificate or key is a ValueError at construction
  // rather than failed handshakes.
  check_tls_options(o_.tls, "REST TLS");
  if (o_.tls.enabled()) {
    ssl_ = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_server);
    if (!configure_ssl_ctx(ssl_->native_handle(), o_.tls))
      throw ValueError(
          "REST TLS: OpenSSL refused the certificate or key; check them with "
          "`openssl x509 -in CERT -noout` and `openssl pkey -in KEY -noout`");
  }
  routes();
}

std::optional<Reply> RestEngine::handle(const Request& req, Connection& conn) {
  std::string_view target(req.target().data(), req.target().size());
  const std::string path = decode_path(target.substr(0, target.find('?')));
  const http::verb method = req.method() == http::verb::head ? http::verb::get : req.method();
  for (auto& r : routes_) {
    if (r.method != method) continue;
    Call c{req, path, {}, conn};
    if (!r.exact.empty()) {
      if (path != r.exact) continue;
    } else if (path.compare(0, r.prefix.size(), r.prefix) != 0 || !std::regex_match(path, c.m, r.re)) {
      continue;
    }
    if (!r.open)
      if (auto denied = unauthorized(req)) return denied;
    try {
      return r.fn(c);
    } catch (...) {
      return error_reply(status_of_current_exception());
    }
  }
  return json_reply(404, Json{{"error", "no route for " + std::string(req.method_string()) + " " + path}});
}

std::optional<Reply> RestEngine::unauthorized(const Request& req) const {
  if (o_.bearer_token.empty()) return std::nullopt;
  const bool has = has_header(req, "Authorization");
  if (has && bearer_token_matches(header(req, "Authorization"), o_.bearer_token)) return std::nullopt;
  Reply r = error_reply(
      {Code::kUnauthenticated, has ? "wrong bearer token; send the server's token as \"Authorization: Bearer <token>\""
                                   : "missing bearer token; send \"Authorization: Bearer <token>\""});
  r.bearer_challenge = true;
  return r;
}

void RestEngine::admin(const Request& req) const {
  AdminCheck c = check_admin(o_, header(req, "Authorization"));
  if (!c.allowed) throw ServingError(c.unauthenticated ? Code::kUnauthenticated : Code::kPermissionDenied, c.message);
}

ModelSpec RestEngine::spec_from(const Call& c, bool tfs) const {
  ModelSpec s;
  s.name = c.match(1);
  if (!is_valid_model_name(s.name)) throw ServingError(Code::kInvalidArgument, "invalid model name \"" + s.name + "\"");
  if (c.matched(2)) {
    const std::string v = c.match(2);
    if (v.size() > 18) throw ServingError(Code::kInvalidArgument, "version number too large: " + v);
    s.version = std::stoll(v);
  }
  if (tfs && c.matched(3)) s.label = c.match(3);
  return s;
}

Deadline RestEngine::deadline_of(const Request& req) const {
  if (!has_header(req, "X-Request-Timeout-Ms")) return std::nullopt;
  std::string v = header(req, "X-Request-Timeout-Ms");
  try {
    size_t used = 0;
    long long ms = std::stoll(v, &used);
    if (used != v.size() || ms < 0) throw 0;
    return Clock::now() + std::chrono::milliseconds(ms);
  } catch (...) {
    throw ServingError(Code::kInvalidArgument, "X-Request-Timeout-Ms must be a non-negative integer. Received: " + v);
  }
}

template <class Encode>
void RestEngine::predict_then(Connection& conn, ServableHandlePtr h, std::string signature, TensorMap inputs,
                              Deadline deadline, std::string model, const char* protocol, std::string api,
                              int64_t parse_us, Encode encode) {
  const int64_t version = h->version;
  // `finish` may run after this RestEngine is gone (stop() gave up waiting):
  // it uses only the core, which outlives its batch threads, and the responder.
  api::run_inference(core_, std::move(h), std::move(signature), std::move(inputs), deadline, parse_us,
                     std::move(encode),
                     [core = &core_, respond = conn.responder(), model = std::move(model), version, protocol,
                      api = std::move(api)](const Status& st, const RequestTiming& t, Reply r) {
                       core->record_request(model, version, protocol, api, st, t);
                       respond(st.ok() ? std::move(r) : error_reply(st));
                     });
}

std::optional<Reply> RestEngine::tfs_predict(Call& c) {
  ModelSpec spec = spec_from(c, true);
  const std::string api = c.match(4);
  RequestTiming t;
  int64_t version = 0;
  try {
    Deadline deadline = deadline_of(c.req);
    ServableHandlePtr h = core_.get(spec);
    version = h->version;
    auto t0 = Clock::now();
    const std::string& body = c.req.body();
    if (api == "predict") {
      PredictCall call;
      if (!decode_predict_fast(body, h->signatures(), &call))
        call = decode_predict_request(parse_request_json(body, o_.max_json_depth), h->signatures());
      t.parse_us = micros(t0);
      const bool rows = call.row_format;
      std::set<std::string> string_outputs = string_tensor_names(h->signatures(), call.signature_name).outputs;
      predict_then(c.conn, std::move(h), std::move(call.signature_name), std::move(call.inputs), deadline, spec.name,
                   "rest", api, t.parse_us, [rows, string_outputs = std::move(string_outputs)](const TensorMap& out) {
                     return Reply{200, predict_response_text(out, rows, string_outputs)};
                   });
      return std::nullopt;
    }
    // classify / regress: {"signature_name", "context": {...}, "examples": [{...}]}
    Json j = parse_request_json(body, o_.max_json_depth);
    if (!j.is_object()) throw ServingError(Code::kInvalidArgument, "the request body must be a JSON object");
    InferenceSignature sig = inference_signature(h->signatures(), j.value("signature_name", std::string()),
                                                 api == "classify" ? InferenceApi::kClassify : InferenceApi::kRegress);
    if (!j.contains("examples") || !j["examples"].is_array() || j["examples"].empty())
      throw ServingError(Code::kInvalidArgument, "\"examples\" must be a non-empty list of {feature: value} objects");
    Json instances = Json::array();
    for (auto& ex : j["examples"]) {
      if (!ex.is_object()) throw ServingError(Code::kInvalidArgument, "each example must be an object");
      Json merged = j.contains("context") && j["context"].is_object() ? j["context"] : Json::object();
      for (auto& [k, v] : ex.items()) merged[k] = v;
      instances.push_back(merged);
    }
    PredictCall call =
        decode_predict_request(Json{{"signature_name", sig.name}, {"instances", instances}}, h->signatures());
    t.parse_us = micros(t0);
    predict_then(c.conn, std::move(h), sig.name, std::move(call.inputs), deadline, spec.name, "rest", api, t.parse_us,
                 [sig](const TensorMap& out) {
                   // TF Serving's key "result"; floats as its predict replies write them
                   if (sig.api == InferenceApi::kClassify)
                     return Reply{200, classify_result_text(classifications_of(sig, out))};
                   return Reply{200, regress_result_text(regressions_of(sig, out))};
                 });
    return std::nullopt;
  } catch (...) {
    Status st = status_of_current_exception();
    core_.record_request(spec.name, version, "rest", api, st, t);
    return error_reply(st);
  }
}

std::optional<Reply> RestEngine::kserve_infer(Call& c) {
  ModelSpec spec = spec_from(c, false);
  RequestTiming t;
  int64_t version = 0;
  try {
    Deadline deadline = deadline_of(c.req);
    ServableHandlePtr h = core_.get(spec);
    version = h->version;
    auto t0 = Clock::now();
    const std::string& text = c.req.body();
    // The binary tensor data extension (Triton's; KServe clients send it
    // with this header) puts raw bytes after the JSON: name it instead of
    // failing on the JSON parse.
    if (has_header(c.req, "Inference-Header-Content-Length"))
      throw ServingError(Code::kInvalidArgument,
                         "Inference-Header-Content-Length asks for the binary tensor data extension, which kiln does "
                         "not support; send the tensors as JSON \"data\" arrays");
    KServeInferBody body;
    if (!decode_kserve_infer_fast(text, &body)) body = decode_kserve_infer(parse_request_json(text, o_.max_json_depth));
    TensorMap inputs;
    for (auto& in : body.inputs) {
      const std::string& name = in.name;
      at::ScalarType dt;
      const std::string& datatype = in.datatype;
      if (datatype == "BYTES")
        dt = kStringDType;
      else if (!kserve_to_scalar_type(datatype, &dt))
        throw ServingError(Code::kInvalidArgument,
                           "unsupported datatype \"" + datatype + "\" for input \"" + name + "\"");
      kserve_v2::check_input(h->signatures(), name, dt);
      int64_t n = 1;
      for (auto d : in.shape) n *= d;
      const std::string where = "input \"" + name + "\"";
      if (is_string_dtype(dt)) {
        // BYTES data: the strings, row-major (flat, or nested as the shape).
        if (in.has_numbers)
          throw ServingError(Code::kInvalidArgument, where + " expects dtype string. Received: numbers");
        std::vector<std::string> values = json_to_strings(in.data, where, /*b64=*/false).values;
        if ((int64_t)values.size() != n)
          throw ServingError(Code::kInvalidArgument, where + ": shape " + Json(in.shape).dump() + " holds " +
                                                         std::to_string(n) + " values; data has " +
                                                         std::to_string(values.size()));
        inputs[name] = strings::encode(values, in.shape);
        continue;
      }
      at::Tensor flat = in.has_numbers ? checked_numbers_to_tensor(in.numbers, {(int64_t)in.numbers.size()}, dt, where)
                                       : json_to_tensor(in.data, dt, where).reshape({-1});
      if (flat.numel() != n)
        throw ServingError(Code::kInvalidArgument, where + ": shape " + Json(in.shape).dump() + " holds " +
                                                       std::to_string(n) + " values; data has " +
                                                       std::to_string(flat.numel()));
      inputs[name] = flat.reshape(in.shape);
    }
    t.parse_us = micros(t0);
    predict_then(c.conn, h, kDefaultSignature, std::move(inputs), deadline, spec.name, "kserve_rest", "infer",
                 t.parse_us,
                 [requested = std::move(body.outputs), model = h->model_name, version, id = body.id,
                  strings = string_tensor_names(h->signatures(), kDefaultSignature).outputs](TensorMap& out) {
                   Json outs = Json::array();
                   for (auto& name : kserve_v2::output_names(out, requested)) {
                     const at::Tensor& v = out.at(name);
                     const bool is_string = strings.count(name) > 0;
                     Json shape = Json::array();
                     for (auto d : is_string ? strings::logical_shape(v) : v.sizes().vec()) shape.push_back(d);
                     outs.push_back(
                         Json{{"name", name},
                              {"datatype", is_string ? "BYTES" : kserve_datatype(v.scalar_type())},
                              {"shape", shape},
                              {"data", is_string ? Json(strings::decode(v.cpu())) : tensor_to_json(v.reshape({-1}))}});
                   }
                   Json r{{"model_name", model}, {"model_version", std::to_string(version)}, {"outputs", outs}};
                   if (!id.is_null()) r["id"] = id;
                   return json_reply(200, r);
                 });
    return std::nullopt;
  } catch (...) {
    Status st = status_of_current_exception();
    core_.record_request(spec.name, version, "kserve_rest", "infer", st, t);
    return error_reply(st);
  }
}

void RestEngine::routes() {
  using V = http::verb;
  const std::string m = kModel, sel = kSel, v1 = "/v1/models/", v2 = "/v2/models/";
  // --- KServe v2 health: answered without a token (Kubernetes probes and
  // load balancers call them without credentials; they reveal only up/ready).
  add(
      V::get, "/v2/health/live",
      [](Call&) {
        return json_reply(200, Json{{"live", true}});
      },
      true);
  add(
      V::get, "/v2/health/ready",
      [this](Call&) {
        bool r = core_.ready();
        return json_reply(r ? 200 : 400, Json{{"ready", r}});
      },
      true);
  add(V::get, "/v2", [](Call&) {
    return json_reply(
        200,
        Json{{"name", kserve_v2::kServerName}, {"version", kserve_v2::kServerVersion}, {"extensions", Json::array()}});
  });
  // --- metrics ---
  auto metrics = [this](Call&) {
    return std::optional<Reply>(
        Reply{200, core_.metrics().expose(), "text/plain; version=0.0.4; charset=utf-8", false});
  };
  add(V::get, "/monitoring/prometheus/metrics", metrics);
  add(V::get, "/metrics", metrics);
  // --- TF Serving REST v1 ---
  add_re(V::get, v1, v1 + m + sel,
         [this](Call& c) { return json_reply(200, tfs_v1::status_json(core_.model_status(spec_from(c, true)))); });
  add_re(V::get, v1, v1 + m + sel + "/metadata",
         [this](Call& c) { return json_reply(200, tfs_v1::metadata_json(*core_.get(spec_from(c, true)))); });
  add_re(V::post, v1, v1 + m + sel + ":(predict|classify|regress)", [this](Call& c) { return tfs_predict(c); });
  // Admin routes: always routed, so a call while they are off gets a 403
  // naming the flag; their own token (check_admin) instead of the bearer one.
  add_re(
      V::post, v1, v1 + m + ":load",
      [this](Call& c) {
        admin(c.req);
        std::string name = c.match(1);
        Json body = c.req.body().empty() ? Json::object() : parse_request_json(c.req.body(), o_.max_json_depth);
        body["name"] = name;
        ModelServerConfig cfg = parse_model_config_json(Json{{"model_config_list", Json::array({body})}});
        core_.load_model(cfg.models[0]);
        return json_reply(200, Json{{"status", "loading"}, {"model", name}});
      },
      true);
  add_re(
      V::post, v1, v1 + m + ":unload",
      [this](Call& c) {
        admin(c.req);
        std::string name = c.match(1);
        core_.unload_model(name);
        return json_reply(200, Json{{"status", "unloading"}, {"model", name}});
      },
      true);
  add(
      V::post, "/v1/config:reload",
      [this](Call& c) {
        admin(c.req);
        if (json_depth(c.req.body(), o_.max_json_depth) > o_.max_json_depth)
          throw ServingError(Code::kInvalidArgument, "config nesting too deep");
        core_.reload_config(parse_model_config(c.req.body()));
        return json_reply(200, core_.config().to_json());
      },
      true);
  // --- KServe v2 models ---
  const std::string vsel = "(?:/versions/([0-9]+))?";
  add_re(V::get, v2, v2 + m + vsel, [this](Call& c) {
    return json_reply(200, kserve_v2::to_json(kserve_v2::model_metadata(core_, spec_from(c, false))));
  });
  add_re(V::get, v2, v2 + m + vsel + "/ready", [this](Call& c) {
    ModelSpec spec = spec_from(c, false);
    core_.model_status(spec);  // NOT_FOUND for an unknown model/version
    bool r = core_.is_ready(spec);
    return json_reply(r ? 200 : 400, Json{{"name", spec.name}, {"ready", r}});
  });
  add_re(V::post, v2, v2 + m + vsel + "/infer", [this](Call& c) { return kserve_infer(c); });
}

static tcp::endpoint resolve_endpoint(const std::string& host, int port) {
  beast::error_code ec;
  auto addr = asio::ip::make_address(host, ec);
  if (!ec) return {addr, static_cast<unsigned short>(port)};
  asio::io_context ctx;
  tcp::resolver resolver(ctx);
  auto results = resolver.resolve(host, std::to_string(port), ec);
  if (ec || results.empty()) throw IOError("REST server: cannot resolve --rest_api_bind " + host + ": " + ec.message());
  return results.begin()->endpoint();
}

int RestEngine::start() {
  if (port_ >= 0) return port_;
  o_.validate();
  // A client that disconnects while its answer is written must not kill the
  // server: OpenSSL writes with write(), and on a reset connection that
  // raises SIGPIPE, whose default ends the process. Ignored, the write
  // returns EPIPE and only that connection ends.
  std::signal(SIGPIPE, SIG_IGN);
  const size_t n = static_cast<size_t>(std::max(1, o_.num_threads));
  workers_.clear();
  for (size_t i = 0; i < n; ++i) workers_.push_back(std::make_unique<Worker>());
  tcp::endpoint ep = resolve_endpoint(o_.host, o_.port);
  acceptor_ = std::make_unique<tcp::acceptor>(workers_[0]->ctx);
  backoff_ = std::make_unique<asio::steady_timer>(workers_[0]->ctx);
  // SO_REUSEADDR only, never SO_REUSEPORT: a second server on the same port
  // must fail to bind instead of silently sharing its traffic. A backlog of
  // SOMAXCONN: a burst of new connections must not overflow the accept queue
  // (with cpp-httplib's backlog of 5, some were reset).
  beast::error_code ec;
  acceptor_->open(ep.protocol(), ec);
  if (!ec) acceptor_->set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_->bind(ep, ec);
  if (!ec) acceptor_->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    acceptor_.reset();
    backoff_.reset();
    workers_.clear();
    throw IOError("REST server: cannot bind " + o_.host + ":" + std::to_string(o_.port) + " (" + ec.message() +
                  "; in use or not permitted); choose another --rest_api_port");
  }
  port_ = acceptor_->local_endpoint().port();
  draining_ = false;
  gate_ = std::make_shared<Gate>();
  next_ = 0;
  accept();
  for (auto& w : workers_)
    w->thread = std::thread([w = w.get()] {
      for (;;) {
        try {
          w->ctx.run();
          return;
        } catch (const std::exception& e) {
          spdlog::error("serving: REST I/O thread: {}", e.what());
        }
      }
    });
  spdlog::info("serving: REST API on {}://{}:{} ({} I/O threads){}", o_.tls.enabled() ? "https" : "http", o_.host,
               port_, n, o_.tls.enabled() && o_.tls.client_verify ? " (client certificates required)" : "");
  return port_;
}

void RestEngine::accept() {
  Worker& w = *workers_[next_];
  next_ = (next_ + 1) % workers_.size();
  acceptor_->async_accept(w.ctx, [this, &w](beast::error_code ec, Socket s) {
    if (ec == asio::error::operation_aborted || !acceptor_->is_open()) return;  // stop()
    if (ec) {
      // Out of file descriptors and the like: try again shortly rather than spin.
      spdlog::warn("serving: REST accept failed: {}", ec.message());
      backoff_->expires_after(std::chrono::milliseconds(100));
      backoff_->async_wait([this](beast::error_code e) {
        if (!e && acceptor_->is_open()) accept();
      });
      return;
    }
    beast::error_code ignored;
    s.set_option(tcp::no_delay(true), ignored);  // answers are one write; never wait for an ACK
    asio::post(w.ctx, [this, &w, s = std::move(s)]() mutable { open_connection(w, std::move(s)); });
    accept();
  });
}

void RestEngine::open_connection(Worker& w, Socket s) {
  if (draining()) return;  // stop() began: the socket closes here
  auto add = [&](auto conn) {
    w.conns.push_front(conn);
    conn->self = w.conns.begin();
    open_.fetch_add(1);
    conn->start();
  };
  if (ssl_)
    add(std::make_shared<Conn<beast::ssl_stream<TcpStream>>>(*this, w, gate_, std::move(s), *ssl_));
  else
    add(std::make_shared<Conn<TcpStream>>(*this, w, gate_, std::move(s)));
}

void RestEngine::stop() {
  if (port_ < 0) return;
  draining_ = true;
  // Stop accepting (on the acceptor's thread), then close the connections
  // that wait for a request; the others close after their answer.
  std::promise<void> closed;
  asio::post(workers_[0]->ctx, [&] {
    beast::error_code ignored;
    acceptor_->close(ignored);
    backoff_->cancel();
    closed.set_value();
  });
  closed.get_future().wait();
  for (auto& w : workers_)
    asio::post(w->ctx, [w = w.get()] {
      auto all = w->conns;  // drain() may remove itself from the list
      for (auto& c : all) c->drain();
    });
  auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(std::max(0.0, o_.drain_seconds)));
  while (open_.load() > 0 && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  if (open_.load() > 0)
    spdlog::warn("serving: REST stop: {} connection(s) still busy after {} s; closing them", open_.load(),
                 o_.drain_seconds);
  {
    // From here an answer from a batch thread is dropped, never posted.
    std::lock_guard<std::mutex> l(gate_->mu);
    gate_->open = false;
  }
  for (auto& w : workers_) {
    w->guard.reset();
    w->ctx.stop();
  }
  for (auto& w : workers_)
    if (w->thread.joinable()) w->thread.join();
  backoff_.reset();
  acceptor_.reset();
  // Each worker drops its connections, then its io_context with the
  // handlers still queued (and the connections they hold).
  workers_.clear();
  open_ = 0;
  port_ = -1;
}

struct RestServer::Impl {
  RestEngine engine;
  Impl(ServerCore& core, FrontendOptions o) : engine(core, std::move(o)) {}
};

RestServer::RestServer(ServerCore& core, FrontendOptions options)
    : impl_(std::make_unique<Impl>(core, std::move(options))) {}

RestServer::~RestServer() { stop(); }

int RestServer::start() { return impl_->engine.start(); }

void RestServer::stop() { impl_->engine.stop(); }

}  // namespace kiln::serving
