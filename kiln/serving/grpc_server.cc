#include "kiln/serving/grpc_server.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <fstream>
#include <sstream>

#include "inference/grpc_predict_v2.grpc.pb.h"
#include "kiln/core/dtype.h"
#include "kiln/core/error.h"
#include "kiln/core/io.h"
#include "kiln/serving/example_input.h"
#include "kiln/serving/inference.h"
#include "kiln/serving/server_core.h"
#include "kiln/serving/status.h"
#include "kiln/serving/tensor_proto.h"
#include "kiln/serving/tls.h"
#include "tensorflow_serving/apis/model_service.grpc.pb.h"
#include "tensorflow_serving/apis/prediction_service.grpc.pb.h"

namespace kiln::serving {
namespace {

namespace tfs = tensorflow::serving;
using SteadyClock = std::chrono::steady_clock;

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

std::string signature_of(const tfs::ModelSpec& s) {
  return s.signature_name().empty() ? std::string(kDefaultSignature) : s.signature_name();
}

const Json& signature_json(const ServableHandle& h, const std::string& name) {
  const Json& sigs = h.signatures();
  if (!sigs.contains(name)) {
    std::string known;
    for (auto& [k, v] : sigs.items()) known += (known.empty() ? "'" : ", '") + k + "'";
    throw ServingError(Code::kInvalidArgument,
                       "Serving signature name: '" + name + "' not found in signature def; the model has " + known);
  }
  return sigs[name];
}

Shape shape_of(const Json& j) {
  Shape s;
  for (auto& d : j) s.push_back(d.is_null() ? -1 : d.get<int64_t>());
  return s;
}

std::string kserve_dtype_name(const std::string& kiln_dtype) {
  try {
    return kserve_datatype(dtype_from_string(kiln_dtype));
  } catch (const std::exception&) {
    return "BYTES";
  }
}

// Runs `body`, turns whatever it throws into a gRPC status, and records the
// request in the core's metrics.
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

template <typename F>
grpc::Status handle(ServerCore& core, const FrontendOptions& o, grpc::ServerContext* ctx, const char* protocol,
                    const char* api, F body, Auth auth = Auth::kRequired) {
  RequestTiming timing;
  std::string model;
  int64_t version = 0;
  Status status;
  try {
    if (auth == Auth::kRequired) check_token(o, ctx);
    body(timing, model, version);
  } catch (...) {
    status = status_of_current_exception();
  }
  if (!model.empty()) core.record_request(model, version, protocol, api, status, timing);
  return to_grpc(status);
}

// --- tensorflow.serving.PredictionService -----------------------------------
class PredictionServiceImpl final : public tfs::PredictionService::Service {
 public:
  PredictionServiceImpl(ServerCore& core, const FrontendOptions& o) : core_(core), o_(o) {}

  grpc::Status Predict(grpc::ServerContext* ctx, const tfs::PredictRequest* req, tfs::PredictResponse* resp) override {
    return handle(core_, o_, ctx, "grpc", "predict", [&](RequestTiming& t, std::string& model, int64_t& version) {
      auto start = SteadyClock::now();
      auto spec = spec_of(req->model_spec());
      model = spec.name;
      auto h = core_.get(spec);
      version = h->version;
      const std::string sig = signature_of(req->model_spec());
      TensorMap inputs;
      for (auto& [name, proto] : req->inputs()) {
        WireTensor w = from_tensor_proto(proto, "inputs['" + name + "']");
        if (w.is_string())
          throw ServingError(Code::kInvalidArgument,
                             "inputs['" + name + "'] is DT_STRING; kiln models take numeric tensors");
        inputs[name] = w.tensor;
      }
      t.parse_us = micros_since(start);
      TensorMap out = core_.predict(*h, sig, inputs, deadline_of(ctx), &t);
      start = SteadyClock::now();
      std::vector<std::string> names;
      if (req->output_filter_size() == 0) {
        for (auto& [k, v] : out) names.push_back(k);
      } else {
        for (auto& f : req->output_filter()) {
          if (!out.count(f))
            throw ServingError(Code::kInvalidArgument, "output tensor alias not found in signature: " + f);
          names.push_back(f);
        }
      }
      for (auto& n : names) to_tensor_proto(out.at(n), &(*resp->mutable_outputs())[n]);
      fill_spec(*h, sig, resp->mutable_model_spec());
      t.serialize_us = micros_since(start);
    });
  }

