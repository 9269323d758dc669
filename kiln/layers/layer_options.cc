#include "kiln/layers/layer_options.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "kiln/core/error.h"
#include "kiln/layers/config_reader.h"

namespace kiln {

Json layer_base_config(const LayerOptions& o) {
  Json j = Json::object();
  if (!o.name.empty()) j["name"] = o.name;
  if (!o.trainable) j["trainable"] = false;
  if (!o.dtype.empty()) j["dtype"] = o.dtype;
  return j;
}

InitializerPtr InitializerArg::resolve(const std::string& owner, const char* key) const {
  if (init_) return init_;
  // ConfigReader knows Keras's aliases and words the error.
  const Json config{{key, name_}};  // outlives the reader, which borrows it
  ConfigReader r(config, owner);
  return r.initializer(key, name_);
}

namespace option_check {

void invalid(const std::string& owner, const char* key, const std::string& expected, const Json& received) {
  const Json config{{key, received}};
  ConfigReader(config, owner).invalid(key, expected);
}

int64_t positive(const std::string& owner, const char* key, int64_t v) {
  if (v < 1 || v > kMaxConfigDim) invalid(owner, key, "a positive integer up to " + std::to_string(kMaxConfigDim), v);
  return v;
}

std::vector<int64_t> tuple(const std::string& owner, const char* key, const std::vector<int64_t>& v, size_t n) {
  std::vector<int64_t> out = v.size() == 1 ? std::vector<int64_t>(n, v[0]) : v;
  bool ok = out.size() == n;
  for (auto x : out) ok = ok && x >= 1 && x <= kMaxConfigDim;
  if (!ok)
    invalid(owner, key,
            (n == 1 ? "a positive integer or a list of 1 positive integer"
                    : "a positive integer or a list of " + std::to_string(n) + " positive integers") +
                " (each up to " + std::to_string(kMaxConfigDim) + ")",
            v);
  return out;
}

std::string choice(const std::string& owner, const char* key, const std::string& v,
                   const std::vector<std::string>& choices) {
  std::string s = v;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return (char)std::tolower(c); });
  if (std::find(choices.begin(), choices.end(), s) == choices.end()) {
    std::string list;
    for (auto& c : choices) list += (list.empty() ? "" : ", ") + ("\"" + c + "\"");
    invalid(owner, key, "one of {" + list + "}", v);
  }
  return s;
}

std::string activation(const std::string& owner, const char* key, const std::string& v) {
  const Json config{{key, v}};
  ConfigReader r(config, owner);
  return r.activation(key, v);
}

double in_range(const std::string& owner, const char* key, double v, double lo, double hi, bool hi_inclusive) {
  const Json config{{key, v}};
  ConfigReader r(config, owner);
  return r.number_in(key, v, lo, hi, hi_inclusive);
}

}  // namespace option_check
}  // namespace kiln
