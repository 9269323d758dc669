// Classify and Regress (TF Serving's ClassificationService and
// RegressionService): one implementation under the REST and gRPC front ends,
// so both accept the same signatures, read the same outputs and answer with
// the same errors. Each front end only decodes its examples into a
// TensorMap (REST: JSON "examples" + "context"; gRPC: tf.Example protos via
// example_input.h) and encodes the result.
//
//   InferenceSignature s = inference_signature(h->signatures(), req_sig, InferenceApi::kClassify);
//   TensorMap inputs = ...decode examples for s.inputs...;
//   core.predict_async(h, s.name, inputs, deadline, [=](auto err, TensorMap out, auto& t) {
//     Classifications c = classifications_of(s, out);   // may throw ServingError
//     ...encode c.label(i, k), c.score(i, k)...
//   });
//
// Signatures: method_name tensorflow/serving/classify (or regress) as TF
// Serving requires, and also tensorflow/serving/predict, which every kiln
// model exports (kiln's extension: TF Serving refuses those). A signature of
// the other inference method is refused with TF Serving's message.
// Outputs (TF Serving's names first): classify reads "scores" and optional
// "classes" (labels), else the signature's first output as scores of shape
// (batch, classes) labelled "0", "1", ...; regress reads "outputs", else the
// first output, of shape (batch,) or (batch, 1).
// Errors: ServingError INVALID_ARGUMENT naming the signature or the shape.
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/core/json.h"
#include "kiln/core/shape.h"
#include "kiln/serving/core/servable.h"

namespace kiln::serving {

enum class InferenceApi { kClassify, kRegress };

struct InferenceInput {
  std::string name;
  std::string dtype;  // kiln dtype name, e.g. "float32"
  Shape shape;        // without the batch dimension
};

struct InferenceSignature {
  InferenceApi api = InferenceApi::kClassify;
  std::string name;                    // resolved ("" -> serving_default)
  std::vector<InferenceInput> inputs;  // signature order
  std::string first_output;            // the signature's first output ("" if it lists none)
};

// Resolves and checks the signature for `api`.
InferenceSignature inference_signature(const Json& signatures, const std::string& signature_name, InferenceApi api);

// examples x classes, row-major.
struct Classifications {
  int64_t examples = 0, classes = 0;
  std::vector<std::string> labels;  // empty: the class index is the label
  std::vector<float> scores;
  std::string label(int64_t i, int64_t k) const {
    return labels.empty() ? std::to_string(k) : labels[static_cast<size_t>(i * classes + k)];
  }
  float score(int64_t i, int64_t k) const { return scores[static_cast<size_t>(i * classes + k)]; }
};

Classifications classifications_of(const InferenceSignature& signature, const TensorMap& outputs);
std::vector<float> regressions_of(const InferenceSignature& signature, const TensorMap& outputs);

}  // namespace kiln::serving