  grpc::Status Classify(grpc::ServerContext* ctx, const tfs::ClassificationRequest* req,
                        tfs::ClassificationResponse* resp) override {
    return handle(core_, o_, ctx, "grpc", "classify", [&](RequestTiming& t, std::string& model, int64_t& version) {
      TensorMap out;
      auto sig = run_examples(ctx, req->model_spec(), req->input(), InferenceApi::kClassify, t, model, version,
                              resp->mutable_model_spec(), out);
      Classifications c = classifications_of(sig, out);
      auto* result = resp->mutable_result();
      for (int64_t i = 0; i < c.examples; ++i) {
        auto* row = result->add_classifications();
        for (int64_t k = 0; k < c.classes; ++k) {
          auto* cls = row->add_classes();
          cls->set_label(c.label(i, k));
          cls->set_score(c.score(i, k));
        }
      }
    });
  }

  grpc::Status Regress(grpc::ServerContext* ctx, const tfs::RegressionRequest* req,
                       tfs::RegressionResponse* resp) override {
    return handle(core_, o_, ctx, "grpc", "regress", [&](RequestTiming& t, std::string& model, int64_t& version) {
      TensorMap out;
      auto sig = run_examples(ctx, req->model_spec(), req->input(), InferenceApi::kRegress, t, model, version,
                              resp->mutable_model_spec(), out);
      for (float v : regressions_of(sig, out)) resp->mutable_result()->add_regressions()->set_value(v);
    });
  }

  grpc::Status GetModelMetadata(grpc::ServerContext* ctx, const tfs::GetModelMetadataRequest* req,
                                tfs::GetModelMetadataResponse* resp) override {
    return handle(core_, o_, ctx, "grpc", "metadata", [&](RequestTiming&, std::string& model, int64_t& version) {
      auto spec = spec_of(req->model_spec());
      model = spec.name;
      if (req->metadata_field_size() == 0)
        throw ServingError(Code::kInvalidArgument,
                           "GetModelMetadataRequest must specify at least one metadata_field (\"signature_def\")");
      for (auto& f : req->metadata_field())
        if (f != "signature_def")
          throw ServingError(Code::kInvalidArgument,
                             "Metadata field " + f + " is not supported; use \"signature_def\"");
      auto h = core_.get(spec);
      version = h->version;
      tfs::SignatureDefMap map;
      for (auto& [sig_name, sig] : h->signatures().items()) {
        tensorflow::SignatureDef& def = (*map.mutable_signature_def())[sig_name];
        def.set_method_name("tensorflow/serving/" + sig.value("method_name", std::string("predict")));
        for (const char* side : {"inputs", "outputs"}) {
          if (!sig.contains(side)) continue;
          auto* m = std::string(side) == "inputs" ? def.mutable_inputs() : def.mutable_outputs();
          for (auto& [name, info] : sig[side].items()) {
            tensorflow::TensorInfo& ti = (*m)[name];
            ti.set_name(name + ":0");
            tensorflow::DataType dt = tensorflow::DT_INVALID;
            tensorflow::DataType_Parse(tf_dtype_name(info.value("dtype", std::string("float32"))), &dt);
            ti.set_dtype(dt);
            shape_to_proto(shape_of(info.value("shape", Json::array())), ti.mutable_tensor_shape());
          }
        }
      }
      (*resp->mutable_metadata())["signature_def"].PackFrom(map);
      resp->mutable_model_spec()->set_name(h->model_name);
      resp->mutable_model_spec()->mutable_version()->set_value(h->version);
    });
  }

