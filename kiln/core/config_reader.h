// config::Reader: reads and validates an object's config (a layer, loss,
// metric, optimizer...) with Keras's messages.
//
//   config::Reader r(config, "Huber", {"name", "reduction"});
//   delta_ = r.number("delta", 1.0);        // optional, with Keras's default
//   units_ = r.positive_int("units");       // required key
//   r.finish();                             // any key not read -> ValueError
//
// Every error names the owner, the key, what was expected and what was
// received ("Dense: received an invalid value for `units`, expected a
// positive integer. Received: units=0"), so a bad model.json or CLI flag is
// fixable without a debugger. The `base_keys` are read by the owner's base
// class itself and always accepted by finish().
//
// The kinds every folder shares live here; a folder adds its own kinds by
// deriving (kiln/layers/config_reader.h: initializers, regularizers,
// activations). option_check gives typed options the same messages.
//
// Not thread-safe (one reader per constructor call); borrows `config`.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "kiln/core/json.h"

namespace kiln {

// The largest size a config may give (2^24 = 16,777,216): above any real
// layer width or vocabulary, so a typo such as units=1e12 is named here
// instead of failing later as an allocation of terabytes.
inline constexpr int64_t kMaxConfigDim = int64_t(1) << 24;

namespace config {

class Reader {
 public:
  Reader(const Json& config, std::string owner, std::vector<std::string> base_keys = {});

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

  // Throws ValueError naming the first key that was never read and the keys
  // this owner accepts.
  void finish() const;

  // "Dense: received an invalid value for `units`, expected <expected>.
  // Received: units=<value>".
  [[noreturn]] void invalid(const char* key, const std::string& expected) const;
  const std::string& owner() const { return owner_; }

 private:
  const Json& config_;
  std::string owner_;
  std::vector<std::string> base_keys_;
  std::set<std::string> read_;
};

}  // namespace config

// An axis or a list of axes, written back in the form given.
using IntOrList = std::variant<int64_t, std::vector<int64_t>>;
Json int_or_list_json(const IntOrList& v);

// Checks of typed options, with config::Reader's messages
// ("Dense: received an invalid value for `units`, expected ... Received: units=0").
namespace option_check {
[[noreturn]] void invalid(const std::string& owner, const char* key, const std::string& expected, const Json& received);
// In [1, kMaxConfigDim].
int64_t positive(const std::string& owner, const char* key, int64_t v);
// One positive int for every axis, or `n` of them; returns `n` entries.
std::vector<int64_t> tuple(const std::string& owner, const char* key, const std::vector<int64_t>& v, size_t n);
// One of `choices`, case-insensitive; returned lower-case.
std::string choice(const std::string& owner, const char* key, const std::string& v,
                   const std::vector<std::string>& choices);
// lo <= v <= hi (< hi unless hi_inclusive).
double in_range(const std::string& owner, const char* key, double v, double lo, double hi, bool hi_inclusive = true);
}  // namespace option_check

}  // namespace kiln
