#include "kiln/serving/codec/rest_codec.h"

#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kiln/core/base64.h"
#include "kiln/core/dtype.h"
#include "kiln/core/json_limits.h"
#include "kiln/core/string_tensor.h"
#include "kiln/core/tensor_json.h"
#include "kiln/serving/status.h"

namespace kiln::serving {
namespace {

[[noreturn]] void bad(const std::string& m) { throw ServingError(Code::kInvalidArgument, m); }

bool is_b64(const Json& v) { return is_b64_object(v); }

at::Tensor b64_tensor(const Json& v, at::ScalarType dtype, const Json& spec, const std::string& where) {
  if (!v["b64"].is_string()) bad(where + ": \"b64\" must be a string");
  std::string bytes;
  try {
    bytes = base64_decode(v["b64"].get<std::string>());
  } catch (const ValueError& e) {
    bad(where + ": " + e.what());
  }
  int64_t es = (int64_t)c10::elementSize(dtype);
  if ((int64_t)bytes.size() % es)
    bad(where + ": " + std::to_string(bytes.size()) + " base64 bytes are not a whole number of " +
        dtype_to_string(dtype) + " values");
  auto t = at::empty({(int64_t)bytes.size() / es}, at::TensorOptions().dtype(dtype));
  if (!bytes.empty()) std::memcpy(t.data_ptr(), bytes.data(), bytes.size());  // an empty tensor may have no storage
  // One example: reshape to the signature's shape without the batch dim when fully known.
  if (spec.is_object() && spec.contains("shape")) {
    std::vector<int64_t> dims;
    const Json& s = spec["shape"];
    for (size_t i = 1; i < s.size(); ++i) {
      if (s[i].is_null() || s[i].get<int64_t>() < 0) return t;
      dims.push_back(s[i].get<int64_t>());
    }
    int64_t n = 1;
    for (auto d : dims) n *= d;
    if (n != t.numel())
      bad(where + ": the base64 value holds " + std::to_string(t.numel()) + " values; one example of this input has " +
          std::to_string(n));
    t = t.reshape(dims);
  }
  return t;
}

const Json& signature_of(const Json& signatures, const std::string& name) {
  if (!signatures.contains(name)) {
    std::string known;
    for (auto& [k, v] : signatures.items()) known += (known.empty() ? "" : ", ") + k;
    bad("Serving signature name: \"" + name + "\" not found in signature def. Known: " + known);
  }
  return signatures[name];
}

// The core codec's ValueError, as the REST API reports it.
template <class F>
auto as_invalid_argument(F&& f) {
  try {
    return f();
  } catch (const ValueError& e) {
    bad(e.what());
  }
}

}  // namespace

at::ScalarType input_dtype(const Json& spec) {
  return spec.contains("dtype") ? dtype_from_string(spec["dtype"].get<std::string>()) : at::kFloat;
}

at::Tensor json_to_tensor(const Json& value, at::ScalarType dtype, const std::string& where) {
  if (is_string_dtype(dtype)) return as_invalid_argument([&] { return json_to_string_tensor(value, where); });
  return as_invalid_argument([&] {
    const JsonNumberOptions o{.special_float_strings = true};
    refuse_strings(value, dtype, where, o);
    return kiln::json_to_tensor(value, dtype, where, o);
  });
}

at::Tensor checked_numbers_to_tensor(const std::vector<double>& data, const std::vector<int64_t>& shape,
                                     at::ScalarType dtype, const std::string& where) {
  return as_invalid_argument([&] { return kiln::checked_numbers_to_tensor(data, shape, dtype, where); });
}

namespace {

// The Open Inference Protocol's "parameters": an object when present. The
// binary tensor data extension (Triton's, which KServe clients use) is
// refused by name: kiln reads and writes tensor data as JSON only, and
// answering JSON to a client that asked for binary would be misread.
const Json* kserve_parameters(const Json& owner, const std::string& where) {
  if (!owner.contains("parameters")) return nullptr;
  const Json& p = owner["parameters"];
  if (!p.is_object()) bad(where + ": \"parameters\" must be an object");
  return &p;
}

void refuse_binary(const Json* params, const char* key, const std::string& where) {
  if (!params || !params->contains(key)) return;
  const Json& v = (*params)[key];
  if (v.is_boolean() && !v.get<bool>()) return;  // "binary_data": false asks for JSON
  bad(where + ": parameter \"" + key +
      "\" asks for the binary tensor data extension, which kiln does not support; send and request tensor data "
      "as JSON \"data\"");
}

}  // namespace

KServeInferBody decode_kserve_infer(const Json& body) {
  if (!body.is_object() || !body.contains("inputs") || !body["inputs"].is_array())
    bad("the infer request must be an object with an \"inputs\" list");
  KServeInferBody b;
  if (body.contains("id")) {
    if (!body["id"].is_string()) bad("\"id\" must be a string");
    b.id = body["id"];
  }
  const Json* params = kserve_parameters(body, "the infer request");
  refuse_binary(params, "binary_data_output", "the infer request");
  for (auto& in : body["inputs"]) {
    if (in.is_object() && in.contains("name") && in["name"].is_string()) {
      const std::string where = "input \"" + in["name"].get<std::string>() + "\"";
      refuse_binary(kserve_parameters(in, where), "binary_data_size", where);
    }
    if (!in.is_object() || !in.contains("name") || !in["name"].is_string() || !in.contains("shape") ||
        !in["shape"].is_array() || !in.contains("datatype") || !in["datatype"].is_string() || !in.contains("data"))
      bad("each input needs \"name\", \"shape\", \"datatype\" and \"data\"");
    KServeInferInput x;
    x.name = in["name"].get<std::string>();
    x.datatype = in["datatype"].get<std::string>();
    for (auto& d : in["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0)
        bad("input \"" + x.name + "\": shape entries must be non-negative integers");
      x.shape.push_back(d.get<int64_t>());
    }
    x.data = in["data"];
    b.inputs.push_back(std::move(x));
  }
  if (body.contains("outputs")) {
    if (!body["outputs"].is_array()) bad("\"outputs\" must be a list of {\"name\": ...} objects");
    for (auto& o : body["outputs"]) {
      if (!o.is_object() || !o.contains("name") || !o["name"].is_string())
        bad("each entry of \"outputs\" must be an object with a string \"name\"");
      const std::string where = "output \"" + o["name"].get<std::string>() + "\"";
      const Json* op = kserve_parameters(o, where);
      refuse_binary(op, "binary_data", where);
      if (op && op->contains("classification"))
        bad(where +
            ": parameter \"classification\" (the classification extension) is not supported; request the "
            "output's scores and rank them in the client");
      b.outputs.push_back(o["name"].get<std::string>());
    }
  }
  return b;
}

PredictCall decode_predict_request(const Json& body, const Json& signatures) {
  if (!body.is_object()) bad("the request body must be a JSON object with \"instances\" or \"inputs\"");
  PredictCall call;
  if (body.contains("signature_name")) {
    if (!body["signature_name"].is_string()) bad("\"signature_name\" must be a string");
    call.signature_name = body["signature_name"].get<std::string>();
    if (call.signature_name.empty()) call.signature_name = kDefaultSignature;
  }
  const Json& sig = signature_of(signatures, call.signature_name);
  const Json& in_specs = sig["inputs"];
  std::vector<std::string> names;
  for (auto& [k, v] : in_specs.items()) names.push_back(k);
  bool has_inst = body.contains("instances"), has_cols = body.contains("inputs");
  if (has_inst == has_cols)
    bad("the request body must hold exactly one of \"instances\" (row format) or \"inputs\" (columnar format)");
  if (has_inst) {
    const Json& inst = body["instances"];
    if (!inst.is_array()) bad("\"instances\" must be a list with one entry per example");
    if (inst.empty()) bad("\"instances\" is empty");
    bool named = inst[0].is_object() && !is_b64(inst[0]);
    if (!named && names.size() != 1)
      bad("this signature has " + std::to_string(names.size()) +
          " inputs; each instance must be an object naming them: {\"" + (names.empty() ? "" : names[0]) + "\": ...}");
    for (auto& name : names) {
      const Json& spec = in_specs[name];
      auto dtype = input_dtype(spec);
      std::vector<at::Tensor> rows;
      rows.reserve(inst.size());
      bool all_plain = true;
      for (size_t i = 0; i < inst.size(); ++i) {
        const Json* v = &inst[i];
        std::string where = "instances[" + std::to_string(i) + "]";
        if (named) {
          if (!v->is_object() || is_b64(*v)) bad(where + " must be an object like instances[0]");
          if (!v->contains(name)) bad(where + " is missing input \"" + name + "\"");
          v = &(*v)[name];
          where += "." + name;
        } else if (v->is_object() && !is_b64(*v)) {
          bad(where + " must be a value like instances[0]");
        }
        if (is_b64(*v) && !is_string_dtype(dtype)) {
          all_plain = false;
          rows.push_back(b64_tensor(*v, dtype, spec, where));
        } else {
          rows.push_back(json_to_tensor(*v, dtype, where));  // a string input's b64 is its bytes
        }
      }
      const bool strs = is_string_dtype(dtype);  // rows differ in width, not in logical shape
      for (size_t i = 1; i < rows.size(); ++i)
        if (strs ? strings::logical_shape(rows[i]) != strings::logical_shape(rows[0])
                 : rows[i].sizes() != rows[0].sizes())
          bad("instances disagree on the shape of \"" + name + "\": instances[0] vs instances[" + std::to_string(i) +
              "]");
      (void)all_plain;
      call.inputs[name] = strs ? strings::stack(rows) : at::stack(rows, 0);
    }
    if (named)
      for (auto& [k, v] : inst[0].items())
        if (!in_specs.contains(k)) bad("instances[0] names an unknown input \"" + k + "\"");
  } else {
    call.row_format = false;
    const Json& cols = body["inputs"];
    bool named = cols.is_object() && !is_b64(cols);
    if (!named && names.size() != 1)
      bad("this signature has " + std::to_string(names.size()) + " inputs; \"inputs\" must be an object naming them");
    if (named)
      for (auto& [k, v] : cols.items())
        if (!in_specs.contains(k)) bad("\"inputs\" names an unknown input \"" + k + "\"");
    for (auto& name : names) {
      if (named && !cols.contains(name)) bad("\"inputs\" is missing input \"" + name + "\"");
      const Json& v = named ? cols[name] : cols;
      auto dtype = input_dtype(in_specs[name]);
      std::string where = "inputs." + name;
      if (v.is_array() && !v.empty() && is_b64(v[0]) && !is_string_dtype(dtype)) {
        std::vector<at::Tensor> rows;
        for (size_t i = 0; i < v.size(); ++i)
          rows.push_back(b64_tensor(v[i], dtype, in_specs[name], where + "[" + std::to_string(i) + "]"));
        for (size_t i = 1; i < rows.size(); ++i)
          if (rows[i].sizes() != rows[0].sizes()) bad(where + ": base64 values differ in size");
        call.inputs[name] = at::stack(rows, 0);
      } else {
        call.inputs[name] = json_to_tensor(v, dtype, where);
      }
    }
  }
  return call;
}

Json encode_predict_response(const TensorMap& outputs, bool row_format, const std::set<std::string>& string_outputs) {
  auto to_json = [&](const std::string& name, const at::Tensor& t) {
    return string_outputs.count(name) ? string_tensor_to_json(t) : tensor_to_json(t);
  };
  if (!row_format) {
    if (outputs.size() == 1) return Json{{"outputs", to_json(outputs.begin()->first, outputs.begin()->second)}};
    Json o = Json::object();
    for (auto& [k, v] : outputs) o[k] = to_json(k, v);
    return Json{{"outputs", o}};
  }
  if (outputs.size() == 1) return Json{{"predictions", to_json(outputs.begin()->first, outputs.begin()->second)}};
  int64_t n = outputs.begin()->second.dim() ? outputs.begin()->second.size(0) : 1;
  std::map<std::string, Json> cols;
  for (auto& [k, v] : outputs) cols[k] = to_json(k, v);
  Json preds = Json::array();
  for (int64_t i = 0; i < n; ++i) {
    Json row = Json::object();
    for (auto& [k, c] : cols) row[k] = c.is_array() && i < (int64_t)c.size() ? c[i] : c;
    preds.push_back(std::move(row));
  }
  return Json{{"predictions", preds}};
}

namespace {
// A JSON string (invalid UTF-8 replaced, as every kiln reply does).
void append_json_string(std::string& out, const std::string& s) {
  out += Json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}
}  // namespace

std::string classify_result_text(const Classifications& c) {
  std::string out = "{\"result\":[";
  for (int64_t i = 0; i < c.examples; ++i) {
    out += i ? ",[" : "[";
    for (int64_t k = 0; k < c.classes; ++k) {
      out += k ? ",[" : "[";
      append_json_string(out, c.label(i, k));
      out += ',';
      append_json_number(out, c.score(i, k), kTfServingDecimals);
      out += ']';
    }
    out += ']';
  }
  return out + "]}";
}

std::string regress_result_text(const std::vector<float>& values) {
  std::string out = "{\"result\":[";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) out += ',';
    append_json_number(out, values[i], kTfServingDecimals);
  }
  return out + "]}";
}

