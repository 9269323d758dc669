// The REST front end (cpp-httplib): TF Serving's REST API v1, KServe v2
// (Open Inference Protocol) and Prometheus metrics over one port. Routes,
// formats and error codes: docs/SERVING.md.
//
//   RestServer rest(core, {.host = "127.0.0.1", .port = 0});
//   int port = rest.start();
//
// Every error answers {"error": "..."} with http_status(code). Bodies are
// size-limited and their JSON nesting depth is checked before parsing.
// Thread-safe; stop() waits for the listener thread. start() sets SIGPIPE
// to ignored for the process: with HTTPS, a client that disconnects while
// its answer is written would otherwise end the server.
#pragma once

#include <memory>
#include <string>

#include "kiln/core/json.h"
#include "kiln/core/json_limits.h"
#include "kiln/serving/frontend.h"
#include "kiln/serving/server_core.h"

namespace kiln::serving {

class RestServer : public Frontend {
 public:
  RestServer(ServerCore& core, FrontendOptions options);  // borrows core
  ~RestServer() override;
  int start() override;
  void stop() override;
  std::string name() const override { return "rest"; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// parse_request_json (the request body parser) lives in rest_codec.h.

}  // namespace kiln::serving
