// Front ends (REST, gRPC) that serve a ServerCore, and the hook through
// which the gRPC front end plugs in without the CLI depending on it:
//
//   // in the gRPC front end's .cc (linked into libkiln):
//   static const bool registered = (register_grpc_frontend(
//       [](ServerCore& core, const FrontendOptions& o) { return std::make_unique<GrpcServer>(core, o); }), true);
//
//   // kiln serve --port N: starts it when one is registered, else says so.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "kiln/core/json_limits.h"

namespace kiln::serving {

class ServerCore;

// TLS for one front end. PEM *contents*, not paths (TF Serving's SSLConfig
// holds contents too; the CLI reads the files). Empty cert_pem: plaintext.
// check_tls_options() (tls.h) validates them; start() calls it.
struct TlsOptions {
  std::string cert_pem;        // server certificate, optionally followed by its chain
  std::string key_pem;         // its private key (unencrypted)
  std::string client_ca_pem;   // CA for client certificates (mutual TLS)
  bool client_verify = false;  // require a client certificate signed by client_ca_pem
  bool enabled() const { return !cert_pem.empty(); }
};

struct FrontendOptions {
  std::string host = "127.0.0.1";      // loopback unless told otherwise
  int port = 0;                        // 0 = ephemeral; start() returns the bound one (CLI: "auto")
  size_t max_body_bytes = 64 << 20;    // larger requests: 413 / RESOURCE_EXHAUSTED
  int max_json_depth = kMaxJsonDepth;  // deeper JSON: 400 before parsing (kiln/core/json_limits.h)
  // REST: the I/O threads (Boost.Beast/Asio event loops); each serves many
  // connections, parses requests and writes answers; computing runs on the
  // batch threads (or on the I/O thread when batching is off). gRPC: pollers
  // and workers.
  int num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // REST stop(): how long requests in flight may take to finish before their
  // connections are closed (their answers are then dropped).
  double drain_seconds = 10;
  // Non-empty: every call needs "Authorization: Bearer <token>" (gRPC:
  // metadata "authorization"), except the health checks (REST
  // /v2/health/live|ready, KServe gRPC ServerLive/ServerReady), which
  // orchestrators' probes call without credentials.
  std::string bearer_token;
  TlsOptions tls;
  // Admin calls: REST POST /v1/models/NAME:load, :unload and /v1/config:reload
  // (kiln's), gRPC ModelService/HandleReloadConfigRequest. Off by default
  // (REST 403, gRPC PERMISSION_DENIED, each naming --enable_admin_routes);
  // when on, each needs "Authorization: Bearer <admin_token>" (gRPC metadata
  // "authorization"). check_admin() below decides; validate() refuses
  // enable_admin without a token.
  bool enable_admin = false;
  std::string admin_token;  // empty with enable_admin: bearer_token is the admin token
  // ValueError naming the field: enable_admin with neither token.
  void validate() const;
  const std::string& effective_admin_token() const { return admin_token.empty() ? bearer_token : admin_token; }
};

// May this admin call run? OK, or PERMISSION_DENIED (admin calls off; the
// message names --enable_admin_routes) / UNAUTHENTICATED (wrong or missing
// token). `authorization` is the request's Authorization header (gRPC: the
// "authorization" metadata), "" when absent.
struct AdminCheck {
  bool allowed = false;
  bool unauthenticated = false;  // false with !allowed: admin calls are off
  std::string message;
};
AdminCheck check_admin(const FrontendOptions& options, const std::string& authorization);

class Frontend {
 public:
  virtual ~Frontend() = default;
  // Binds and serves in the background; returns the bound port. Throws
  // IOError if it cannot bind.
  virtual int start() = 0;
  virtual void stop() = 0;
  virtual std::string name() const = 0;  // "rest", "grpc"
};

using FrontendFactory = std::function<std::unique_ptr<Frontend>(ServerCore&, const FrontendOptions&)>;

// True when `authorization` is "Bearer <token>" (scheme case-insensitive, as
// RFC 7235 says). Compares in time independent of where the token differs.
bool bearer_token_matches(const std::string& authorization, const std::string& token);

void register_grpc_frontend(FrontendFactory factory);
// nullptr when no gRPC front end is linked.
const FrontendFactory* grpc_frontend_factory();

}  // namespace kiln::serving