std::string predict_response_text(const TensorMap& outputs, bool row_format,
                                  const std::set<std::string>& string_outputs) {
  const JsonWriteOptions o = kTfServingDecimals;
  auto append_tensor_json = [&](std::string& out, const at::Tensor& t, JsonWriteOptions options,
                                const std::string& name) {
    if (string_outputs.count(name))
      out += string_tensor_to_json(t).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    else
      kiln::append_tensor_json(out, t, options);
  };
  std::string out = row_format ? "{\"predictions\":" : "{\"outputs\":";
  size_t numel = 0;
  for (auto& [k, v] : outputs) numel += (size_t)v.numel();
  out.reserve(out.size() + 16 * numel + 8);
  auto key = [&](const std::string& name) {
    append_json_string(out, name);
    out += ':';
  };
  if (outputs.size() == 1) {
    append_tensor_json(out, outputs.begin()->second, o, outputs.begin()->first);
  } else if (!row_format) {
    out += '{';
    for (auto it = outputs.begin(); it != outputs.end(); ++it) {
      if (it != outputs.begin()) out += ',';
      key(it->first);
      append_tensor_json(out, it->second, o, it->first);
    }
    out += '}';
  } else {
    // One object per example: {name: that output's row i}, as
    // encode_predict_response (an output without row i is written whole).
    const int64_t n = outputs.begin()->second.dim() ? outputs.begin()->second.size(0) : 1;
    out += '[';
    for (int64_t i = 0; i < n; ++i) {
      if (i) out += ',';
      out += '{';
      for (auto it = outputs.begin(); it != outputs.end(); ++it) {
        if (it != outputs.begin()) out += ',';
        key(it->first);
        const at::Tensor& t = it->second;
        append_tensor_json(out, t.dim() && i < t.size(0) ? t[i] : t, o, it->first);
      }
      out += '}';
    }
    out += ']';
  }
  out += '}';
  return out;
}

