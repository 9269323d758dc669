#include "kiln/serving/grpc/grpc_server.h"

#include <absl/synchronization/mutex.h>
#include <google/protobuf/arena.h>
#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>
#include <vector>

#include "inference/grpc_predict_v2.grpc.pb.h"
#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/core/string_tensor.h"
#include "kiln/core/thread_pool.h"
#include "kiln/serving/api/kserve_v2.h"
#include "kiln/serving/api/run_inference.h"
#include "kiln/serving/api/tfs_v1.h"
#include "kiln/serving/codec/example_input.h"
#include "kiln/serving/codec/inference.h"
#include "kiln/serving/codec/predict_options.h"
#include "kiln/serving/codec/tensor_proto.h"
#include "kiln/serving/core/server_core.h"
#include "kiln/serving/status.h"
#include "kiln/serving/tls.h"
#include "tensorflow_serving/apis/model_service.grpc.pb.h"
#include "tensorflow_serving/apis/prediction_service.grpc.pb.h"

namespace kiln::serving {
namespace {

namespace tfs = tensorflow::serving;
using SteadyClock = std::chrono::steady_clock;

// Set on the threads that poll a completion queue.
thread_local bool t_polling_thread = false;

// Calls of each inference method (Predict, Classify, Regress,
// MultiInference, ModelInfer) kept waiting per queue. With one, a burst of
// calls was matched one poll at a time: 16 served 5-10% more one-row
// Predicts per CPU second under h2load (docs/PERFORMANCE.md, issue 15).
constexpr int kInferenceCallsWaiting = 16;

int64_t micros_since(SteadyClock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(SteadyClock::now() - t).count();
}

grpc::Status to_grpc(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(static_cast<int>(s.code)), s.message);
}

// The client's deadline on our steady clock (none when it set none).
Deadline deadline_of(const grpc::ServerContext* ctx) {
  auto d = ctx->deadline();
  if (d == std::chrono::system_clock::time_point::max()) return std::nullopt;
  auto left = d - std::chrono::system_clock::now();
  if (left > std::chrono::hours(24 * 365)) return std::nullopt;
  return SteadyClock::now() + std::chrono::duration_cast<SteadyClock::duration>(left);
}

ModelSpec spec_of(const tfs::ModelSpec& s) {
  if (s.name().empty()) throw ServingError(Code::kInvalidArgument, "Missing ModelSpec: set model_spec.name");
  ModelSpec spec;
  spec.name = s.name();
  if (s.has_version()) spec.version = s.version().value();
  if (s.version_choice_case() == tfs::ModelSpec::kVersionLabel) spec.label = s.version_label();
  return spec;
}

void fill_spec(const ServableHandle& h, const std::string& signature, tfs::ModelSpec* out) {
  out->set_name(h.model_name);
  out->mutable_version()->set_value(h.version);
  out->set_signature_name(signature);
}

std::string signature_of(const tfs::ModelSpec& s) { return tfs_v1::signature_or_default(s.signature_name()); }

// With a bearer token configured, checks the call's "authorization"
// metadata (UNAUTHENTICATED otherwise).
void check_token(const FrontendOptions& o, const grpc::ServerContext* ctx) {
  if (o.bearer_token.empty()) return;
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  if (it == md.end())
    throw ServingError(Code::kUnauthenticated, "missing bearer token; send metadata 'authorization: Bearer <token>'");
  if (!bearer_token_matches(std::string(it->second.data(), it->second.size()), o.bearer_token))
    throw ServingError(Code::kUnauthenticated,
                       "wrong bearer token; send the server's token as metadata 'authorization: Bearer <token>'");
}

// Admin RPCs check their own token instead (kiln/serving/frontend.h).
void check_admin_call(const FrontendOptions& o, const grpc::ServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  AdminCheck c = check_admin(o, it == md.end() ? std::string() : std::string(it->second.data(), it->second.size()));
  if (!c.allowed) throw ServingError(c.unauthenticated ? Code::kUnauthenticated : Code::kPermissionDenied, c.message);
}

// Health checks (KServe ServerLive/ServerReady) answer without a token, as
// the REST /v2/health routes do: probes carry no credentials.
enum class Auth { kRequired, kOpen };

tfs::ModelVersionStatus::State tfs_state(VersionState s) {
  tfs::ModelVersionStatus::State state = tfs::ModelVersionStatus::UNKNOWN;
  tfs::ModelVersionStatus::State_Parse(tfs_state_name(s), &state);
  return state;
}

VersionPolicy policy_of(const tfs::FileSystemStoragePathSourceConfig::ServableVersionPolicy& p) {
  VersionPolicy v;
  switch (p.policy_choice_case()) {
    case tfs::FileSystemStoragePathSourceConfig::ServableVersionPolicy::kAll:
      v.kind = VersionPolicy::Kind::kAll;
      break;
    case tfs::FileSystemStoragePathSourceConfig::ServableVersionPolicy::kSpecific:
      v.kind = VersionPolicy::Kind::kSpecific;
      v.versions.assign(p.specific().versions().begin(), p.specific().versions().end());
      break;
    case tfs::FileSystemStoragePathSourceConfig::ServableVersionPolicy::kLatest:
      v.kind = VersionPolicy::Kind::kLatest;
      v.num_versions = p.latest().num_versions() == 0 ? 1 : p.latest().num_versions();
      break;
    default:
      break;  // TF Serving's default: the latest version
  }
  return v;
}

// --- call data ------------------------------------------------------------------
class AsyncServer;

// A completion-queue tag: what proceed() does when the queue returns it.
class Tag {
 public:
  virtual ~Tag() = default;
  virtual void proceed(bool ok) = 0;
};

template <class Req, class Resp>
class Call;

// One RPC method: how to ask gRPC for its next call, and how to answer one.
class Method {
 public:
  explicit Method(int waiting) : waiting(waiting) {}
  virtual ~Method() = default;
  // Leaves one call of this method waiting on `cq` (none once stopping).
  virtual void request_on(grpc::ServerCompletionQueue* cq) const = 0;
  // Calls kept waiting per queue (each answered call asks for the next).
  // A call that arrives while none waits is parked by gRPC and matched
  // later, through a slower path: the inference methods, which get bursts
  // (a batch's answers bring back its clients together), keep several.
  const int waiting;
};

template <class Req, class Resp>
class MethodOf final : public Method {
 public:
  using Request = std::function<void(grpc::ServerContext*, Req*, grpc::ServerAsyncResponseWriter<Resp>*,
                                     grpc::ServerCompletionQueue*, void*)>;
  using Handler = std::function<void(Call<Req, Resp>&)>;
  MethodOf(AsyncServer& server, const char* protocol, const char* api, Auth auth, int waiting, Request request,
           Handler handle)
      : Method(waiting),
        server(server),
        protocol(protocol),
        api(api),
        auth(auth),
        request(std::move(request)),
        handle(std::move(handle)) {}
  void request_on(grpc::ServerCompletionQueue* cq) const override;

