#include "kiln/core/config_reader.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "kiln/core/config_keys.h"
#include "kiln/core/error.h"
#include "kiln/core/json_limits.h"

namespace kiln {
namespace config {
namespace {
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

std::string tuple_expected(size_t n) {
  return (n == 1 ? "a positive integer or a list of 1 positive integer"
                 : "a positive integer or a list of " + std::to_string(n) + " positive integers") +
         " (each up to " + std::to_string(kMaxConfigDim) + ")";
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return (char)std::tolower(c); });
  return s;
}

std::string choices_expected(const std::vector<std::string>& choices) {
  std::string list;
  for (auto& c : choices) list += (list.empty() ? "" : ", ") + ("\"" + c + "\"");
  return "one of {" + list + "}";
}
}  // namespace

Reader::Reader(const Json& config, std::string owner, std::vector<std::string> base_keys)
    : config_(config), owner_(std::move(owner)), base_keys_(std::move(base_keys)) {
  if (!config_.is_object() && !config_.is_null())
    throw ValueError(owner_ + ": the config must be a JSON object. Received: " + json_excerpt(config_));
}

bool Reader::has(const char* key) const {
  return config_.is_object() && config_.contains(key) && !config_.at(key).is_null();
}

const Json* Reader::get(const char* key) {
  read_.insert(key);
  if (!has(key)) return nullptr;
  return &config_.at(key);
}

void Reader::invalid(const char* key, const std::string& expected) const {
  std::string received = has(key) ? json_excerpt(config_.at(key)) : "None";
  throw ValueError(owner_ + ": received an invalid value for `" + key + "`, expected " + expected +
                   ". Received: " + key + "=" + received);
}

int64_t Reader::positive_int(const char* key) {
  const Json* j = get(key);
  if (!j) throw ValueError(owner_ + ": the config is missing `" + key + "` (a positive integer)");
  // The bound catches a typo (units=1e12) before it becomes an allocation
  // of terabytes; no layer dimension comes near it.
  const int64_t v = size_of(*j);
  if (v == 0) invalid(key, "a positive integer up to " + std::to_string(kMaxConfigDim));
  return v;
}

int64_t Reader::positive_int(const char* key, int64_t fallback) {
  if (!has(key)) {
    get(key);  // marks it read
    return fallback;
  }
  return positive_int(key);
}

int64_t Reader::integer(const char* key, int64_t fallback) {
  const Json* j = get(key);
  if (!j) return fallback;
  if (!is_int(*j)) invalid(key, "an integer");
  return j->get<int64_t>();
}

double Reader::number(const char* key, double fallback) {
  const Json* j = get(key);
  if (!j) return fallback;
  if (!j->is_number()) invalid(key, "a number");
  return j->get<double>();
}

double Reader::number_in(const char* key, double fallback, double lo, double hi, bool hi_inclusive) {
  double v = number(key, fallback);
  if (v < lo || v > hi || (!hi_inclusive && v == hi) || std::isnan(v))
    invalid(key, "a float value between " + Json(lo).dump() + " and " + Json(hi).dump() +
                     (hi_inclusive ? "" : " (exclusive)"));
  return v;
}

bool Reader::boolean(const char* key, bool fallback) {
  const Json* j = get(key);
  if (!j) return fallback;
  if (!j->is_boolean()) invalid(key, "a boolean");
  return j->get<bool>();
}

std::string Reader::string(const char* key, const std::string& fallback) {
  const Json* j = get(key);
  if (!j) return fallback;
  if (!j->is_string()) invalid(key, "a string");
  return j->get<std::string>();
}

std::string Reader::choice(const char* key, const std::string& fallback, const std::vector<std::string>& choices) {
  std::string v = lower(string(key, fallback));
  if (std::find(choices.begin(), choices.end(), v) == choices.end()) invalid(key, choices_expected(choices));
  return v;
}

std::vector<int64_t> Reader::int_tuple(const char* key, size_t n, const std::vector<int64_t>& fallback) {
  if (!has(key)) {
    get(key);  // marks it read
    return fallback;
  }
  return int_tuple(key, n);
}

std::vector<int64_t> Reader::int_tuple(const char* key, size_t n) {
  const Json* j = get(key);
  if (!j) throw ValueError(owner_ + ": the config is missing `" + key + "`");
  std::vector<int64_t> out;
  if (is_int(*j)) {
    out.assign(n, size_of(*j));
  } else if (j->is_array() && j->size() == n) {
    for (auto& e : *j) out.push_back(size_of(e));
  } else {
    invalid(key, tuple_expected(n));
  }
  for (auto v : out)
    if (v < 1) invalid(key, tuple_expected(n));
  return out;
}

void Reader::finish() const {
  if (!config_.is_object()) return;
  std::vector<std::string> known = base_keys_;
  known.insert(known.end(), read_.begin(), read_.end());
  check_config_keys(config_, known, owner_ + " config");
}

}  // namespace config

Json int_or_list_json(const IntOrList& v) {
  return std::visit([](const auto& x) { return Json(x); }, v);
}

namespace option_check {

void invalid(const std::string& owner, const char* key, const std::string& expected, const Json& received) {
  const Json config{{key, received}};
  config::Reader(config, owner).invalid(key, expected);
}

int64_t positive(const std::string& owner, const char* key, int64_t v) {
  if (v < 1 || v > kMaxConfigDim) invalid(owner, key, "a positive integer up to " + std::to_string(kMaxConfigDim), v);
  return v;
}

std::vector<int64_t> tuple(const std::string& owner, const char* key, const std::vector<int64_t>& v, size_t n) {
  std::vector<int64_t> out = v.size() == 1 ? std::vector<int64_t>(n, v[0]) : v;
  bool ok = out.size() == n;
  for (auto x : out) ok = ok && x >= 1 && x <= kMaxConfigDim;
  if (!ok) invalid(owner, key, config::tuple_expected(n), v);
  return out;
}

std::string choice(const std::string& owner, const char* key, const std::string& v,
                   const std::vector<std::string>& choices) {
  std::string s = config::lower(v);
  if (std::find(choices.begin(), choices.end(), s) == choices.end())
    invalid(owner, key, config::choices_expected(choices), v);
  return s;
}

double in_range(const std::string& owner, const char* key, double v, double lo, double hi, bool hi_inclusive) {
  const Json config{{key, v}};
  config::Reader r(config, owner);
  return r.number_in(key, v, lo, hi, hi_inclusive);
}

}  // namespace option_check
}  // namespace kiln
