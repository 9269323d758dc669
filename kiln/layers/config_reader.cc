#include "kiln/layers/config_reader.h"

#include "kiln/core/error.h"
#include "kiln/core/json_limits.h"
#include "kiln/layers/activations.h"

namespace kiln {

ConfigReader::ConfigReader(const Json& config, std::string owner)
    : config::Reader(config, std::move(owner), {"name", "trainable", "dtype"}) {}

InitializerPtr ConfigReader::initializer(const char* key, const std::string& fallback) {
  const Json* j = get(key);
  Json value = j ? *j : Json(fallback);
  if (value.is_string()) {
    // Keras's short aliases.
    if (value == "uniform") value = "random_uniform";
    if (value == "normal") value = "random_normal";
    if (value == "zero") value = "zeros";
    if (value == "one") value = "ones";
  }
  try {
    return Initializer::from_json(value);
  } catch (const ValueError& e) {
    throw ValueError(owner() + ": received an invalid value for `" + key + "`: " + e.what());
  } catch (const nlohmann::json::exception& e) {
    invalid(key, "an initializer name or {\"class_name\": ..., \"config\": ...}");
  }
}

RegularizerPtr ConfigReader::regularizer(const char* key) {
  const Json* j = get(key);
  if (!j) return nullptr;
  try {
    return Regularizer::from_json(*j);
  } catch (const ValueError& e) {
    throw ValueError(owner() + ": received an invalid value for `" + key + "`: " + e.what());
  } catch (const nlohmann::json::exception& e) {
    invalid(key, "a regularizer name or {\"class_name\": ..., \"config\": ...}");
  }
}

void ConfigReader::no_constraint(const char* key) {
  if (get(key)) invalid(key, "null (kiln does not support weight constraints yet)");
}

std::string ConfigReader::activation(const char* key, const std::string& fallback) {
  const Json* j = get(key);
  if (!j) return fallback;
  if (!j->is_string()) invalid(key, "an activation name");
  std::string name = j->get<std::string>();
  if (!is_activation(name)) {
    std::string known;
    for (auto& n : activation_names()) known += (known.empty() ? "" : ", ") + n;
    invalid(key, "one of the known activations (" + known + ")");
  }
  return name;
}

Json merged_config(const Json& extra, const Json& typed) {
  if (!extra.is_null() && !extra.is_object())
    throw ValueError("extra layer config must be a JSON object. Received: " + json_excerpt(extra));
  Json out = extra.is_object() ? extra : Json::object();
  for (auto it = typed.begin(); it != typed.end(); ++it) out[it.key()] = it.value();
  return out;
}

Json regularizer_json(const RegularizerPtr& r) { return r ? r->to_json() : Json(nullptr); }

Json int_list_json(const std::vector<int64_t>& v) {
  Json j = Json::array();
  for (auto x : v) j.push_back(x < 0 ? Json(nullptr) : Json(x));
  return j;
}

}  // namespace kiln