  AsyncServer& server;
  const char* protocol;  // metrics labels
  const char* api;
  Auth auth;
  Request request;
  Handler handle;
};

// The call data of one RPC, and its tag. Lifecycle:
//   kWaiting --(a call arrives)--> kRunning --finish()--> kFinishing --(tag back)--> deleted
//   kWaiting --(tag back not ok: the server is shutting down)--> deleted
//   kRunning --finish_on_queue()--> kHanding --(alarm tag back)--> finish() on a polling thread
// While kRunning the call belongs to whoever runs it: the queue's thread,
// then (Predict and friends) the core's batch thread in predict_async's
// `done`, or the admin worker (reloads). finish() hands it back to the queue; nobody
// may touch it after that.
template <class Req, class Resp>
class Call final : public Tag {
 public:
  Call(const MethodOf<Req, Resp>& method, grpc::ServerCompletionQueue* cq);
  ~Call() override;
  void proceed(bool ok) override;
  // Counts the request into the metrics (once `model` is known) and sends
  // `status`, with `response` when it is OK. Exactly once; the last touch.
  void finish(const Status& status);
  // finish(), but from a polling thread of the call's queue: the batch
  // thread that computed the answer hands the send (HTTP/2 framing, the
  // write syscall) back through an alarm that is already due, instead of
  // doing it itself. Measured under h2load, one-row Predict with batching:
  // 18-22% more requests/s and 20% less server CPU per request, as the
  // batch thread goes back to computing and the pollers send the answers
  // with the reads they do anyway (docs/PERFORMANCE.md, issue 15).
  void finish_on_queue(const Status& status);

  // The request and the response live in the call's arena: parsing a
  // PredictRequest (a map of TensorProtos, 784 floats for one image) and
  // filling the response then cost a few block allocations instead of one
  // malloc per message, string and repeated field. Declared first: it
  // outlives both.
  google::protobuf::Arena arena;
  grpc::ServerContext ctx;
  Req& request;
  Resp& response;
  RequestTiming timing;
  std::string model;  // metrics: set once known
  int64_t version = 0;

