#include "kiln/layers/config_reader.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "kiln/core/config_keys.h"
#include "kiln/core/error.h"
#include "kiln/core/json_limits.h"
#include "kiln/layers/activations.h"

namespace kiln {
namespace {
const char* const kBaseKeys[] = {"name", "trainable", "dtype"};

bool is_int(const Json& j) {
  if (j.is_number_integer()) return true;
  // 3.0 written by a JSON writer that does not keep integers is still 3
  // (within int64's exact range: 1e30 would not convert).
  return j.is_number_float() && std::floor(j.get<double>()) == j.get<double>() && std::fabs(j.get<double>()) < 9e15;
}

// A size in [1, kMaxConfigDim] (checked as a double: no overflow), else 0.
int64_t size_of(const Json& j) {
  if (!is_int(j) || j.get<double>() < 1 || j.get<double>() > double(kMaxConfigDim)) return 0;
  return j.get<int64_t>();
}
}  // namespace

ConfigReader::ConfigReader(const Json& config, std::string owner) : config_(config), owner_(std::move(owner)) {
  if (!config_.is_object() && !config_.is_null())
    throw ValueError(owner_ + ": the config must be a JSON object. Received: " + json_excerpt(config_));
}

bool ConfigReader::has(const char* key) const {
  return config_.is_object() && config_.contains(key) && !config_.at(key).is_null();
}

const Json* ConfigReader::get(const char* key) {
  read_.insert(key);
  if (!has(key)) return nullptr;
  return &config_.at(key);
}

void ConfigReader::invalid(const char* key, const std::string& expected) const {
  std::string received = has(key) ? json_excerpt(config_.at(key)) : "None";
  throw ValueError(owner_ + ": received an invalid value for `" + key + "`, expected " + expected +
                   ". Received: " + key + "=" + received);
}

int64_t ConfigReader::positive_int(const char* key) {
  const Json* j = get(key);
  if (!j) throw ValueError(owner_ + ": the config is missing `" + key + "` (a positive integer)");
  // The bound catches a typo (units=1e12) before it becomes an allocation
  // of terabytes; no layer dimension comes near it.
  const int64_t v = size_of(*j);
  if (v == 0) invalid(key, "a positive integer up to " + std::to_string(kMaxConfigDim));
  return v;
}

int64_t ConfigReader::positive_int(const char* key, int64_t fallback) {
  if (!has(key)) {
    get(key);  // marks it read
    return fallback;
  }
  return positive_int(key);
}

int64_t ConfigReader::integer(const char* key, int64_t fallback) {
  const Json* j = get(key);
  if (!j) return fallback;
  if (!is_int(*j)) invalid(key, "an integer");
  return j->get<int64_t>();
}

double ConfigReader::number(const char* key, double fallback) {
  const Json* j = get(key);
  if (!j) return fallback;
  if (!j->is_number()) invalid(key, "a number");
  return j->get<double>();
}

double ConfigReader::number_in(const char* key, double fallback, double lo, double hi, bool hi_inclusive) {
  double v = number(key, fallback);
  if (v < lo || v > hi || (!hi_inclusive && v == hi) || std::isnan(v))
    invalid(key, "a float value between " + Json(lo).dump() + " and " + Json(hi).dump() +
                     (hi_inclusive ? "" : " (exclusive)"));
  return v;
}

bool ConfigReader::boolean(const char* key, bool fallback) {
  const Json* j = get(key);
  if (!j) return fallback;
  if (!j->is_boolean()) invalid(key, "a boolean");
  return j->get<bool>();
}

std::string ConfigReader::string(const char* key, const std::string& fallback) {
  const Json* j = get(key);
  if (!j) return fallback;
  if (!j->is_string()) invalid(key, "a string");
  return j->get<std::string>();
}

std::string ConfigReader::choice(const char* key, const std::string& fallback,
                                 const std::vector<std::string>& choices) {
  std::string v = string(key, fallback);
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return (char)std::tolower(c); });
  if (std::find(choices.begin(), choices.end(), v) == choices.end()) {
    std::string list;
    for (auto& c : choices) list += (list.empty() ? "" : ", ") + ("\"" + c + "\"");
    invalid(key, "one of {" + list + "}");
  }
  return v;
}

std::vector<int64_t> ConfigReader::int_tuple(const char* key, size_t n, const std::vector<int64_t>& fallback) {
  if (!has(key)) {
    get(key);  // marks it read
    return fallback;
  }
  return int_tuple(key, n);
}

std::vector<int64_t> ConfigReader::int_tuple(const char* key, size_t n) {
  const Json* j = get(key);
  if (!j) throw ValueError(owner_ + ": the config is missing `" + key + "`");
  const std::string expected =
      (n == 1 ? "a positive integer or a list of 1 positive integer"
              : "a positive integer or a list of " + std::to_string(n) + " positive integers") +
      " (each up to " + std::to_string(kMaxConfigDim) + ")";
  std::vector<int64_t> out;
  if (is_int(*j)) {
    out.assign(n, size_of(*j));
  } else if (j->is_array() && j->size() == n) {
    for (auto& e : *j) out.push_back(size_of(e));
  } else {
    invalid(key, expected);
  }
  for (auto v : out)
    if (v < 1) invalid(key, expected);
  return out;
}

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
    throw ValueError(owner_ + ": received an invalid value for `" + key + "`: " + e.what());
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
    throw ValueError(owner_ + ": received an invalid value for `" + key + "`: " + e.what());
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

void ConfigReader::finish() const {
  if (!config_.is_object()) return;
  std::vector<std::string> known(std::begin(kBaseKeys), std::end(kBaseKeys));
  known.insert(known.end(), read_.begin(), read_.end());
  check_config_keys(config_, known, owner_ + " config");
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
