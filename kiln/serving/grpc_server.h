// The gRPC front end: TF Serving's tensorflow.serving.PredictionService
// (Predict, Classify, Regress, GetModelMetadata) and ModelService
// (GetModelStatus, HandleReloadConfigRequest), and KServe v2's
// inference.GRPCInferenceService (ServerLive, ServerReady, ModelReady,
// ServerMetadata, ModelMetadata, ModelInfer), all on one port, serving a
// ServerCore (borrowed; it must outlive the server).
//
//   GrpcServer server(core, FrontendOptions{.port = 0});
//   int port = server.start();          // bound port (0 picks one)
//   ...
//   server.stop();                      // waits for in-flight RPCs
//
// Errors: every RPC classifies what it caught with status_of (status.h),
// the same mapping the REST front end uses, so a request fails with the same
// code on both (INVALID_ARGUMENT for bad tensors, NOT_FOUND for unknown
// models/versions/labels, UNAVAILABLE before a model is ready,
// RESOURCE_EXHAUSTED for a full batch queue, DEADLINE_EXCEEDED past the
// client's deadline). With FrontendOptions::bearer_token set, calls without
// metadata "authorization: Bearer <token>" get UNAUTHENTICATED (except
// ServerLive/ServerReady, the health checks).
// TLS: FrontendOptions::tls (PEM contents; mutual TLS with client_verify);
// otherwise plaintext. The constructor throws ValueError for bad TLS material.
//
// Linking this file registers it through register_grpc_frontend(), which is
// how `kiln serve --port N` finds it. Thread safety: start/stop from
// one thread; RPCs run on gRPC's threads.
#pragma once

#include <memory>
#include <string>

#include "kiln/serving/frontend.h"

namespace grpc {
class Server;
class Service;
}  // namespace grpc

namespace kiln::serving {

class ServerCore;

class GrpcServer : public Frontend {
 public:
  GrpcServer(ServerCore& core, FrontendOptions options);
  ~GrpcServer() override;
  int start() override;  // IOError naming host:port if it cannot bind
  void stop() override;
  std::string name() const override { return "grpc"; }
  int port() const { return port_; }

 private:
  ServerCore& core_;
  FrontendOptions options_;
  std::unique_ptr<grpc::Service> prediction_, model_, inference_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace kiln::serving
