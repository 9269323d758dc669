// Front ends (REST, gRPC) that serve a ServerCore, and the hook through
// which the gRPC front end plugs in without the CLI depending on it:
//
//   // in the gRPC front end's .cc (linked into libkiln):
//   static const bool registered = (register_grpc_frontend(
//       [](ServerCore& core, const FrontendOptions& o) { return std::make_unique<GrpcServer>(core, o); }), true);
//
//   // kiln serve --port N: starts it when one is registered, else says so.
#pragma once

#include <functional>
#include <memory>
#include <string>

namespace kiln::serving {

class ServerCore;

struct FrontendOptions {
  std::string host = "127.0.0.1";    // loopback unless told otherwise
  int port = 0;                      // 0 = ephemeral; start() returns the bound one
  size_t max_body_bytes = 64 << 20;  // larger requests: 413 / RESOURCE_EXHAUSTED
  int max_json_depth = 64;           // deeper JSON: 400 before parsing
  int num_threads = 16;
  std::string bearer_token;          // non-empty: require "Authorization: Bearer <token>"
  bool enable_admin = true;          // REST :load / :unload / :reload_config
};

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

void register_grpc_frontend(FrontendFactory factory);
// nullptr when no gRPC front end is linked.
const FrontendFactory* grpc_frontend_factory();

}  // namespace kiln::serving