 private:
  enum class State { kWaiting, kRunning, kHanding };  // kFinishing: any tag after kRunning
  const MethodOf<Req, Resp>& method_;
  grpc::ServerCompletionQueue* cq_;
  grpc::ServerAsyncResponseWriter<Resp> writer_{&ctx};
  State state_ = State::kWaiting;         // the queue's thread; finish_on_queue() before its alarm
  std::optional<grpc::Alarm> hand_back_;  // finish_on_queue()
  Status handed_status_;
};

using PredictCall = Call<tfs::PredictRequest, tfs::PredictResponse>;
using ClassifyCall = Call<tfs::ClassificationRequest, tfs::ClassificationResponse>;
using RegressCall = Call<tfs::RegressionRequest, tfs::RegressionResponse>;
using MetadataCall = Call<tfs::GetModelMetadataRequest, tfs::GetModelMetadataResponse>;
using StatusCall = Call<tfs::GetModelStatusRequest, tfs::GetModelStatusResponse>;
using ReloadCall = Call<tfs::ReloadConfigRequest, tfs::ReloadConfigResponse>;
using LiveCall = Call<inference::ServerLiveRequest, inference::ServerLiveResponse>;
using ReadyCall = Call<inference::ServerReadyRequest, inference::ServerReadyResponse>;
using ModelReadyCall = Call<inference::ModelReadyRequest, inference::ModelReadyResponse>;
using ServerMetadataCall = Call<inference::ServerMetadataRequest, inference::ServerMetadataResponse>;
using ModelMetadataCall = Call<inference::ModelMetadataRequest, inference::ModelMetadataResponse>;
using InferCall = Call<inference::ModelInferRequest, inference::ModelInferResponse>;
using MultiInferenceCall = Call<tfs::MultiInferenceRequest, tfs::MultiInferenceResponse>;

// What Classify/Regress decode from their examples.
struct ExamplesInput {
  ServableHandlePtr handle;
  InferenceSignature signature;
  TensorMap inputs;
};

// std::type_identity_t without C++20 (the sanitizer build is C++17): keeps
// the handler argument out of template argument deduction.
template <class T>
struct NoDeduceOf {
  using type = T;
};
template <class T>
using NoDeduce = typename NoDeduceOf<T>::type;

// --- the server ---------------------------------------------------------------------
class AsyncServer {
 public:
  AsyncServer(ServerCore& core, const FrontendOptions& options) : core_(core), options_(options) {}
  ~AsyncServer() { stop(); }
  int start();  // the bound port
  void stop();

  ServerCore& core() { return core_; }
  const FrontendOptions& options() const { return options_; }
  bool stopping() const { return stopping_.load(); }
  void call_created();
  void call_deleted();

 private:
  // One line per RPC: every method of an AsyncService must be requested, or
  // its calls hang. `request` is the AsyncService's RequestXxx.
  template <class Service, class Base, class Req, class Resp>
  void add(Service& service,
           void (Base::*request)(grpc::ServerContext*, Req*, grpc::ServerAsyncResponseWriter<Resp>*,
                                 grpc::CompletionQueue*, grpc::ServerCompletionQueue*, void*),
           const char* protocol, const char* api, NoDeduce<void (AsyncServer::*)(Call<Req, Resp>&)> handle,
           Auth auth = Auth::kRequired, int waiting = 1) {
    methods_.push_back(std::make_unique<MethodOf<Req, Resp>>(
        *this, protocol, api, auth, waiting,
        [&service, request](grpc::ServerContext* ctx, Req* req, grpc::ServerAsyncResponseWriter<Resp>* w,
                            grpc::ServerCompletionQueue* cq,
                            void* tag) { (service.*request)(ctx, req, w, cq, cq, tag); },
        [this, handle](Call<Req, Resp>& c) { (this->*handle)(c); }));
  }
  void add_methods();
  void poll(grpc::ServerCompletionQueue* cq);

  // Hands the parsed request to the core; `encode(outputs)` fills the
  // response on the thread that runs `done` (it may throw), then the call
  // finishes there.
  template <class C, class Encode>
  void infer(C& c, ServableHandlePtr handle, std::string signature, TensorMap inputs, Encode encode);
  ExamplesInput examples(const tfs::ModelSpec& spec, const tfs::Input& input, InferenceApi api, RequestTiming& t,
                         std::string& model, int64_t& version);
  // Decodes `input` for one signature of an already leased version.
  TensorMap example_tensors(const InferenceSignature& signature, const tfs::Input& input);

  void predict(PredictCall& c);
  void classify(ClassifyCall& c);
  void regress(RegressCall& c);
  void multi_inference(MultiInferenceCall& c);
  void metadata(MetadataCall& c);
  void model_status(StatusCall& c);
  void reload_config(ReloadCall& c);
  void live(LiveCall& c);
  void ready(ReadyCall& c);
  void model_ready(ModelReadyCall& c);
  void server_metadata(ServerMetadataCall& c);
  void model_metadata(ModelMetadataCall& c);
  void model_infer(InferCall& c);

