#include "kiln/serving/grpc/grpc_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <set>

#include "kiln/core/error.h"
#include "kiln/core/string_tensor.h"
#include "kiln/serving/codec/tensor_proto.h"
#include "kiln/serving/status.h"
#include "tensorflow_serving/apis/prediction_service.grpc.pb.h"

namespace kiln::serving {
namespace {

namespace tfs = tensorflow::serving;

Shape shape_of(const tensorflow::TensorShapeProto& p) {
  Shape s;
  for (auto& d : p.dim()) s.push_back(d.size() < 0 ? kNone : d.size());
  return s;
}

}  // namespace

struct PredictionClient::Impl {
  PredictionClientOptions o;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<tfs::PredictionService::Stub> stub;
  std::mutex mu;
  std::set<std::string> string_inputs;  // guarded by mu; of the last signature() read

  void prepare(grpc::ClientContext& ctx) const {
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds((int64_t)(o.timeout_seconds * 1000)));
    if (!o.bearer_token.empty()) ctx.AddMetadata("authorization", "Bearer " + o.bearer_token);
  }

  void fill_spec(tfs::ModelSpec* spec) const {
    spec->set_name(o.model_name);
    if (o.version)
      spec->mutable_version()->set_value(*o.version);
    else if (!o.version_label.empty())
      spec->set_version_label(o.version_label);
    spec->set_signature_name(o.signature_name);
  }

  [[noreturn]] void fail(const grpc::Status& s) const {
    auto code = static_cast<Code>(static_cast<int>(s.error_code()));
    std::string msg = s.error_message();
    if (code == Code::kUnavailable)
      msg += " (is a gRPC server listening there? kiln serve takes --port; with TLS on the server pass --ssl_ca)";
    if (code == Code::kDeadlineExceeded)
      msg += " (no answer within " + std::to_string((int64_t)o.timeout_seconds) + " s)";
    throw ServingError(code, o.target + ": " + code_name(code) + ": " + msg);
  }
};

PredictionClient::PredictionClient(PredictionClientOptions options) : impl_(std::make_unique<Impl>()) {
  auto& o = impl_->o = std::move(options);
  if (o.target.empty() || o.target.find(':') == std::string::npos)
    throw ValueError("gRPC target '" + o.target + "' must be HOST:PORT, e.g. 127.0.0.1:8500");
  if (o.model_name.empty()) throw ValueError("a model name is required (--model_name)");
  if (o.version && !o.version_label.empty()) throw ValueError("give a model version or a version label, not both");
  if (o.timeout_seconds <= 0)
    throw ValueError("the timeout must be positive. Received: " + std::to_string(o.timeout_seconds));
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (o.client_cert_pem.empty() != o.client_key_pem.empty())
    throw ValueError(
        "a client certificate needs its key and the key its certificate (--ssl_client_cert and --ssl_client_key)");
  if (o.tls || !o.ca_pem.empty() || !o.client_cert_pem.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = o.ca_pem;
    ssl.pem_cert_chain = o.client_cert_pem;
    ssl.pem_private_key = o.client_key_pem;
    creds = grpc::SslCredentials(ssl);
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  impl_->channel = grpc::CreateCustomChannel(o.target, creds, args);
  impl_->stub = tfs::PredictionService::NewStub(impl_->channel);
}

PredictionClient::~PredictionClient() = default;

ClientSignature PredictionClient::signature() {
  tfs::GetModelMetadataRequest req;
  impl_->fill_spec(req.mutable_model_spec());
  req.add_metadata_field("signature_def");
  tfs::GetModelMetadataResponse resp;
  grpc::ClientContext ctx;
  impl_->prepare(ctx);
  grpc::Status s = impl_->stub->GetModelMetadata(&ctx, req, &resp);
  if (!s.ok()) impl_->fail(s);
  auto it = resp.metadata().find("signature_def");
  tfs::SignatureDefMap map;
  if (it == resp.metadata().end() || !it->second.UnpackTo(&map))
    throw ServingError(Code::kInternal, impl_->o.target + ": the metadata response holds no signature_def map");
  const std::string& name = impl_->o.signature_name;
  auto sig = map.signature_def().find(name);
  if (sig == map.signature_def().end()) {
    std::string known;
    for (auto& [k, v] : map.signature_def()) known += (known.empty() ? "'" : ", '") + k + "'";
    throw ServingError(Code::kInvalidArgument, impl_->o.target + ": model '" + impl_->o.model_name +
                                                   "' has no signature '" + name + "'; it has " + known);
  }
  ClientSignature out;
  for (int side = 0; side < 2; ++side) {
    const auto& m = side == 0 ? sig->second.inputs() : sig->second.outputs();
    auto& dst = side == 0 ? out.inputs : out.outputs;
    for (auto& [tensor_name, info] : m) {
      SignatureTensor t;
      t.name = tensor_name;
      t.dtype = info.dtype() == tensorflow::DT_STRING
                    ? kStringDType
                    : to_scalar_type(info.dtype(), "signature tensor '" + tensor_name + "'");
      t.shape = shape_of(info.tensor_shape());
      dst.push_back(std::move(t));
    }
    // A protobuf map has no order: name order makes the output deterministic.
    std::sort(dst.begin(), dst.end(), [](auto& a, auto& b) { return a.name < b.name; });
  }
  std::lock_guard<std::mutex> l(impl_->mu);
  impl_->string_inputs.clear();
  for (auto& t : out.inputs)
    if (is_string_dtype(t.dtype)) impl_->string_inputs.insert(t.name);
  return out;
}

TensorMap PredictionClient::predict(const TensorMap& inputs, int64_t* version) {
  tfs::PredictRequest req;
  impl_->fill_spec(req.mutable_model_spec());
  std::set<std::string> string_inputs;
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    string_inputs = impl_->string_inputs;
  }
  for (auto& [name, t] : inputs) {
    tensorflow::TensorProto& p = (*req.mutable_inputs())[name];
    if (string_inputs.count(name))
      to_tensor_proto(strings::logical_shape(t), strings::decode(t.cpu()), &p);
    else
      to_tensor_proto(t.contiguous(), &p, TensorEncoding::kTensorContent);
  }
  tfs::PredictResponse resp;
  grpc::ClientContext ctx;
  impl_->prepare(ctx);
  grpc::Status s = impl_->stub->Predict(&ctx, req, &resp);
  if (!s.ok()) impl_->fail(s);
  TensorMap out;
  for (auto& [name, proto] : resp.outputs()) {
    WireTensor w = from_tensor_proto(proto, "outputs['" + name + "']");
    out[name] = w.is_string() ? strings::encode(w.strings, w.shape) : w.tensor;
  }
  if (version) *version = resp.model_spec().has_version() ? resp.model_spec().version().value() : 0;
  return out;
}

}  // namespace kiln::serving
