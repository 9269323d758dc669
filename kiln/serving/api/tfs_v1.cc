#include "kiln/serving/api/tfs_v1.h"

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "kiln/serving/core/lifecycle.h"

namespace kiln::serving::tfs_v1 {

std::string signature_or_default(const std::string& name) {
  return name.empty() ? std::string(kDefaultSignature) : name;
}

ModelSpec check_multi_inference(const std::vector<MultiInferenceTask>& tasks) {
  if (tasks.empty())
    throw ServingError(Code::kInvalidArgument, "MultiInference needs at least one task (tasks is empty)");
  const ModelSpec& first = tasks[0].spec;
  std::set<std::string> seen;
  for (const auto& t : tasks) {
    const ModelSpec& s = t.spec;
    if (s.name != first.name || s.version != first.version || s.label != first.label)
      throw ServingError(Code::kInvalidArgument,
                         "All tasks of a MultiInference request must name the same model and version; task model '" +
                             s.name + "' differs from '" + first.name + "'");
    if (t.method_name != "tensorflow/serving/classify" && t.method_name != "tensorflow/serving/regress")
      throw ServingError(Code::kInvalidArgument,
                         "Unsupported signature method_name: '" + t.method_name +
                             "'; MultiInference runs tensorflow/serving/classify and tensorflow/serving/regress");
    const std::string sig = signature_or_default(t.signature_name);
    if (!seen.insert(sig).second)
      throw ServingError(Code::kInvalidArgument, "Duplicate evaluation of signature: " + sig);
  }
  return first;
}

std::vector<InferenceSignature> multi_inference_signatures(const ServableHandle& handle,
                                                           const std::vector<MultiInferenceTask>& tasks) {
  std::vector<InferenceSignature> out;
  for (const auto& t : tasks)
    out.push_back(inference_signature(
        handle.signatures(), signature_or_default(t.signature_name),
        t.method_name == "tensorflow/serving/classify" ? InferenceApi::kClassify : InferenceApi::kRegress));
  return out;
}

void run_multi_inference(ServerCore& core, const ServableHandlePtr& handle,
                         const std::vector<InferenceSignature>& signatures, std::vector<TensorMap> inputs,
                         Deadline deadline, MultiInferenceDone done) {
  struct Pending {
    std::mutex mu;
    size_t remaining = 0;  // guarded by mu, as the rest
    std::vector<TensorMap> outputs;
    std::exception_ptr error;
    RequestTiming timing;
    MultiInferenceDone done;
  };
  auto pending = std::make_shared<Pending>();
  pending->remaining = signatures.size();
  pending->outputs.resize(signatures.size());
  pending->done = std::move(done);
  for (size_t i = 0; i < signatures.size(); ++i) {
    core.predict_async(handle, signatures[i].name, std::move(inputs[i]), deadline,
                       [pending, i](std::exception_ptr error, TensorMap outputs, const RequestTiming& t) {
                         {
                           std::lock_guard<std::mutex> l(pending->mu);
                           if (error && !pending->error) pending->error = error;
                           pending->outputs[i] = std::move(outputs);
                           RequestTiming& all = pending->timing;
                           all.queue_us = std::max(all.queue_us, t.queue_us);
                           all.compute_us = std::max(all.compute_us, t.compute_us);
                           all.batch_size = std::max(all.batch_size, t.batch_size);
                           if (--pending->remaining > 0) return;
                         }
                         // The last task: nobody else touches `pending` now.
                         pending->done(pending->error, pending->outputs, pending->timing);
                       });
  }
}

void check_metadata_fields(const std::vector<std::string>& fields) {
  if (fields.empty())
    throw ServingError(Code::kInvalidArgument,
                       "GetModelMetadataRequest must specify at least one metadata_field (\"signature_def\")");
  for (auto& f : fields)
    if (f != "signature_def")
      throw ServingError(Code::kInvalidArgument, "Metadata field " + f + " is not supported; use \"signature_def\"");
}

std::string tf_dtype_name(const std::string& d) {
  static const std::map<std::string, std::string> m{
      {"float32", "DT_FLOAT"}, {"float64", "DT_DOUBLE"},    {"int32", "DT_INT32"},  {"int64", "DT_INT64"},
      {"uint8", "DT_UINT8"},   {"int8", "DT_INT8"},         {"int16", "DT_INT16"},  {"bool", "DT_BOOL"},
      {"float16", "DT_HALF"},  {"bfloat16", "DT_BFLOAT16"}, {"string", "DT_STRING"}};
  auto it = m.find(d);
  return it == m.end() ? "DT_INVALID" : it->second;
}

std::vector<std::pair<std::string, SignatureDef>> signature_defs(const Json& signatures) {
  auto tensors = [](const Json& sig, const char* side) {
    std::vector<std::pair<std::string, TensorInfo>> out;
    if (!sig.contains(side)) return out;
    for (auto& [name, spec] : sig[side].items()) {
      TensorInfo t;
      t.name = name + ":0";
      t.dtype = tf_dtype_name(spec.value("dtype", "float32"));
      if (spec.contains("shape"))
        for (auto& d : spec["shape"]) t.shape.push_back(d.is_null() ? -1 : d.get<int64_t>());
      out.emplace_back(name, std::move(t));
    }
    return out;
  };
  std::vector<std::pair<std::string, SignatureDef>> defs;
  for (auto& [name, sig] : signatures.items()) {
    SignatureDef def;
    // kiln's signature JSON holds the short name ("predict"); TF's the full one.
    def.method_name = sig.value("method_name", "predict");
    if (def.method_name.find('/') == std::string::npos) def.method_name = "tensorflow/serving/" + def.method_name;
    def.inputs = tensors(sig, "inputs");
    def.outputs = tensors(sig, "outputs");
    defs.emplace_back(name, std::move(def));
  }
  return defs;
}

Json metadata_json(const ServableHandle& h) {
  auto tensors = [](const std::vector<std::pair<std::string, TensorInfo>>& infos) {
    Json out = Json::object();
    for (auto& [name, t] : infos) {
      Json dims = Json::array();
      for (auto d : t.shape) dims.push_back(Json{{"size", std::to_string(d)}, {"name", ""}});
      out[name] =
          Json{{"dtype", t.dtype}, {"tensor_shape", {{"dim", dims}, {"unknown_rank", false}}}, {"name", t.name}};
    }
    return out;
  };
  Json defs = Json::object();
  for (auto& [name, def] : signature_defs(h.signatures()))
    defs[name] =
        Json{{"inputs", tensors(def.inputs)}, {"outputs", tensors(def.outputs)}, {"method_name", def.method_name}};
  return Json{{"model_spec", {{"name", h.model_name}, {"signature_name", ""}, {"version", std::to_string(h.version)}}},
              {"metadata", {{"signature_def", {{"signature_def", defs}}}}}};
}

Json status_json(const std::vector<VersionStatus>& versions) {
  Json list = Json::array();
  for (auto& s : versions) {
    bool err = s.state == VersionState::kError;
    list.push_back(Json{{"version", std::to_string(s.version)},
                        {"state", tfs_state_name(s.state)},
                        {"status", {{"error_code", err ? "UNKNOWN" : "OK"}, {"error_message", s.error}}}});
  }
  return Json{{"model_version_status", list}};
}

}  // namespace kiln::serving::tfs_v1