  ServerCore& core_;
  const FrontendOptions& options_;
  tfs::PredictionService::AsyncService prediction_;
  tfs::ModelService::AsyncService model_;
  inference::GRPCInferenceService::AsyncService inference_;
  std::vector<std::unique_ptr<Method>> methods_;
  std::unique_ptr<grpc::Server> server_;
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> cqs_;
  std::vector<std::thread> pollers_;
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::condition_variable all_deleted_;
  int64_t live_calls_ = 0;  // guarded by mu_: Calls not yet deleted
  // Reloads, one at a time (the core applies configs one at a time anyway):
  // one worker for the server's life, so a long-lived server does not keep a
  // finished thread per reload. Made by start(), shut down by stop().
  std::unique_ptr<ThreadPool> admin_;
};

template <class Req, class Resp>
void MethodOf<Req, Resp>::request_on(grpc::ServerCompletionQueue* cq) const {
  if (!server.stopping()) new Call<Req, Resp>(*this, cq);  // deletes itself
}

template <class Req, class Resp>
Call<Req, Resp>::Call(const MethodOf<Req, Resp>& method, grpc::ServerCompletionQueue* cq)
    : request(*google::protobuf::Arena::CreateMessage<Req>(&arena)),
      response(*google::protobuf::Arena::CreateMessage<Resp>(&arena)),
      method_(method),
      cq_(cq) {
  method_.server.call_created();
  method_.request(&ctx, &request, &writer_, cq_, this);
}

template <class Req, class Resp>
Call<Req, Resp>::~Call() {
  method_.server.call_deleted();
}

template <class Req, class Resp>
void Call<Req, Resp>::proceed(bool ok) {
  if (state_ == State::kHanding) {
    state_ = State::kRunning;
    finish(handed_status_);
    return;
  }
  if (state_ == State::kRunning || !ok) {  // the reply is out (or the call was cancelled); or no call came
    delete this;
    return;
  }
  state_ = State::kRunning;
  method_.request_on(cq_);  // the next call of this method
  if (method_.auth == Auth::kRequired) {
    try {
      check_token(method_.server.options(), &ctx);
    } catch (...) {
      finish(status_of_current_exception());
      return;
    }
  }
  method_.handle(*this);
}

template <class Req, class Resp>
void Call<Req, Resp>::finish(const Status& status) {
  if (!model.empty())
    method_.server.core().record_request(model, version, method_.protocol, method_.api, status, timing);
  writer_.Finish(response, to_grpc(status), this);
}

template <class Req, class Resp>
void Call<Req, Resp>::finish_on_queue(const Status& status) {
  handed_status_ = status;
  state_ = State::kHanding;
  hand_back_.emplace();
  hand_back_->Set(cq_, gpr_inf_past(GPR_CLOCK_MONOTONIC), this);
}

// Runs `body` on the calling thread and finishes the call with what it threw (OK if nothing).
template <class C, class F>
void answer(C& c, F body) {
  Status status;
  try {
    body();
  } catch (...) {
    status = status_of_current_exception();
  }
  c.finish(status);
}

// Runs `parse`; false (and the call finished with the error) if it threw.
template <class C, class F>
bool parsed(C& c, F parse) {
  try {
    parse();
    return true;
  } catch (...) {
    c.finish(status_of_current_exception());
    return false;
  }
}

void AsyncServer::call_created() {
  std::lock_guard<std::mutex> l(mu_);
  ++live_calls_;
}

void AsyncServer::call_deleted() {
  std::lock_guard<std::mutex> l(mu_);
  if (--live_calls_ == 0) all_deleted_.notify_all();
}

void AsyncServer::add_methods() {
  using PS = tfs::PredictionService::AsyncService;
  using MS = tfs::ModelService::AsyncService;
  using IS = inference::GRPCInferenceService::AsyncService;
  constexpr auto kAuth = Auth::kRequired;
  add(prediction_, &PS::RequestPredict, "grpc", "predict", &AsyncServer::predict, kAuth, kInferenceCallsWaiting);
  add(prediction_, &PS::RequestClassify, "grpc", "classify", &AsyncServer::classify, kAuth, kInferenceCallsWaiting);
  add(prediction_, &PS::RequestRegress, "grpc", "regress", &AsyncServer::regress, kAuth, kInferenceCallsWaiting);
  add(prediction_, &PS::RequestMultiInference, "grpc", "multi_inference", &AsyncServer::multi_inference, kAuth,
      kInferenceCallsWaiting);
  add(prediction_, &PS::RequestGetModelMetadata, "grpc", "metadata", &AsyncServer::metadata);
  add(model_, &MS::RequestGetModelStatus, "grpc", "status", &AsyncServer::model_status);
  // Admin: checks the admin token itself (check_admin_call).
  add(model_, &MS::RequestHandleReloadConfigRequest, "grpc", "reload_config", &AsyncServer::reload_config, Auth::kOpen);
  add(inference_, &IS::RequestServerLive, "kserve_grpc", "live", &AsyncServer::live, Auth::kOpen);
  add(inference_, &IS::RequestServerReady, "kserve_grpc", "ready", &AsyncServer::ready, Auth::kOpen);
  add(inference_, &IS::RequestModelReady, "kserve_grpc", "model_ready", &AsyncServer::model_ready);
  add(inference_, &IS::RequestServerMetadata, "kserve_grpc", "server_metadata", &AsyncServer::server_metadata);
  add(inference_, &IS::RequestModelMetadata, "kserve_grpc", "metadata", &AsyncServer::model_metadata);
  add(inference_, &IS::RequestModelInfer, "kserve_grpc", "infer", &AsyncServer::model_infer, kAuth,
      kInferenceCallsWaiting);
}

int AsyncServer::start() {
  add_methods();
  std::shared_ptr<grpc::ServerCredentials> creds;
  if (options_.tls.enabled()) {
    // As TF Serving: custom_ca + client_verify = mutual TLS; otherwise no
    // client certificate is asked for.
    grpc::SslServerCredentialsOptions ssl(options_.tls.client_verify
                                              ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                              : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    ssl.pem_root_certs = options_.tls.client_ca_pem;
    ssl.pem_key_cert_pairs.push_back({options_.tls.key_pem, options_.tls.cert_pem});
    creds = grpc::SslServerCredentials(ssl);
  } else {
    creds = grpc::InsecureServerCredentials();
  }
  const std::string host = options_.host.find(':') != std::string::npos ? "[" + options_.host + "]" : options_.host;
  const std::string address = host + ":" + std::to_string(options_.port);
  // Debian's Abseil is built without NDEBUG, so each absl::Mutex lock in
  // gRPC runs Abseil's deadlock detector (a lock-order graph, with stack
  // traces): 4.5% of the server's CPU under h2load. A debugging aid; off
  // for the process, as it already is where Abseil is built with NDEBUG.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  grpc::ServerBuilder b;
  int selected = 0;
  b.AddListeningPort(address, creds, &selected);
  b.SetMaxReceiveMessageSize(static_cast<int>(std::min<size_t>(options_.max_body_bytes, INT32_MAX)));
  b.SetMaxSendMessageSize(INT32_MAX);
  b.RegisterService(&prediction_);
  b.RegisterService(&model_);
  b.RegisterService(&inference_);
  const int threads =
      options_.num_threads > 0 ? options_.num_threads : std::max(1u, std::thread::hardware_concurrency());
  for (int i = 0; i < threads; ++i) cqs_.push_back(b.AddCompletionQueue());
  server_ = b.BuildAndStart();
  if (!server_ || selected == 0) {
    server_.reset();
    for (auto& cq : cqs_) {
      cq->Shutdown();
      void* tag;
      bool ok;
      while (cq->Next(&tag, &ok)) {
      }
    }
    cqs_.clear();
    throw IOError("gRPC: cannot listen on " + address + " (in use, or not a local address)");
  }
  admin_ = std::make_unique<ThreadPool>(ThreadPoolOptions{});
  for (auto& cq : cqs_) {
    for (auto& m : methods_)
      for (int k = 0; k < m->waiting; ++k) m->request_on(cq.get());
    pollers_.emplace_back([this, q = cq.get()] { poll(q); });
  }
  return selected;
}

void AsyncServer::poll(grpc::ServerCompletionQueue* cq) {
  t_polling_thread = true;
  void* tag;
  bool ok;
  while (cq->Next(&tag, &ok)) static_cast<Tag*>(tag)->proceed(ok);
}

void AsyncServer::stop() {
  if (!server_) return;
  // 1. No new calls: requests still waiting come back not ok; calls in
  //    flight get 5 s to finish, then gRPC cancels them. The queues keep
  //    polling meanwhile, so replies (and cancellations) still go out.
  stopping_ = true;
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  // 2. Every call still alive ends by itself: its predict_async `done` or
  //    the admin worker finishes it, the queue returns its tag, it deletes
  //    itself. Wait for that before shutting the queues, which a late
  //    Finish would otherwise hit after they are gone.
  {
    std::unique_lock<std::mutex> l(mu_);
    all_deleted_.wait(l, [&] { return live_calls_ == 0; });
  }
  // Every reload finished its call above, so nothing is queued or running.
  if (admin_) admin_->shutdown(ThreadPool::QueuedWork::kRun);
  admin_.reset();
  // 3. Drain and end the queues, then the pollers.
  for (auto& cq : cqs_) cq->Shutdown();
  for (auto& t : pollers_) t.join();
  pollers_.clear();
  server_->Wait();
  server_.reset();
  cqs_.clear();
}

// --- inference: parse here, answer from predict_async's done --------------------------------
template <class C, class Encode>
void AsyncServer::infer(C& c, ServableHandlePtr handle, std::string signature, TensorMap inputs, Encode encode) {
  api::run_inference(core_, std::move(handle), std::move(signature), std::move(inputs), deadline_of(&c.ctx),
                     c.timing.parse_us, std::move(encode), [&c](const Status& status, const RequestTiming& t) {
                       c.timing = t;
                       // Batching: this is the batch thread, which hands the
                       // send back to the queue and computes the next batch.
                       if (t_polling_thread)
                         c.finish(status);
                       else
                         c.finish_on_queue(status);
                     });
}

// One row per example, one class per column (Classify and MultiInference).
void fill_classifications(const Classifications& cl, tfs::ClassificationResult* result) {
  for (int64_t i = 0; i < cl.examples; ++i) {
    auto* row = result->add_classifications();
    for (int64_t k = 0; k < cl.classes; ++k) {
      auto* cls = row->add_classes();
      cls->set_label(cl.label(i, k));
      cls->set_score(cl.score(i, k));
    }
  }
}

void fill_regressions(const std::vector<float>& values, tfs::RegressionResult* result) {
  for (float v : values) result->add_regressions()->set_value(v);
}

void AsyncServer::predict(PredictCall& c) {
  auto start = SteadyClock::now();
  ServableHandlePtr h;
  std::string sig;
  TensorMap inputs;
  if (!parsed(c, [&] {
        auto spec = spec_of(c.request.model_spec());
        c.model = spec.name;
        check_predict_request_options(c.request);
        h = core_.get(spec);
        c.version = h->version;
        sig = signature_of(c.request.model_spec());
        for (auto& [name, proto] : c.request.inputs()) {
          const std::string what = "inputs['" + name + "']";
          inputs[name] =
              signature_input(from_tensor_proto(proto, what), signature_input_spec(h->signatures(), sig, name), what);
        }
      }))
    return;
  c.timing.parse_us = micros_since(start);
  infer(c, h, sig, std::move(inputs), [&c, h, sig](TensorMap& out) {
    const StringTensorNames strings = string_tensor_names(h->signatures(), sig);
    for (auto& n : tfs_v1::predict_output_names(out, c.request.output_filter()))
      output_to_tensor_proto(out.at(n), strings.outputs.count(n) > 0, &(*c.response.mutable_outputs())[n]);
    fill_spec(*h, sig, c.response.mutable_model_spec());
  });
}

// Classify/Regress: Examples -> the signature's inputs (its first output answers).
ExamplesInput AsyncServer::examples(const tfs::ModelSpec& ms, const tfs::Input& input, InferenceApi api,
                                    RequestTiming& t, std::string& model, int64_t& version) {
  auto start = SteadyClock::now();
  auto spec = spec_of(ms);
  model = spec.name;
  ExamplesInput e;
  e.handle = core_.get(spec);
  version = e.handle->version;
  e.signature = inference_signature(e.handle->signatures(), signature_of(ms), api);
  e.inputs = example_tensors(e.signature, input);
  t.parse_us = micros_since(start);
  return e;
}

TensorMap AsyncServer::example_tensors(const InferenceSignature& signature, const tfs::Input& input) {
  std::vector<ExampleInputSpec> specs;
  for (auto& in : signature.inputs) specs.push_back({in.name, dtype_from_string(in.dtype), in.shape});
  auto tensors = examples_to_tensors(input, specs);
  TensorMap inputs;
  for (size_t i = 0; i < specs.size(); ++i) inputs[specs[i].name] = tensors[i];
  return inputs;
}

// MultiInference (tfs_v1.h has TF Serving's rules): the shared input is
// decoded per task's signature; the call finishes when the last task is
// back, with one result per task in task order.
void AsyncServer::multi_inference(MultiInferenceCall& c) {
  auto start = SteadyClock::now();
  ServableHandlePtr h;
  std::vector<InferenceSignature> signatures;
  std::vector<TensorMap> inputs;
  if (!parsed(c, [&] {
        std::vector<tfs_v1::MultiInferenceTask> tasks;
        for (const auto& t : c.request.tasks())
          tasks.push_back({spec_of(t.model_spec()), t.model_spec().signature_name(), t.method_name()});
        if (!tasks.empty()) c.model = tasks[0].spec.name;
        h = core_.get(tfs_v1::check_multi_inference(tasks));
        c.version = h->version;
        signatures = tfs_v1::multi_inference_signatures(*h, tasks);
        for (auto& sig : signatures) inputs.push_back(example_tensors(sig, c.request.input()));
      }))
    return;
  c.timing.parse_us = micros_since(start);
  tfs_v1::run_multi_inference(
      core_, h, signatures, std::move(inputs), deadline_of(&c.ctx),
      [&c, h, signatures](std::exception_ptr error, std::vector<TensorMap>& outputs, const RequestTiming& t) {
        c.timing.queue_us = t.queue_us;
        c.timing.compute_us = t.compute_us;
        c.timing.batch_size = t.batch_size;
        answer(c, [&] {
          if (error) std::rethrow_exception(error);
          auto start = SteadyClock::now();
          for (size_t k = 0; k < signatures.size(); ++k) {
            const InferenceSignature& sig = signatures[k];
            auto* r = c.response.add_results();
            fill_spec(*h, sig.name, r->mutable_model_spec());
            if (sig.api == InferenceApi::kClassify)
              fill_classifications(classifications_of(sig, outputs[k]), r->mutable_classification_result());
            else
              fill_regressions(regressions_of(sig, outputs[k]), r->mutable_regression_result());
          }
          c.timing.serialize_us = micros_since(start);
        });
      });
}

void AsyncServer::classify(ClassifyCall& c) {
  ExamplesInput e;
  if (!parsed(c, [&] {
        e = examples(c.request.model_spec(), c.request.input(), InferenceApi::kClassify, c.timing, c.model, c.version);
      }))
    return;
  infer(c, e.handle, e.signature.name, std::move(e.inputs), [&c, h = e.handle, sig = e.signature](TensorMap& out) {
    fill_spec(*h, sig.name, c.response.mutable_model_spec());
    fill_classifications(classifications_of(sig, out), c.response.mutable_result());
  });
}

void AsyncServer::regress(RegressCall& c) {
  ExamplesInput e;
  if (!parsed(c, [&] {
        e = examples(c.request.model_spec(), c.request.input(), InferenceApi::kRegress, c.timing, c.model, c.version);
      }))
    return;
  infer(c, e.handle, e.signature.name, std::move(e.inputs), [&c, h = e.handle, sig = e.signature](TensorMap& out) {
    fill_spec(*h, sig.name, c.response.mutable_model_spec());
    fill_regressions(regressions_of(sig, out), c.response.mutable_result());
  });
}

void AsyncServer::model_infer(InferCall& c) {
  auto start = SteadyClock::now();
  const auto& req = c.request;
  ServableHandlePtr h;
  TensorMap inputs;
  const bool raw = req.raw_input_contents_size() > 0;
  if (!parsed(c, [&] {
        auto spec = kserve_v2::model_spec(req.model_name(), req.model_version());
        c.model = spec.name;
        h = core_.get(spec);
        c.version = h->version;
        if (raw && req.raw_input_contents_size() != req.inputs_size())
          throw ServingError(Code::kInvalidArgument,
                             "raw_input_contents has " + std::to_string(req.raw_input_contents_size()) +
                                 " entries but the request has " + std::to_string(req.inputs_size()) +
                                 " inputs; send one per input or use contents");
        for (int i = 0; i < req.inputs_size(); ++i) {
          const auto& in = req.inputs(i);
          WireTensor w = from_infer_input(in, raw ? &req.raw_input_contents(i) : nullptr);
          kserve_v2::check_input(h->signatures(), in.name(), w.is_string() ? kStringDType : w.tensor.scalar_type());
          inputs[in.name()] =
              signature_input(std::move(w), signature_input_spec(h->signatures(), kDefaultSignature, in.name()),
                              "input '" + in.name() + "'");
        }
      }))
    return;
  c.timing.parse_us = micros_since(start);
  infer(c, h, kDefaultSignature, std::move(inputs), [&c, h, raw](TensorMap& out) {
    const auto& req = c.request;
    std::vector<std::string> requested;
    for (auto& o : req.outputs()) requested.push_back(o.name());
    auto& resp = c.response;
    resp.set_model_name(h->model_name);
    resp.set_model_version(std::to_string(h->version));
    resp.set_id(req.id());
    const StringTensorNames strings = string_tensor_names(h->signatures(), kDefaultSignature);
    for (auto& n : kserve_v2::output_names(out, requested))
      output_to_infer_output(n, out.at(n), strings.outputs.count(n) > 0, resp.add_outputs(),
                             raw ? resp.add_raw_output_contents() : nullptr);
  });
}

// --- cheap RPCs: answered on the queue's thread --------------------------------------------
void AsyncServer::metadata(MetadataCall& c) {
  answer(c, [&] {
    const auto& req = c.request;
    auto spec = spec_of(req.model_spec());
    c.model = spec.name;
    tfs_v1::check_metadata_fields({req.metadata_field().begin(), req.metadata_field().end()});
    auto h = core_.get(spec);
    c.version = h->version;
    tfs::SignatureDefMap map;
    for (auto& [sig_name, sig] : tfs_v1::signature_defs(h->signatures())) {
      tensorflow::SignatureDef& def = (*map.mutable_signature_def())[sig_name];
      def.set_method_name(sig.method_name);
      for (auto* side : {&sig.inputs, &sig.outputs}) {
        auto* m = side == &sig.inputs ? def.mutable_inputs() : def.mutable_outputs();
        for (auto& [name, info] : *side) {
          tensorflow::TensorInfo& ti = (*m)[name];
          ti.set_name(info.name);
          tensorflow::DataType dt = tensorflow::DT_INVALID;
          tensorflow::DataType_Parse(info.dtype, &dt);
          ti.set_dtype(dt);
          shape_to_proto(info.shape, ti.mutable_tensor_shape());
        }
      }
    }
    (*c.response.mutable_metadata())["signature_def"].PackFrom(map);
    c.response.mutable_model_spec()->set_name(h->model_name);
    c.response.mutable_model_spec()->mutable_version()->set_value(h->version);
  });
}

void AsyncServer::model_status(StatusCall& c) {
  answer(c, [&] {
    auto spec = spec_of(c.request.model_spec());
    c.model = spec.name;
    for (auto& v : core_.model_status(spec)) {
      auto* s = c.response.add_model_version_status();
      s->set_version(v.version);
      s->set_state(tfs_state(v.state));
      auto* st = s->mutable_status();
      if (v.state == VersionState::kError) {
        st->set_error_code(tensorflow::error::UNKNOWN);
        st->set_error_message(v.error);
      } else {
        st->set_error_code(tensorflow::error::OK);
      }
    }
  });
}

// A reload scans the model directories and may take long: it runs on the
// admin worker, not on a polling thread.
void AsyncServer::reload_config(ReloadCall& c) {
  ModelServerConfig config;
  auto done = [&c](const Status& s) {
    c.response.mutable_status()->set_error_code(static_cast<tensorflow::error::Code>(static_cast<int>(s.code)));
    c.response.mutable_status()->set_error_message(s.message);
    c.finish(s);
  };
  try {
    check_admin_call(options_, &c.ctx);
    const auto& cfg = c.request.config();
    if (cfg.config_case() != tfs::ModelServerConfig::kModelConfigList)
      throw ServingError(Code::kInvalidArgument,
                         "ModelServerConfig must hold a model_config_list (custom_model_config is not supported)");
    for (auto& m : cfg.model_config_list().config()) {
      ModelConfig mc;
      mc.name = m.name();
      mc.base_path = m.base_path();
      if (!m.model_platform().empty()) mc.model_platform = m.model_platform();
      if (m.has_model_version_policy()) mc.version_policy = policy_of(m.model_version_policy());
      for (auto& [label, v] : m.version_labels()) mc.version_labels[label] = v;
      config.models.push_back(std::move(mc));
    }
  } catch (...) {
    done(status_of_current_exception());
    return;
  }
  // The call stays live until done(), so stop() keeps the worker until then.
  admin_->submit([this, done, config = std::move(config)] {
    Status s;
    try {
      core_.reload_config(config);
    } catch (...) {
      s = status_of_current_exception();
    }
    done(s);
  });
}

void AsyncServer::live(LiveCall& c) {
  answer(c, [&] { c.response.set_live(true); });
}

void AsyncServer::ready(ReadyCall& c) {
  answer(c, [&] { c.response.set_ready(core_.ready()); });
}

void AsyncServer::model_ready(ModelReadyCall& c) {
  answer(c,
         [&] { c.response.set_ready(core_.is_ready(kserve_v2::model_spec(c.request.name(), c.request.version()))); });
}

void AsyncServer::server_metadata(ServerMetadataCall& c) {
  answer(c, [&] {
    c.response.set_name(kserve_v2::kServerName);
    c.response.set_version(kserve_v2::kServerVersion);
  });
}

void AsyncServer::model_metadata(ModelMetadataCall& c) {
  answer(c, [&] {
    auto spec = kserve_v2::model_spec(c.request.name(), c.request.version());
    c.model = spec.name;
    kserve_v2::ModelMetadata m = kserve_v2::model_metadata(core_, spec);
    c.version = m.version;
    auto& resp = c.response;
    resp.set_name(m.name);
    for (auto& v : m.versions) resp.add_versions(v);
    resp.set_platform(m.platform);
    for (auto* side : {&m.inputs, &m.outputs})
      for (auto& info : *side) {
        auto* t = side == &m.inputs ? resp.add_inputs() : resp.add_outputs();
        t->set_name(info.name);
        t->set_datatype(info.datatype);
        for (auto d : info.shape) t->add_shape(d);
      }
  });
}

const bool registered = (register_grpc_frontend([](ServerCore& core, const FrontendOptions& o) {
                           return std::unique_ptr<Frontend>(new GrpcServer(core, o));
                         }),
                         true);

}  // namespace

struct GrpcServer::Impl : AsyncServer {
  using AsyncServer::AsyncServer;
};

GrpcServer::GrpcServer(ServerCore& core, FrontendOptions options) : core_(core), options_(std::move(options)) {
  check_tls_options(options_.tls, "gRPC TLS");
}

GrpcServer::~GrpcServer() { stop(); }

int GrpcServer::start() {
  if (impl_) return port_;
  options_.validate();
  auto impl = std::make_unique<Impl>(core_, options_);
  port_ = impl->start();
  impl_ = std::move(impl);
  return port_;
}

void GrpcServer::stop() {
  if (!impl_) return;
  impl_->stop();
  impl_.reset();
}

}  // namespace kiln::serving
