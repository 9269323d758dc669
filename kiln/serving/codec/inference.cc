#include "kiln/serving/codec/inference.h"

#include <ATen/ATen.h>

#include "kiln/serving/status.h"

namespace kiln::serving {
namespace {

const char* method_of(InferenceApi api) { return api == InferenceApi::kClassify ? "classify" : "regress"; }

std::string shape_text(const at::Tensor& t) {
  std::string s = "(";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + (t.dim() == 1 ? ",)" : ")");
}

// The named output, else the signature's first one, else any.
const at::Tensor& pick(const InferenceSignature& s, const TensorMap& outputs, const char* name) {
  if (outputs.empty()) throw ServingError(Code::kInternal, "the model returned no outputs");
  if (auto it = outputs.find(name); it != outputs.end()) return it->second;
  if (auto it = outputs.find(s.first_output); it != outputs.end()) return it->second;
  return outputs.begin()->second;
}

}  // namespace

InferenceSignature inference_signature(const Json& signatures, const std::string& signature_name, InferenceApi api) {
  InferenceSignature s;
  s.api = api;
  s.name = signature_name.empty() ? std::string(kDefaultSignature) : signature_name;
  if (!signatures.is_object() || !signatures.contains(s.name)) {
    std::string known;
    if (signatures.is_object())
      for (auto& [k, v] : signatures.items()) known += (known.empty() ? "'" : ", '") + k + "'";
    throw ServingError(Code::kInvalidArgument, "Serving signature name: \"" + s.name +
                                                   "\" not found in signature def; the model has " +
                                                   (known.empty() ? "none" : known));
  }
  const Json& sig = signatures[s.name];
  // kiln's signature JSON holds the short name ("predict"); TF's the full one.
  std::string method = sig.value("method_name", std::string("predict"));
  if (method.find('/') == std::string::npos) method = "tensorflow/serving/" + method;
  const std::string want = std::string("tensorflow/serving/") + method_of(api);
  if (method != want && method != "tensorflow/serving/predict")
    throw ServingError(Code::kInvalidArgument, std::string("Expected ") +
                                                   (api == InferenceApi::kClassify ? "classification" : "regression") +
                                                   " signature method_name to be " + want + ". Was: " + method);
  if (sig.contains("inputs") && sig["inputs"].is_object())
    for (auto& [name, info] : sig["inputs"].items()) {
      InferenceInput in;
      in.name = name;
      in.dtype = info.value("dtype", std::string("float32"));
      if (info.contains("shape") && info["shape"].is_array())
        for (auto& d : info["shape"]) in.shape.push_back(d.is_null() ? -1 : d.get<int64_t>());
      if (!in.shape.empty()) in.shape.erase(in.shape.begin());  // the batch dimension
      s.inputs.push_back(std::move(in));
    }
  if (sig.contains("outputs") && sig["outputs"].is_object() && !sig["outputs"].empty())
    s.first_output = sig["outputs"].begin().key();
  return s;
}

Classifications classifications_of(const InferenceSignature& s, const TensorMap& outputs) {
  at::Tensor scores = pick(s, outputs, "scores");
  if (scores.dim() == 1) scores = scores.unsqueeze(1);
  if (scores.dim() != 2)
    throw ServingError(Code::kInvalidArgument,
                       "Classify needs scores of shape (batch, classes); the model's output is " + shape_text(scores));
  scores = scores.to(at::kFloat).contiguous();
  Classifications c;
  c.examples = scores.size(0);
  c.classes = scores.size(1);
  const float* p = scores.data_ptr<float>();
  c.scores.assign(p, p + scores.numel());
  if (auto it = outputs.find("classes"); it != outputs.end()) {
    at::Tensor classes = it->second;
    if (classes.dim() == 1) classes = classes.unsqueeze(1);
    if (classes.sizes() != scores.sizes())
      throw ServingError(Code::kInvalidArgument, "Classify: \"classes\" " + shape_text(classes) + " and \"scores\" " +
                                                     shape_text(scores) + " must have the same shape");
    classes = classes.to(at::kLong).contiguous();
    const int64_t* q = classes.data_ptr<int64_t>();
    c.labels.reserve(classes.numel());
    for (int64_t i = 0; i < classes.numel(); ++i) c.labels.push_back(std::to_string(q[i]));
  }
  return c;
}

std::vector<float> regressions_of(const InferenceSignature& s, const TensorMap& outputs) {
  at::Tensor y = pick(s, outputs, "outputs");
  if (y.dim() == 0 || y.numel() != y.size(0))
    throw ServingError(Code::kInvalidArgument,
                       "Regress needs one value per example (an output of shape (batch,) or (batch, 1)); the "
                       "model's is " +
                           shape_text(y));
  y = y.reshape({-1}).to(at::kFloat).contiguous();
  const float* p = y.data_ptr<float>();
  return std::vector<float>(p, p + y.numel());
}

}  // namespace kiln::serving
