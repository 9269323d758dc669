// HyperParameters: a search space and one point in it, with KerasTuner's
// semantics. A model-building function asks for a value by declaring the
// hyperparameter; the first call registers it (with its range) and returns
// the value the tuner assigned to this trial, or the default:
//
//   std::shared_ptr<Model> build(tuning::HyperParameters& hp) {
//     int64_t units = hp.Int("units", 16, 64, {.step = 16});
//     double lr = hp.Float("lr", 1e-4, 1e-2, {.sampling = Sampling::kLog});
//     std::string act = hp.Choice("activation", {"relu", "tanh"});
//     if (hp.Boolean("dropout")) {
//       auto scope = hp.conditional_scope("dropout", {true});
//       double rate = hp.Float("rate", 0.1, 0.5);   // active only when dropout
//     }
//     ...
//   }
//
// Kinds: Int and Float (min, max, step, sampling linear / log /
// reverse_log), Boolean, Choice (strings, integers or floats; ordered or
// not), Fixed. Conditions: a hyperparameter declared inside
// conditional_scope(parent, values) is active only when the parent's value
// is one of `values`; inactive ones are absent from values().
//
// Encoding for model-based search (the GP): every hyperparameter maps to
// unit-cube dimensions: Int/Float one dimension (log/reverse_log warped),
// Boolean one, an unordered Choice one dimension per value (one-hot, so
// categories are never treated as ordered numbers), an ordered Choice one
// dimension (its index), Fixed none. Inactive hyperparameters encode as 0.5
// (neutral) in every dimension.
//
// Thread safety: none; each trial has its own copy.
#pragma once

#include <initializer_list>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include "kiln/core/json.h"

namespace kiln::tuning {

// A hyperparameter value.
using Value = std::variant<bool, int64_t, double, std::string>;
std::string value_to_string(const Value& v);  // "32", "0.001", "adam", "True"
Json value_to_json(const Value& v);
Value value_from_json(const Json& j);

enum class Sampling { kLinear, kLog, kReverseLog };
std::string sampling_name(Sampling s);                 // "linear", "log", "reverse_log"
Sampling sampling_from_name(const std::string& name);  // ValueError otherwise

enum class HpKind { kInt, kFloat, kBoolean, kChoice, kFixed };

struct Condition {
  std::string parent;
  std::vector<Value> values;
};

// One dimension of the space.
struct HyperParameter {
  HpKind kind = HpKind::kFixed;
  std::string name;
  double min_value = 0, max_value = 0;
  std::optional<double> step;  // Int: default 1
  Sampling sampling = Sampling::kLinear;
  std::vector<Value> values;  // Choice
  bool ordered = false;       // Choice
  std::optional<Value> default_value;
  std::vector<Condition> conditions;

  std::string kind_name() const;  // "Int", "Float", "Boolean", "Choice", "Fixed"
  // Default: the given one, else Int/Float min_value, Boolean false, the
  // first choice, the fixed value.
  Value default_or_min() const;
  Value sample(std::mt19937_64& rng) const;
  // Number of unit-cube dimensions (see the header comment).
  int encoded_size() const;
  void encode(const Value& v, double* out) const;
  Value decode(const double* in) const;
  // Every value (Int with step, Boolean, Choice, Fixed); empty for a
  // continuous Float without step.
  std::vector<Value> grid() const;
  // KerasTuner's config dict: {"default", "conditions", "min_value", ...}.
  Json config() const;
  static HyperParameter from_json(const Json& j);  // {"type": "Int", "name", ...}
  Json to_json() const;
};

struct IntOptions {
  std::optional<int64_t> step;
  Sampling sampling = Sampling::kLinear;
  std::optional<int64_t> default_value;
};
struct FloatOptions {
  std::optional<double> step;
  Sampling sampling = Sampling::kLinear;
  std::optional<double> default_value;
};
struct ChoiceOptions {
  bool ordered = false;  // numeric choices default to ordered in KerasTuner; say so explicitly here
  std::optional<Value> default_value;
};

class HyperParameters {
 public:
  class Scope;

