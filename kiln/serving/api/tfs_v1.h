// TF Serving's v1 API (PredictionService and ModelService: predict,
// classify, regress, multi-inference, metadata, status) on a ServerCore,
// written once for both front ends. A front end decodes its wire form
// (REST JSON, gRPC protos) into what these take, and encodes what they give;
// the rules of the API (defaults, which outputs, which signatures, TF
// Serving's error messages) live here.
//
//   ServableHandlePtr h = core.get(spec);
//   std::string sig = tfs_v1::signature_or_default(request_signature);
//   ...decode inputs...; run_inference(core, h, sig, inputs, ...)     // api/run_inference.h
//   for (auto& n : tfs_v1::predict_output_names(outputs, filter)) ...encode outputs[n]...
//
//   Json body = tfs_v1::metadata_json(*h);                  // REST GET .../metadata
//   for (auto& [name, def] : tfs_v1::signature_defs(h->signatures())) ...fill SignatureDef...
//
// Classify and regress resolve their signature and read their results with
// kiln/serving/codec/inference.h. Errors: ServingError with TF Serving's
// code and wording. Thread safety: pure functions, except those taking a
// ServerCore, which are as thread-safe as it is.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/json.h"
#include "kiln/core/shape.h"
#include "kiln/serving/codec/inference.h"
#include "kiln/serving/core/server_core.h"

namespace kiln::serving::tfs_v1 {

// --- model selection ---------------------------------------------------------------
// A request's signature_name: "" means serving_default.
std::string signature_or_default(const std::string& name);

// --- Predict ------------------------------------------------------------------------
// The outputs a Predict answers: every one (an empty output_filter) or those
// the filter names, in its order. INVALID_ARGUMENT "output tensor alias not
// found in signature: x" for a name the model does not output.
template <class Names>
std::vector<std::string> predict_output_names(const TensorMap& outputs, const Names& output_filter);

// --- MultiInference -------------------------------------------------------------------
// One task as the request names it: its model, signature and method
// ("tensorflow/serving/classify" or ".../regress").
struct MultiInferenceTask {
  ModelSpec spec;
  std::string signature_name;
  std::string method_name;
};
// TF Serving's rules: at least one task; every task names the same model
// and version; no signature twice; each a classify or regress method.
// Returns the model all tasks name. INVALID_ARGUMENT with its message otherwise.
ModelSpec check_multi_inference(const std::vector<MultiInferenceTask>& tasks);
// The resolved signature of each task, in task order.
std::vector<InferenceSignature> multi_inference_signatures(const ServableHandle& handle,
                                                           const std::vector<MultiInferenceTask>& tasks);
// Runs the tasks concurrently through the core; `done` runs once, when the
// last is back, with the first error (or none), each task's outputs in task
// order, and the timing (queue/compute/batch_size: the maximum over tasks).
using MultiInferenceDone =
    std::function<void(std::exception_ptr error, std::vector<TensorMap>& outputs, const RequestTiming& timing)>;
void run_multi_inference(ServerCore& core, const ServableHandlePtr& handle,
                         const std::vector<InferenceSignature>& signatures, std::vector<TensorMap> inputs,
                         Deadline deadline, MultiInferenceDone done);

// --- GetModelMetadata -------------------------------------------------------------------
// The metadata fields a request may ask for: "signature_def" only, and at
// least one (TF Serving's GetModelMetadata messages).
void check_metadata_fields(const std::vector<std::string>& fields);
// "float32" -> "DT_FLOAT" ... (TF DataType enum names; DT_INVALID if none).
std::string tf_dtype_name(const std::string& kiln_dtype);
// A TensorInfo of a SignatureDef: name "<name>:0", TF dtype, shape with -1
// for unknown dimensions.
struct TensorInfo {
  std::string name;
  std::string dtype;
  Shape shape;
};
struct SignatureDef {
  std::string method_name;  // "tensorflow/serving/predict" ...
  std::vector<std::pair<std::string, TensorInfo>> inputs, outputs;
};
// The model's SignatureDefMap, in its kiln signature JSON's order
// (Servable::signatures()): what both front ends' metadata answers hold.
std::vector<std::pair<std::string, SignatureDef>> signature_defs(const Json& signatures);
// The REST GetModelMetadata body:
// {"model_spec": {"name", "signature_name": "", "version"}, "metadata":
//  {"signature_def": {"signature_def": {"serving_default": {"inputs": {name:
//  {"dtype": "DT_FLOAT", "tensor_shape": {"dim": [{"size": "-1", "name": ""}],
//  "unknown_rank": false}, "name": "name:0"}}, "outputs": {...},
//  "method_name": "tensorflow/serving/predict"}}}}}
Json metadata_json(const ServableHandle& handle);

// --- GetModelStatus -------------------------------------------------------------------------
// The REST GetModelStatus body:
// {"model_version_status": [{"version": "1", "state": "AVAILABLE",
//   "status": {"error_code": "OK", "error_message": ""}}]}
// (newest first; error_code UNKNOWN with the load error for a version in Error).
Json status_json(const std::vector<VersionStatus>& versions);

// --- implementation -----------------------------------------------------------------------------
template <class Names>
std::vector<std::string> predict_output_names(const TensorMap& outputs, const Names& output_filter) {
  std::vector<std::string> names;
  if (output_filter.empty()) {
    for (auto& [name, v] : outputs) names.push_back(name);
    return names;
  }
  for (const std::string& f : output_filter) {
    if (!outputs.count(f))
      throw ServingError(Code::kInvalidArgument, "output tensor alias not found in signature: " + f);
    names.push_back(f);
  }
  return names;
}

}  // namespace kiln::serving::tfs_v1