bool kserve_to_scalar_type(const std::string& d, at::ScalarType* out) {
  static const std::map<std::string, at::ScalarType> m{
      {"BOOL", at::kBool},  {"UINT8", at::kByte}, {"INT8", at::kChar},  {"INT16", at::kShort}, {"INT32", at::kInt},
      {"INT64", at::kLong}, {"FP16", at::kHalf},  {"FP32", at::kFloat}, {"FP64", at::kDouble}, {"BF16", at::kBFloat16}};
  auto it = m.find(d);
  if (it == m.end()) return false;
  *out = it->second;
  return true;
}

Json parse_request_json(const std::string& body, int max_depth) {
  if (json_depth(body, max_depth) > max_depth)
    throw ServingError(Code::kInvalidArgument,
                       "JSON nesting deeper than " + std::to_string(max_depth) + " levels is not accepted");
  // TF Serving parses with rapidjson's kParseNanAndInfFlag, which takes bare
  // NaN, Inf and Infinity, each optionally signed with '-': turn them into
  // the strings the tensor codec reads as numbers (outside strings no valid
  // JSON token starts with N or I, so this cannot change a valid document).
  std::string text;
  bool rewritten = false, in_str = false;
  for (size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (in_str) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_str = false;
      continue;
    }
    if (c == '"')
      in_str = true;
    else if (c == 'N' || c == 'I' || (c == '-' && i + 1 < body.size() && (body[i + 1] == 'I' || body[i + 1] == 'N'))) {
      rewritten = true;
      break;
    }
  }
  if (rewritten) {
    text.reserve(body.size() + 16);
    bool s = false;
    for (size_t i = 0; i < body.size(); ++i) {
      char c = body[i];
      if (s) {
        text += c;
        if (c == '\\' && i + 1 < body.size())
          text += body[++i];
        else if (c == '"')
          s = false;
        continue;
      }
      if (c == '"') {
        s = true;
        text += c;
        continue;
      }
      auto at = [&](const char* w) { return body.compare(i, std::strlen(w), w) == 0; };
      if (c == 'N' && at("NaN"))
        text += "\"NaN\"", i += 2;
      else if (c == 'I' && at("Infinity"))
        text += "\"Infinity\"", i += 7;
      else if (c == 'I' && at("Inf"))
        text += "\"Infinity\"", i += 2;
      else if (c == '-' && at("-Infinity"))
        text += "\"-Infinity\"", i += 8;
      else if (c == '-' && at("-Inf"))
        text += "\"-Infinity\"", i += 3;
      else if (c == '-' && at("-NaN"))  // rapidjson drops the sign of a NaN
        text += "\"NaN\"", i += 3;
      else
        text += c;
    }
  }
  const std::string* src = rewritten ? &text : &body;
  Json j = Json::parse(*src, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    // Re-parse with exceptions for the position in the message.
    try {
      Json again = Json::parse(*src);
      (void)again;
    } catch (const nlohmann::json::exception& e) {
      throw ServingError(Code::kInvalidArgument, std::string("JSON Parse error: ") + e.what());
    }
    throw ServingError(Code::kInvalidArgument, "JSON Parse error");
  }
  return j;
}

}  // namespace kiln::serving
