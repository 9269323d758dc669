// KServe v2 / Open Inference Protocol (health, server and model metadata,
// model ready, infer) on a ServerCore, written once for both front ends. A
// front end decodes its wire form (REST JSON, gRPC protos) into what these
// take and encodes what they give; the protocol's rules (version strings,
// which versions a model lists, input checks, which outputs) live here.
//
//   ModelSpec spec = kserve_v2::model_spec(name, version);   // version "" = the latest
//   kserve_v2::ModelMetadata m = kserve_v2::model_metadata(core, spec);
//   ServableHandlePtr h = core.get(spec);
//   kserve_v2::check_input(h->signatures(), "x", tensor.scalar_type());
//   ...run_inference (api/run_inference.h)...
//   for (auto& n : kserve_v2::output_names(outputs, requested)) ...encode outputs[n]...
//
// Errors: ServingError (INVALID_ARGUMENT naming the input, output or
// version; NOT_FOUND / UNAVAILABLE from the core). Thread safety: as ServerCore.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/core/json.h"
#include "kiln/serving/core/server_core.h"

namespace kiln::serving::kserve_v2 {

// The server's metadata (ServerMetadata; REST GET /v2).
inline constexpr const char* kServerName = "kiln";
inline constexpr const char* kServerVersion = "1";
// The platform ModelMetadata names.
inline constexpr const char* kPlatform = "kiln";

// A model and an optional decimal version ("" = the latest ready one).
// INVALID_ARGUMENT for an empty name or a version that is not a positive integer.
ModelSpec model_spec(const std::string& name, const std::string& version);

// --- ModelMetadata ------------------------------------------------------------------------------
struct TensorMetadata {
  std::string name;
  std::string datatype;        // "FP32", ... ("BYTES" for a dtype without a KServe numeric type)
  std::vector<int64_t> shape;  // -1 for unknown dimensions
};
struct ModelMetadata {
  std::string name;
  int64_t version = 0;  // the one the spec resolves to (metrics)
  // Every Ready version the spec covers (all of the model's without a
  // version), newest first, as decimal strings: the protocol's "versions
  // available". REST and gRPC answer the same list.
  std::vector<std::string> versions;
  std::string platform = kPlatform;
  std::vector<TensorMetadata> inputs, outputs;  // of the default signature, in its order
};
// NOT_FOUND / UNAVAILABLE as core.get(spec); INVALID_ARGUMENT if the model
// has no serving_default signature.
ModelMetadata model_metadata(const ServerCore& core, const ModelSpec& spec);
// The REST body: {"name", "versions", "platform", "inputs": [{"name",
// "datatype", "shape"}], "outputs": [...]}.
Json to_json(const ModelMetadata& metadata);

// --- ModelInfer -----------------------------------------------------------------------------------
// Checks one decoded input against the model's default signature: a known
// input, of the dtype it declares. INVALID_ARGUMENT naming it otherwise.
void check_input(const Json& signatures, const std::string& name, at::ScalarType dtype);
// The outputs an infer answers: every one (none requested), else those
// requested, in request order, each once. INVALID_ARGUMENT for a name the
// model does not output.
std::vector<std::string> output_names(const TensorMap& outputs, const std::vector<std::string>& requested);

}  // namespace kiln::serving::kserve_v2
