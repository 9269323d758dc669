// The REST front end (Boost.Beast on Asio): TF Serving's REST API v1, KServe
// v2 (Open Inference Protocol) and Prometheus metrics over one port. Routes,
// formats and error codes: docs/SERVING.md. This is the transport:
// connections, routing and the JSON bodies; what each call means is
// kiln/serving/api/tfs_v1.h and kserve_v2.h, shared with the gRPC front end.
//
//   RestServer rest(core, {.host = "127.0.0.1", .port = 0});
//   int port = rest.start();
//
// Event-driven: options.num_threads I/O threads, one listening socket whose
// connections are dealt round robin to them; a connection stays on its
// thread (keep-alive, pipelined requests answered in order). Predict,
// classify, regress and infer are parsed on the I/O thread and handed to
// ServerCore::predict_async; the answer is written back from `done`.
// Every error answers {"error": "..."} with http_status(code). Bodies are
// size-limited (413 from Content-Length before the body is read; chunked
// bodies counted as they arrive) and their JSON nesting depth is checked
// before parsing; the body is JSON whatever its Content-Type (as TF Serving).
// start()/stop() are not meant to race each other. stop() stops accepting,
// closes idle connections, lets requests in flight finish
// (options.drain_seconds), then closes the rest and joins the I/O threads; an answer that arrives
// later from a batch thread is dropped. start() sets SIGPIPE to ignored for
// the process: with HTTPS, a client that disconnects while its answer is
// written would otherwise end the server.
#pragma once

#include <memory>
#include <string>

#include "kiln/core/json.h"
#include "kiln/core/json_limits.h"
#include "kiln/serving/core/server_core.h"
#include "kiln/serving/frontend.h"

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
