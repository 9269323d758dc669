// ConfigReader: reads and validates a layer's config with Keras's messages.
//
//   ConfigReader r(config, "Dense");
//   units_ = r.positive_int("units");            // required key
//   use_bias_ = r.boolean("use_bias", true);     // optional, with Keras's default
//   r.finish();                                  // any key not read -> ValueError
//
// Every error names the layer, the key, what was expected and what was
// received ("Dense: received an invalid value for `units`, expected a
// positive integer. Received: units=0"), so a bad model.json or CLI flag is
// fixable without a debugger. The base keys (name, trainable, dtype) are read
// by Layer itself and always accepted.
//
// Not thread-safe (one reader per constructor call); borrows `config`.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kiln/core/initializers.h"
#include "kiln/core/json.h"
#include "kiln/layers/regularizers.h"

namespace kiln {

// The largest size a layer config may give (2^24 = 16,777,216): above any
// real layer width or vocabulary, so a typo such as units=1e12 is named
// here instead of failing later as an allocation of terabytes.
inline constexpr int64_t kMaxConfigDim = int64_t(1) << 24;

class ConfigReader {
 public:
  ConfigReader(const Json& config, std::string owner);

  // The value of `key` (marks it read), nullptr if absent or null.
  const Json* get(const char* key);
  bool has(const char* key) const;

  // A size (units, filters, input_dim...): an integer in [1, kMaxConfigDim].
  int64_t positive_int(const char* key);  // required
  int64_t positive_int(const char* key, int64_t fallback);
  int64_t integer(const char* key, int64_t fallback);
  double number(const char* key, double fallback);
  // fallback if absent; ValueError unless lo <= value <= hi (or < hi when
  // !hi_inclusive).
  double number_in(const char* key, double fallback, double lo, double hi, bool hi_inclusive = true);
  bool boolean(const char* key, bool fallback);
  std::string string(const char* key, const std::string& fallback);
  // One of `choices` (case-insensitive, returned lower-case).
  std::string choice(const char* key, const std::string& fallback, const std::vector<std::string>& choices);
  // An int or a list of `n` positive ints (Keras's kernel_size, strides...).
  std::vector<int64_t> int_tuple(const char* key, size_t n, const std::vector<int64_t>& fallback);
  // Required variant.
  std::vector<int64_t> int_tuple(const char* key, size_t n);
  // A name ("glorot_uniform"; "uniform"/"normal" are Keras aliases) or
  // {"class_name", "config"}.
  InitializerPtr initializer(const char* key, const std::string& fallback);
  RegularizerPtr regularizer(const char* key);  // nullptr if absent
  // kiln has no weight constraints yet: accepts only null/absent.
  void no_constraint(const char* key);
  // A known activation name (see activations.h); null means "linear".
  std::string activation(const char* key, const std::string& fallback);

  // Throws ValueError naming the first key that was never read and the keys
  // this layer accepts.
  void finish() const;

  // "Dense: received an invalid value for `units`, expected <expected>.
  // Received: units=<value>".
  [[noreturn]] void invalid(const char* key, const std::string& expected) const;
  const std::string& owner() const { return owner_; }

 private:
  const Json& config_;
  std::string owner_;
  std::set<std::string> read_;
};

// `extra` (an object, or null) with the `typed` keys set over it: how the
// typed C++ constructors turn their arguments into a config.
Json merged_config(const Json& extra, const Json& typed);

// Helpers for get_config(): JSON forms of optional members.
Json regularizer_json(const RegularizerPtr& r);
Json int_list_json(const std::vector<int64_t>& v);

}  // namespace kiln