 private:
  // Classify/Regress: Examples -> the signature's inputs -> its first output.
  InferenceSignature run_examples(grpc::ServerContext* ctx, const tfs::ModelSpec& ms, const tfs::Input& input,
                                  InferenceApi api, RequestTiming& t, std::string& model, int64_t& version,
                                  tfs::ModelSpec* out_spec, TensorMap& out) {
    auto start = SteadyClock::now();
    auto spec = spec_of(ms);
    model = spec.name;
    auto h = core_.get(spec);
    version = h->version;
    InferenceSignature sig = inference_signature(h->signatures(), signature_of(ms), api);
    std::vector<ExampleInputSpec> specs;
    for (auto& in : sig.inputs) specs.push_back({in.name, dtype_from_string(in.dtype), in.shape});
    auto tensors = examples_to_tensors(input, specs);
    TensorMap inputs;
    for (size_t i = 0; i < specs.size(); ++i) inputs[specs[i].name] = tensors[i];
    t.parse_us = micros_since(start);
    out = core_.predict(*h, sig.name, inputs, deadline_of(ctx), &t);
    fill_spec(*h, sig.name, out_spec);
    return sig;
  }

  ServerCore& core_;
  const FrontendOptions& o_;
};

// --- tensorflow.serving.ModelService ------------------------------------------
tfs::ModelVersionStatus::State tfs_state(VersionState s) {
  switch (s) {
    case VersionState::kNew:
      return tfs::ModelVersionStatus::START;
    case VersionState::kLoading:
      return tfs::ModelVersionStatus::LOADING;
    case VersionState::kReady:
      return tfs::ModelVersionStatus::AVAILABLE;
    case VersionState::kQuiescing:
    case VersionState::kUnloading:
      return tfs::ModelVersionStatus::UNLOADING;
    case VersionState::kDisabled:
    case VersionState::kError:
      return tfs::ModelVersionStatus::END;
  }
  return tfs::ModelVersionStatus::UNKNOWN;
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

class ModelServiceImpl final : public tfs::ModelService::Service {
 public:
  ModelServiceImpl(ServerCore& core, const FrontendOptions& o) : core_(core), o_(o) {}

  grpc::Status GetModelStatus(grpc::ServerContext* ctx, const tfs::GetModelStatusRequest* req,
                              tfs::GetModelStatusResponse* resp) override {
    return handle(core_, o_, ctx, "grpc", "status", [&](RequestTiming&, std::string& model, int64_t&) {
      auto spec = spec_of(req->model_spec());
      model = spec.name;
      for (auto& v : core_.model_status(spec)) {
        auto* s = resp->add_model_version_status();
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

  grpc::Status HandleReloadConfigRequest(grpc::ServerContext* ctx, const tfs::ReloadConfigRequest* req,
                                         tfs::ReloadConfigResponse* resp) override {
    grpc::Status s = handle(
        core_, o_, ctx, "grpc", "reload_config",
        [&](RequestTiming&, std::string&, int64_t&) {
          check_admin_call(o_, ctx);
          const auto& c = req->config();
          if (c.config_case() != tfs::ModelServerConfig::kModelConfigList)
            throw ServingError(
                Code::kInvalidArgument,
                "ModelServerConfig must hold a model_config_list (custom_model_config is not supported)");
          ModelServerConfig config;
          for (auto& m : c.model_config_list().config()) {
            ModelConfig mc;
            mc.name = m.name();
            mc.base_path = m.base_path();
            if (!m.model_platform().empty()) mc.model_platform = m.model_platform();
            if (m.has_model_version_policy()) mc.version_policy = policy_of(m.model_version_policy());
            for (auto& [label, v] : m.version_labels()) mc.version_labels[label] = v;
            config.models.push_back(std::move(mc));
          }
          core_.reload_config(config);
        },
        Auth::kOpen);
    resp->mutable_status()->set_error_code(static_cast<tensorflow::error::Code>(static_cast<int>(s.error_code())));
    resp->mutable_status()->set_error_message(s.error_message());
    return s;
  }

 private:
  ServerCore& core_;
  const FrontendOptions& o_;
};

// --- inference.GRPCInferenceService (KServe v2) ---------------------------------
ModelSpec kserve_spec(const std::string& name, const std::string& version) {
  if (name.empty()) throw ServingError(Code::kInvalidArgument, "the model name is empty");
  ModelSpec spec;
  spec.name = name;
  if (!version.empty()) {
    char* end = nullptr;
    long long v = std::strtoll(version.c_str(), &end, 10);
    if (*end != '\0' || v <= 0)
      throw ServingError(Code::kInvalidArgument, "model version '" + version + "' is not a positive integer");
    spec.version = v;
  }
  return spec;
}

class InferenceServiceImpl final : public inference::GRPCInferenceService::Service {
 public:
  InferenceServiceImpl(ServerCore& core, const FrontendOptions& o) : core_(core), o_(o) {}

  grpc::Status ServerLive(grpc::ServerContext* ctx, const inference::ServerLiveRequest*,
                          inference::ServerLiveResponse* resp) override {
    return handle(
        core_, o_, ctx, "kserve_grpc", "live", [&](RequestTiming&, std::string&, int64_t&) { resp->set_live(true); },
        Auth::kOpen);
  }
  grpc::Status ServerReady(grpc::ServerContext* ctx, const inference::ServerReadyRequest*,
                           inference::ServerReadyResponse* resp) override {
    return handle(
        core_, o_, ctx, "kserve_grpc", "ready",
        [&](RequestTiming&, std::string&, int64_t&) { resp->set_ready(core_.ready()); }, Auth::kOpen);
  }
  grpc::Status ModelReady(grpc::ServerContext* ctx, const inference::ModelReadyRequest* req,
                          inference::ModelReadyResponse* resp) override {
    return handle(core_, o_, ctx, "kserve_grpc", "model_ready", [&](RequestTiming&, std::string&, int64_t&) {
      resp->set_ready(core_.is_ready(kserve_spec(req->name(), req->version())));
    });
  }
  grpc::Status ServerMetadata(grpc::ServerContext* ctx, const inference::ServerMetadataRequest*,
                              inference::ServerMetadataResponse* resp) override {
    return handle(core_, o_, ctx, "kserve_grpc", "server_metadata", [&](RequestTiming&, std::string&, int64_t&) {
      resp->set_name("kiln");
      resp->set_version("1");
    });
  }
  grpc::Status ModelMetadata(grpc::ServerContext* ctx, const inference::ModelMetadataRequest* req,
                             inference::ModelMetadataResponse* resp) override {
    return handle(core_, o_, ctx, "kserve_grpc", "metadata", [&](RequestTiming&, std::string& model, int64_t& version) {
      auto spec = kserve_spec(req->name(), req->version());
      model = spec.name;
      auto h = core_.get(spec);
      version = h->version;
      resp->set_name(h->model_name);
      resp->add_versions(std::to_string(h->version));
      resp->set_platform("kiln");
      const Json& sig = signature_json(*h, kDefaultSignature);
      for (const char* side : {"inputs", "outputs"}) {
        if (!sig.contains(side)) continue;
        for (auto& [name, info] : sig[side].items()) {
          auto* t = std::string(side) == "inputs" ? resp->add_inputs() : resp->add_outputs();
          t->set_name(name);
          t->set_datatype(kserve_dtype_name(info.value("dtype", std::string("float32"))));
          for (auto d : shape_of(info.value("shape", Json::array()))) t->add_shape(d);
        }
      }
    });
  }
  grpc::Status ModelInfer(grpc::ServerContext* ctx, const inference::ModelInferRequest* req,
                          inference::ModelInferResponse* resp) override {
    return handle(core_, o_, ctx, "kserve_grpc", "infer", [&](RequestTiming& t, std::string& model, int64_t& version) {
      auto start = SteadyClock::now();
      auto spec = kserve_spec(req->model_name(), req->model_version());
      model = spec.name;
      auto h = core_.get(spec);
      version = h->version;
      const bool raw = req->raw_input_contents_size() > 0;
      if (raw && req->raw_input_contents_size() != req->inputs_size())
        throw ServingError(Code::kInvalidArgument,
                           "raw_input_contents has " + std::to_string(req->raw_input_contents_size()) +
                               " entries but the request has " + std::to_string(req->inputs_size()) +
                               " inputs; send one per input or use contents");
      TensorMap inputs;
      for (int i = 0; i < req->inputs_size(); ++i) {
        const auto& in = req->inputs(i);
        WireTensor w = from_infer_input(in, raw ? &req->raw_input_contents(i) : nullptr);
        if (w.is_string())
          throw ServingError(Code::kInvalidArgument,
                             "input '" + in.name() + "' is BYTES; kiln models take numeric tensors");
        inputs[in.name()] = w.tensor;
      }
      t.parse_us = micros_since(start);
      TensorMap out = core_.predict(*h, kDefaultSignature, inputs, deadline_of(ctx), &t);
      start = SteadyClock::now();
      std::vector<std::string> names;
      if (req->outputs_size() == 0) {
        for (auto& [k, v] : out) names.push_back(k);
      } else {
        for (auto& o : req->outputs()) {
          if (!out.count(o.name()))
            throw ServingError(Code::kInvalidArgument, "unknown output '" + o.name() + "' requested");
          names.push_back(o.name());
        }
      }
      resp->set_model_name(h->model_name);
      resp->set_model_version(std::to_string(h->version));
      resp->set_id(req->id());
      for (auto& n : names)
        to_infer_output(n, out.at(n), resp->add_outputs(), raw ? resp->add_raw_output_contents() : nullptr);
      t.serialize_us = micros_since(start);
    });
  }

 private:
  ServerCore& core_;
  const FrontendOptions& o_;
};

const bool registered = (register_grpc_frontend([](ServerCore& core, const FrontendOptions& o) {
                           return std::unique_ptr<Frontend>(new GrpcServer(core, o));
                         }),
                         true);

}  // namespace

GrpcServer::GrpcServer(ServerCore& core, FrontendOptions options) : core_(core), options_(std::move(options)) {
  check_tls_options(options_.tls, "gRPC TLS");
}

GrpcServer::~GrpcServer() { stop(); }

int GrpcServer::start() {
  if (server_) return port_;
  options_.validate();
  prediction_ = std::make_unique<PredictionServiceImpl>(core_, options_);
  model_ = std::make_unique<ModelServiceImpl>(core_, options_);
  inference_ = std::make_unique<InferenceServiceImpl>(core_, options_);
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
  grpc::ServerBuilder b;
  int selected = 0;
  b.AddListeningPort(address, creds, &selected);
  b.SetMaxReceiveMessageSize(static_cast<int>(std::min<size_t>(options_.max_body_bytes, INT32_MAX)));
  b.SetMaxSendMessageSize(INT32_MAX);
  // The sync server's defaults (1 to 2 polling threads) make it start a
  // thread for nearly every concurrent call and end it afterwards; each new
  // thread that runs a model also builds its own OpenMP team. Under 8
  // concurrent clients that churn cost ~2 ms of CPU per request and held
  // throughput at ~400 QPS where REST did 6,000 (bench/serving_bench.sh).
  // Keep up to num_threads threads polling instead (idle ones block).
  const int threads = std::max(2, options_.num_threads);
  b.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, std::min(threads, 4));
  b.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, threads);
  b.RegisterService(prediction_.get());
  b.RegisterService(model_.get());
  b.RegisterService(inference_.get());
  server_ = b.BuildAndStart();
  if (!server_ || selected == 0) {
    server_.reset();
    throw IOError("gRPC: cannot listen on " + address + " (in use, or not a local address)");
  }
  port_ = selected;
  return port_;
}

void GrpcServer::stop() {
  if (!server_) return;
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  server_->Wait();
  server_.reset();
}

}  // namespace kiln::serving
