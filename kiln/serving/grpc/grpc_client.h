// A small client of TF Serving's tensorflow.serving.PredictionService (what
// `kiln predict --grpc` uses): reads a signature with GetModelMetadata and
// runs Predict, over plaintext or TLS, with an optional bearer token. Works
// against kiln serve and TF Serving alike.
//
//   PredictionClientOptions o;
//   o.target = "127.0.0.1:8500";
//   o.model_name = "mnist";
//   PredictionClient client(o);
//   auto sig = client.signature();                 // inputs/outputs with dtype and shape
//   TensorMap y = client.predict({{"inputs", x}});
//
// Errors: ServingError with the server's gRPC code and message, prefixed with
// the target ("127.0.0.1:8500: NOT_FOUND: Servable not found ..."); an
// unreachable server is UNAVAILABLE. One client may be used from several
// threads (gRPC stubs are thread-safe). gRPC stays out of this header.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/shape.h"
#include "kiln/serving/core/servable.h"

namespace kiln::serving {

struct PredictionClientOptions {
  std::string target;              // host:port
  std::string model_name;          // required
  std::optional<int64_t> version;  // neither version nor label: the latest
  std::string version_label;
  std::string signature_name = kDefaultSignature;
  bool tls = false;             // TLS; trusts ca_pem, or the system's roots when empty
  std::string ca_pem;           // PEM contents of the CA that signed the server's certificate
  std::string client_cert_pem;  // mutual TLS: this client's certificate (PEM contents) ...
  std::string client_key_pem;   // ... and its private key
  std::string bearer_token;     // sent as metadata "authorization: Bearer <token>"
  double timeout_seconds = 60;  // per call
};

struct SignatureTensor {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  Shape shape;  // with the batch dimension; kNone (-1) where any size goes
};

struct ClientSignature {
  std::vector<SignatureTensor> inputs, outputs;  // in name order (the wire's map has none)
};

class PredictionClient {
 public:
  explicit PredictionClient(PredictionClientOptions options);  // ValueError for a bad target or name
  ~PredictionClient();
  PredictionClient(const PredictionClient&) = delete;
  PredictionClient& operator=(const PredictionClient&) = delete;

  // GetModelMetadata's signature_def for options.signature_name.
  // ServingError INVALID_ARGUMENT listing the model's signatures if absent.
  ClientSignature signature();
  // Predict. `version` (if given) receives the version that answered.
  // Inputs of dtype string in the last signature() read (kStringDType) are
  // string tensors (kiln/core/string_tensor.h) and go as DT_STRING; DT_STRING
  // outputs come back as string tensors.
  TensorMap predict(const TensorMap& inputs, int64_t* version = nullptr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::serving