  // Declare-and-get. Re-declaring an existing name returns its value
  // (ValueError if the kind differs). ValueError for bad ranges
  // (min > max, log sampling with min <= 0, step <= 0).
  int64_t Int(const std::string& name, int64_t min_value, int64_t max_value, const IntOptions& o = {});
  double Float(const std::string& name, double min_value, double max_value, const FloatOptions& o = {});
  bool Boolean(const std::string& name, std::optional<bool> default_value = std::nullopt);
  std::string Choice(const std::string& name, const std::vector<std::string>& values, const ChoiceOptions& o = {});
  int64_t Choice(const std::string& name, const std::vector<int64_t>& values, const ChoiceOptions& o = {});
  double Choice(const std::string& name, const std::vector<double>& values, const ChoiceOptions& o = {});
  // Braced lists as written in Keras code: hp.Choice("activation", {"relu", "tanh"}),
  // hp.Choice("units", {32, 64}), hp.Choice("rate", {0.1, 0.2}). Without these a
  // list of two string literals is ambiguous (two `const char*` also make an
  // iterator range for std::vector<int64_t>/<double>).
  std::string Choice(const std::string& name, std::initializer_list<const char*> values, const ChoiceOptions& o = {});
  int64_t Choice(const std::string& name, std::initializer_list<int> values, const ChoiceOptions& o = {});
  double Choice(const std::string& name, std::initializer_list<double> values, const ChoiceOptions& o = {});
  Value Fixed(const std::string& name, const Value& value);

  // Hyperparameters declared while the returned object lives are active
  // only when `parent` has one of `values`. Scopes nest.
  [[nodiscard]] Scope conditional_scope(const std::string& parent, const std::vector<Value>& values);

  // Reading values.
  bool contains(const std::string& name) const;  // declared and active
  Value get(const std::string& name) const;      // NotFoundError if absent/inactive
  int64_t get_int(const std::string& name) const;
  double get_float(const std::string& name) const;  // Int values convert
  bool get_bool(const std::string& name) const;
  std::string get_string(const std::string& name) const;
  // Active values in declaration order.
  std::vector<std::pair<std::string, Value>> values() const;
  // Sets a value (the oracle's job); the name need not be declared yet.
  void set(const std::string& name, const Value& v);

  // The space.
  const std::vector<HyperParameter>& space() const { return space_; }
  const HyperParameter* find(const std::string& name) const;
  bool is_active(const HyperParameter& hp) const;
  // Adds the hyperparameters of `other`'s space that this one lacks.
  void merge_space(const HyperParameters& other);
  // A copy of the space with no values assigned (defaults apply).
  HyperParameters copy_space() const;

  // Encoding over the whole space (inactive → 0.5).
  int encoded_size() const;
  std::vector<double> encode() const;
  // Sets every value from an encoded point (conditions resolved in
  // declaration order).
  void decode(const std::vector<double>& x);
  // A key that identifies the active values (duplicate detection).
  std::string fingerprint() const;

  // {"space": [...], "values": {...}} and back; from_json also accepts a
  // bare list (the JSON search-space format of docs/TUNING.md).
  Json to_json() const;
  static HyperParameters from_json(const Json& j);

  class Scope {
   public:
    Scope(Scope&& o) noexcept : hp_(o.hp_) { o.hp_ = nullptr; }
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    friend class HyperParameters;
    explicit Scope(HyperParameters* hp) : hp_(hp) {}
    HyperParameters* hp_;
  };

 private:
  Value declare(HyperParameter hp);
  bool conditions_hold(const std::vector<Condition>& conditions) const;

  std::vector<HyperParameter> space_;
  std::map<std::string, Value> values_;
  std::vector<Condition> scope_stack_;
};

}  // namespace kiln::tuning
