// JSON <-> tensors for TF Serving's REST predict API and KServe v2 infer,
// shared by the REST front end and warmup replay.
//
// Predict body: {"signature_name": "...", "instances": [...]} (row format:
// one entry per example; with several inputs each entry is {name: value})
// or {"inputs": value | {name: value}} (columnar, batch dim included).
// Values are nested lists of numbers (also true/false and the strings "NaN",
// "Infinity", "-Infinity", which parse_request_json makes of bare NaN, Inf
// and Infinity), or {"b64": "..."}: the base64 bytes as the little-endian raw
// buffer of one example of that input (e.g. 784 uint8 pixels, or 784*4
// bytes for float32). An input of dtype "string" takes strings (nested
// lists of them), each a JSON string or {"b64": "..."} for bytes (TF
// Serving's rule), as a string tensor: {"instances": ["some text", "more"]}.
// Errors: ServingError INVALID_ARGUMENT naming the input (for a string
// where a number belongs, and the reverse, the dtype wanted and received).
#pragma once

#include <cmath>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/json.h"
#include "kiln/core/tensor_json.h"
#include "kiln/serving/codec/inference.h"
#include "kiln/serving/core/servable.h"

namespace kiln::serving {

struct PredictCall {
  std::string signature_name = kDefaultSignature;
  TensorMap inputs;
  bool row_format = true;  // "instances" (answer "predictions") vs "inputs" (answer "outputs")
};

// `signatures`: Servable::signatures().
PredictCall decode_predict_request(const Json& body, const Json& signatures);
// {"predictions": [...]} or {"outputs": ...}. Its dump() writes NaN and
// infinities as null (JSON has no such numbers); the REST reply is
// predict_response_text. Outputs named in `string_outputs` (the signature's
// dtype "string" ones: string_tensor_names) are string tensors, written as
// JSON strings.
Json encode_predict_response(const TensorMap& outputs, bool row_format,
                             const std::set<std::string>& string_outputs = {});

// The fast path for the body nearly every client sends: an object holding
// "instances" or "inputs" as rectangular nested lists of plain numbers for a
// signature with one numeric input, and optionally "signature_name". Parsed
// without a DOM (simdjson On-Demand, rest_fast_path.cc). Returns false for
// anything else, and for every body the DOM path would refuse: the caller
// then uses parse_request_json + decode_predict_request, which accept every
// form (named instances, b64, bools, NaN/Infinity, ...) and word the errors.
// Where it returns true, `call` equals what decode_predict_request makes.
bool decode_predict_fast(std::string_view body, const Json& signatures, PredictCall* call);

// The response body as text: the values of encode_predict_response(...),
// written directly, with floats as TF Serving writes them
// (kTfServingDecimals: "1.0", "0.1", "1e+06"; NaN and infinities as bare
// NaN, Infinity, -Infinity, which are not JSON but TF Serving's clients read
// them, e.g. Python's json module).
std::string predict_response_text(const TensorMap& outputs, bool row_format,
                                  const std::set<std::string>& string_outputs = {});

// TF Serving's float text in REST replies (json_tensor.cc, WriteDecimal).
inline constexpr JsonWriteOptions kTfServingDecimals{.non_finite_literals = true, .tf_serving_decimals = true};

// The REST classify and regress replies: {"result": [[[label, score], ...],
// ...]} and {"result": [value, ...]}, floats as kTfServingDecimals.
std::string classify_result_text(const Classifications& c);
std::string regress_result_text(const std::vector<float>& values);

// The dtype of one input of a signature (its "dtype", float32 if absent).
at::ScalarType input_dtype(const Json& spec);

// A finite whole number (what an integral input accepts).
inline bool is_integer(double d) { return is_whole_number(d); }

// numbers_to_tensor, tensor_to_json and append_tensor_json: kiln/core/tensor_json.h.
// kiln::checked_numbers_to_tensor, as ServingError INVALID_ARGUMENT naming
// `where` (json_to_tensor's message).
at::Tensor checked_numbers_to_tensor(const std::vector<double>& data, const std::vector<int64_t>& shape,
                                     at::ScalarType dtype, const std::string& where);

// KServe v2 (Open Inference Protocol) infer body, decoded but not yet
// checked against a model: each input's name, datatype and shape as sent,
// and its data as row-major numbers (fast path) or the JSON value (DOM).
struct KServeInferInput {
  std::string name, datatype;
  std::vector<int64_t> shape;  // entries checked to be non-negative integers
  bool has_numbers = false;
  std::vector<double> numbers;  // when has_numbers
  Json data;                    // otherwise
};
struct KServeInferBody {
  std::vector<KServeInferInput> inputs;
  std::vector<std::string> outputs;  // requested output names; empty: all
  Json id;                           // null when absent
};
// DOM path; ServingError INVALID_ARGUMENT for a malformed body.
KServeInferBody decode_kserve_infer(const Json& body);
// Fast path (simdjson, rest_fast_path.cc): "inputs" of {"name", "shape",
// "datatype", "data": lists of plain numbers}, optional string "id" and
// "outputs" of {"name"}. False for anything else (parameters, strings,
// bad shapes, ...): decode_kserve_infer then decides and words the error.
bool decode_kserve_infer_fast(std::string_view body, KServeInferBody* out);

// One JSON value (nested lists; also "NaN", "Infinity", "-Infinity") ->
// tensor of `dtype`: kiln::json_to_tensor, as ServingError INVALID_ARGUMENT
// naming `where`. For kStringDType: strings (and {"b64"} objects) as a
// string tensor, kiln::json_to_string_tensor.
at::Tensor json_to_tensor(const Json& value, at::ScalarType dtype, const std::string& where);

// KServe v2 datatypes: "FP32" <-> at::kFloat, ... ValueError-free: nullopt if unknown.
// kserve_datatype(): kiln/serving/codec/tensor_proto.h (one mapping for REST and gRPC).
bool kserve_to_scalar_type(const std::string& datatype, at::ScalarType* out);

// Request JSON helpers shared with other front ends and tests. The depth
// scan is kiln::json_depth (kiln/core/json_limits.h), shared with every
// reader of untrusted JSON.
// Parses a request body: accepts NaN, Inf, Infinity (optionally with a
// leading '-') as numbers, as TF Serving's rapidjson kParseNanAndInfFlag
// does; ServingError INVALID_ARGUMENT on bad JSON or too deep.
Json parse_request_json(const std::string& body, int max_depth);

}  // namespace kiln::serving
