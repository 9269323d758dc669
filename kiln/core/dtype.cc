#include "kiln/core/dtype.h"

#include <mutex>

#include "kiln/core/config_keys.h"
#include "kiln/core/error.h"
#include "kiln/core/json_limits.h"
#include "kiln/core/string_tensor.h"

namespace kiln {

at::ScalarType dtype_from_string(const std::string& n) {
  if (n == "float32") return at::kFloat;
  if (n == "float64") return at::kDouble;
  if (n == "float16") return at::kHalf;
  if (n == "bfloat16") return at::kBFloat16;
  if (n == "int8") return at::kChar;
  if (n == "uint8") return at::kByte;
  if (n == "int16") return at::kShort;
  if (n == "int32") return at::kInt;
  if (n == "int64") return at::kLong;
  if (n == "bool") return at::kBool;
  if (n == "string") return kStringDType;
  throw ValueError("unknown dtype '" + n +
                   "'; expected one of float32, float64, float16, bfloat16, int8, uint8, "
                   "int16, int32, int64, bool, string");
}

std::string dtype_to_string(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    case at::kChar:
      return "int8";
    case at::kByte:
      return "uint8";
    case at::kShort:
      return "int16";
    case at::kInt:
      return "int32";
    case at::kLong:
      return "int64";
    case at::kBool:
      return "bool";
    case kStringDType:
      return "string";
    default:
      return std::string(c10::toString(t));
  }
}

namespace {

const char* kKnownPolicies =
    "float32, mixed_float16, mixed_bfloat16, float16, bfloat16, float64, or a quantized policy "
    "'<int8|float8|int8_qat>_from_<one of those>' (set by model.quantize())";

bool known_mode(const std::string& m) { return m == "int8" || m == "float8" || m == "int8_qat"; }

}  // namespace

DTypePolicy::DTypePolicy(const std::string& name) : name_(name), source_(name) {
  std::string base = name;
  const auto from = name.find("_from_");
  if (from != std::string::npos) {
    mode_ = name.substr(0, from);
    base = name.substr(from + 6);
    if (!known_mode(mode_) || base.find("_from_") != std::string::npos)
      throw ValueError("unknown dtype policy '" + name + "'; expected " + kKnownPolicies);
    source_ = base;
  }
  if (base == "mixed_float16") {
    compute_ = at::kHalf;
    variable_ = at::kFloat;
  } else if (base == "mixed_bfloat16") {
    compute_ = at::kBFloat16;
    variable_ = at::kFloat;
  } else if (base == "float32" || base == "float64" || base == "float16" || base == "bfloat16") {
    compute_ = variable_ = dtype_from_string(base);
  } else {
    throw ValueError("unknown dtype policy '" + name + "'; expected " + kKnownPolicies);
  }
}

DTypePolicy DTypePolicy::quantized(const std::string& mode, bool static_inputs, int64_t amax_history_length) const {
  if (!known_mode(mode))
    throw ValueError("unknown quantization mode '" + mode + "'; kiln knows int8, float8 and int8_qat");
  DTypePolicy p(mode + "_from_" + source_);
  p.static_inputs_ = mode == "int8" && static_inputs;
  p.amax_history_length_ = amax_history_length;
  return p;
}

Json DTypePolicy::to_json() const {
  if (mode_.empty())
    return Json{{"module", "keras"},
                {"class_name", "DTypePolicy"},
                {"config", Json{{"name", name_}}},
                {"registered_name", nullptr}};
  Json config{{"name", name_}, {"mode", mode_}, {"source_name", source_}};
  std::string cls = "QuantizedDTypePolicy";
  if (mode_ == "float8") {
    cls = "QuantizedFloat8DTypePolicy";
    config["amax_history_length"] = amax_history_length_;
  }
  if (static_inputs_) config["activation_scheme"] = "static";
  return Json{{"module", "keras"}, {"class_name", cls}, {"config", config}, {"registered_name", nullptr}};
}

DTypePolicy DTypePolicy::from_json(const Json& d) {
  if (d.is_string()) return DTypePolicy(d.get<std::string>());
  if (!d.is_object() || !d.contains("config") || !d["config"].is_object())
    throw ValueError(
        "a dtype policy must be a name or {\"class_name\": \"DTypePolicy\", \"config\": {\"name\": ...}}. "
        "Received: " +
        json_excerpt(d));
  check_config_keys(d, {"module", "class_name", "config", "registered_name"}, "a layer's `dtype`");
  const std::string cls = d.value("class_name", "DTypePolicy");
  const Json& c = d["config"];
  if (cls == "DTypePolicy") {
    check_config_keys(c, {"name"}, "a layer's `dtype` config");
    if (!c.contains("name") || !c["name"].is_string())
      throw ValueError("a DTypePolicy's config needs a string `name`. Received: " + json_excerpt(d));
    DTypePolicy p(c["name"].get<std::string>());
    if (p.is_quantized())
      throw ValueError("quantized policy '" + p.name() +
                       "' must be a QuantizedDTypePolicy. Received: " + json_excerpt(d));
    return p;
  }
  if (cls != "QuantizedDTypePolicy" && cls != "QuantizedFloat8DTypePolicy")
    throw ValueError("unknown dtype policy class '" + cls +
                     "'; expected DTypePolicy, QuantizedDTypePolicy or QuantizedFloat8DTypePolicy");
  check_config_keys(c, {"name", "mode", "source_name", "amax_history_length", "activation_scheme"},
                    "a quantized dtype policy's config");
  std::string mode, source;
  if (c.contains("mode")) {
    mode = c["mode"].is_string() ? c["mode"].get<std::string>() : "";
    source =
        c.contains("source_name") && c["source_name"].is_string() ? c["source_name"].get<std::string>() : "float32";
  } else if (c.contains("name") && c["name"].is_string()) {
    DTypePolicy named(c["name"].get<std::string>());
    mode = named.quantization_mode();
    source = named.source_name();
  }
  if (mode.empty()) throw ValueError(cls + " needs a `mode` (int8, float8). Received: " + json_excerpt(d));
  int64_t length = 1024;
  if (c.contains("amax_history_length")) {
    if (!c["amax_history_length"].is_number_integer() || c["amax_history_length"].get<int64_t>() < 1)
      throw ValueError("amax_history_length must be an integer >= 1. Received: " + json_excerpt(d));
    length = c["amax_history_length"].get<int64_t>();
  }
  std::string scheme = c.value("activation_scheme", "dynamic");
  if (scheme != "dynamic" && scheme != "static")
    throw ValueError("activation_scheme must be 'dynamic' or 'static'. Received: '" + scheme + "'");
  return DTypePolicy(source).quantized(mode, scheme == "static", length);
}

namespace {
std::mutex g_policy_mu;
DTypePolicy& global_policy() {  // guarded by g_policy_mu
  static DTypePolicy p("float32");
  return p;
}
}  // namespace

void set_dtype_policy(const std::string& name) {
  DTypePolicy p(name);
  if (p.is_quantized())
    throw ValueError("set_dtype_policy: '" + name +
                     "' is a quantized policy; set a float policy and call model.quantize(\"" + p.quantization_mode() +
                     "\") after building the model");
  std::lock_guard<std::mutex> l(g_policy_mu);
  global_policy() = p;
}

DTypePolicy dtype_policy() {
  std::lock_guard<std::mutex> l(g_policy_mu);
  return global_policy();
}

}  // namespace kiln
