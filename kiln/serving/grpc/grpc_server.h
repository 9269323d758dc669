// The gRPC front end: TF Serving's tensorflow.serving.PredictionService
// (Predict, Classify, Regress, MultiInference, GetModelMetadata) and ModelService
// (GetModelStatus, HandleReloadConfigRequest), and KServe v2's
// inference.GRPCInferenceService (ServerLive, ServerReady, ModelReady,
// ServerMetadata, ModelMetadata, ModelInfer), all on one port, serving a
// ServerCore (borrowed; it must outlive the server). This is the transport:
// calls, completion queues and the protos; what each RPC means is
// kiln/serving/api/tfs_v1.h and kserve_v2.h, shared with the REST front end.
//
//   GrpcServer server(core, FrontendOptions{.port = 0});
//   int port = server.start();          // bound port (0 picks one)
//   ...
//   server.stop();                      // waits for in-flight RPCs
//
// Threading (docs/SERVING_GRPC.md): gRPC's async API, one completion queue
// per polling thread (FrontendOptions::num_threads; 0 = hardware
// concurrency). Predict/Classify/Regress/MultiInference/ModelInfer parse on the queue's
// thread and hand the request to ServerCore::predict_async; its `done`
// answers the call, so no thread waits for a batch. Cheap RPCs answer on
// the queue's thread; HandleReloadConfigRequest runs on the admin worker.
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
// one thread; RPCs run on the server's polling threads and the core's batch
// threads.
#pragma once

#include <memory>
#include <string>

#include "kiln/serving/frontend.h"

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
  struct Impl;  // the async server; exists between start() and stop()
  ServerCore& core_;
  FrontendOptions options_;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace kiln::serving
