// Field tables: a layer's config keys declared once, next to its Options
// struct, instead of four times (struct, members, options_from_config,
// get_config). One table gives the JSON reader (ConfigReader's checks and
// messages, unknown keys refused), the checks of typed options, and the
// config's keys in get_config(), in table order (Json keeps insertion order,
// so the order of the table is the order of the saved config).
//
//   const FieldTable<DenseOptions>& dense_fields() {
//     static const FieldTable<DenseOptions> t = {
//         field("units", &DenseOptions::units).positive().required(),
//         field("activation", &DenseOptions::activation).activation(),
//         field("use_bias", &DenseOptions::use_bias)};
//     return t;
//   }
//   DenseOptions o = read_fields(config, "Dense", dense_fields());  // JSON -> options
//   check_fields("Dense", o, dense_fields());  // typed options: same checks, normalized in place
//   write_fields(j, o, dense_fields());        // options -> the config's keys
//
// A field's default is the Options struct's member initializer. After
// check_fields, strings of a choice are lower-case, tuples have one entry per
// axis and initializers are resolved (InitializerArg::resolved()), so the
// checked struct is the layer's state and writes its config directly.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/core/json.h"
#include "kiln/layers/config_reader.h"
#include "kiln/layers/layer_options.h"

namespace kiln {

// An axis or a list of axes, written back in the form given.
using IntOrList = std::variant<int64_t, std::vector<int64_t>>;
inline Json int_or_list_json(const IntOrList& v) {
  return std::visit([](const auto& x) { return Json(x); }, v);
}

// One config key of Options struct O, type-erased.
template <class O>
struct FieldDef {
  const char* key;
  std::function<void(ConfigReader&, O&)> read;              // reads and checks the key
  std::function<void(const std::string& owner, O&)> check;  // empty: nothing to check
  std::function<void(Json&, const O&)> write;               // sets j[key] (or leaves it out)
};
template <class O>
using FieldTable = std::vector<FieldDef<O>>;

// A field bound to member `T O::*`; the kind of value comes from T and the
// modifiers below. Converts to FieldDef<O>.
template <class O, class T>
class Field {
 public:
  Field(const char* key, T O::*member) : key_(key), member_(member) {}

  // int64_t: a size in [1, kMaxConfigDim].
  Field& positive() { return positive_ = true, *this; }
  // int64_t sizes and tuples: absent is an error.
  Field& required() { return required_ = true, *this; }
  // Any other kind: absent is "the config is missing `key` (<what>)".
  Field& required(std::string what) { return missing_ = std::move(what), *this; }
  // std::vector<int64_t>: one positive int for every one of `n` axes, or one per axis.
  Field& tuple(size_t n) { return tuple_ = n, *this; }
  // std::string: one of `choices`, case-insensitive, kept lower-case.
  Field& choice(std::vector<std::string> choices) { return choices_ = std::move(choices), *this; }
  // std::string: a known activation name.
  Field& activation() { return activation_ = true, *this; }
  // double: lo <= v <= hi (< hi unless hi_inclusive).
  Field& in_range(double lo, double hi, bool hi_inclusive = true) {
    range_ = std::make_pair(lo, hi);
    hi_inclusive_ = hi_inclusive;
    return *this;
  }
  // Any value (the inner value of an optional): `ok(v)` or "received an
  // invalid value for `key`, expected <expected>".
  template <class P>
  Field& where(P ok, std::string expected) {
    ok_ = std::move(ok);
    expected_ = std::move(expected);
    return *this;
  }
  // IntOrList: what the error says a bad value should be.
  Field& described(std::string expected) { return expected_ = std::move(expected), *this; }
  // std::optional / RegularizerPtr: unset is left out of the config instead
  // of written as null.
  Field& omit_if_unset() { return omit_if_unset_ = true, *this; }

  operator FieldDef<O>() const {  // NOLINT(google-explicit-constructor)
    const Field f = *this;
    return FieldDef<O>{key_, [f](ConfigReader& r, O& o) { f.read(r, o.*f.member_); },
                       [f](const std::string& owner, O& o) { f.check(owner, o.*f.member_); },
                       [f](Json& j, const O& o) { f.write(j, o.*f.member_); }};
  }

 private:
  template <class>
  struct is_optional : std::false_type {};
  template <class U>
  struct is_optional<std::optional<U>> : std::true_type {};
  using Inner = typename std::conditional_t<is_optional<T>::value, T, std::optional<T>>::value_type;

  void read(ConfigReader& r, T& v) const {
    const char* k = key_;
    if (!missing_.empty() && !r.has(k))
      throw ValueError(r.owner() + ": the config is missing `" + k + "` (" + missing_ + ")");
    if constexpr (std::is_same_v<T, int64_t>) {
      if (positive_)
        v = required_ ? r.positive_int(k) : r.positive_int(k, v);
      else
        v = r.integer(k, v);
    } else if constexpr (std::is_same_v<T, double>) {
      v = range_ ? r.number_in(k, v, range_->first, range_->second, hi_inclusive_) : r.number(k, v);
    } else if constexpr (std::is_same_v<T, bool>) {
      v = r.boolean(k, v);
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (activation_)
        v = r.activation(k, v);
      else
        v = choices_.empty() ? r.string(k, v) : r.choice(k, v, choices_);
    } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      v = required_ ? r.int_tuple(k, tuple_) : r.int_tuple(k, tuple_, v);
    } else if constexpr (std::is_same_v<T, InitializerArg>) {
      if (r.has(k))
        v = r.initializer(k, "");
      else
        r.get(k);  // marks it read; the default resolves in check()
    } else if constexpr (std::is_same_v<T, RegularizerPtr>) {
      v = r.regularizer(k);
    } else if constexpr (std::is_same_v<T, std::optional<int64_t>>) {
      const Json* j = r.get(k);
      if (j && !j->is_number_integer()) r.invalid(k, expected_.empty() ? "null or an integer" : expected_);
      v = j ? std::optional<int64_t>(j->get<int64_t>()) : std::nullopt;
    } else if constexpr (std::is_same_v<T, std::optional<double>>) {
      v = r.has(k) ? std::optional<double>(r.number(k, 0.0)) : (r.get(k), std::nullopt);
    } else if constexpr (std::is_same_v<T, IntOrList>) {
      if (const Json* j = r.get(k)) {
        if (j->is_number_integer()) {
          v = j->get<int64_t>();
        } else {
          if (!j->is_array() || j->empty()) r.invalid(k, expected_);
          std::vector<int64_t> list;
          for (auto& e : *j) {
            if (!e.is_number_integer()) r.invalid(k, expected_);
            list.push_back(e.get<int64_t>());
          }
          v = list;
        }
      }
    } else {
      static_assert(sizeof(T) == 0, "no field kind for this member type");
    }
    if (ok_ && is_set(v) && !ok_(inner(v))) r.invalid(k, expected_);
  }

  void check(const std::string& owner, T& v) const {
    namespace oc = option_check;
    if constexpr (std::is_same_v<T, int64_t>) {
      if (positive_) oc::positive(owner, key_, v);
    } else if constexpr (std::is_same_v<T, double>) {
      if (range_) oc::in_range(owner, key_, v, range_->first, range_->second, hi_inclusive_);
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (activation_) v = oc::activation(owner, key_, v);
      if (!choices_.empty()) v = oc::choice(owner, key_, v, choices_);
    } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      v = oc::tuple(owner, key_, v, tuple_);
    } else if constexpr (std::is_same_v<T, InitializerArg>) {
      v = v.resolve(owner, key_);
    } else if constexpr (std::is_same_v<T, IntOrList>) {
      const auto* list = std::get_if<std::vector<int64_t>>(&v);
      if (list && list->empty()) oc::invalid(owner, key_, expected_, Json(*list));
    }
    if constexpr (std::is_arithmetic_v<Inner> || std::is_same_v<Inner, std::string>)
      if (ok_ && is_set(v) && !ok_(inner(v))) oc::invalid(owner, key_, expected_, Json(inner(v)));
  }

  void write(Json& j, const T& v) const {
    if constexpr (std::is_same_v<T, InitializerArg>) {
      if (!v.resolved()) throw Error(std::string("internal: initializer `") + key_ + "` written before check_fields");
      j[key_] = v.resolved()->to_json();
    } else if constexpr (std::is_same_v<T, RegularizerPtr>) {
      if (v || !omit_if_unset_) j[key_] = regularizer_json(v);
    } else if constexpr (is_optional<T>::value) {
      if (v || !omit_if_unset_) j[key_] = v ? Json(*v) : Json(nullptr);
    } else if constexpr (std::is_same_v<T, IntOrList>) {
      j[key_] = int_or_list_json(v);
    } else {
      j[key_] = v;
    }
  }

  static bool is_set(const T& v) {
    if constexpr (is_optional<T>::value)
      return v.has_value();
    else
      return true;
  }
  static const Inner& inner(const T& v) {
    if constexpr (is_optional<T>::value)
      return *v;
    else
      return v;
  }

  const char* key_;
  T O::*member_;
  bool positive_ = false, required_ = false, activation_ = false, hi_inclusive_ = true, omit_if_unset_ = false;
  size_t tuple_ = 1;
  std::vector<std::string> choices_;
  std::optional<std::pair<double, double>> range_;
  std::function<bool(const Inner&)> ok_;
  std::string expected_, missing_;
};

template <class O, class T>
Field<O, T> field(const char* key, T O::*member) {
  return Field<O, T>(key, member);
}

// A Keras key kiln accepts only as null (weight constraints) and writes as null.
template <class O>
FieldDef<O> no_constraint(const char* key) {
  return FieldDef<O>{key, [key](ConfigReader& r, O&) { r.no_constraint(key); }, nullptr,
                     [key](Json& j, const O&) { j[key] = nullptr; }};
}

// A list of integers checked as a whole (`ok`, else "expected <expected>"),
// written as given: Reshape's target_shape, Permute's dims. Absent is "the
// config is missing `key` (<missing>)".
template <class O>
FieldDef<O> int_list_field(const char* key, std::vector<int64_t> O::*member,
                           std::function<bool(const std::vector<int64_t>&)> ok, std::string expected,
                           std::string missing) {
  auto read = [=](ConfigReader& r, O& o) {
    const Json* j = r.get(key);
    if (!j) throw ValueError(r.owner() + ": the config is missing `" + key + "` (" + missing + ")");
    if (!j->is_array()) r.invalid(key, expected);
    std::vector<int64_t> list;
    for (auto& e : *j) {
      if (!e.is_number_integer()) r.invalid(key, expected);
      list.push_back(e.get<int64_t>());
    }
    if (!ok(list)) r.invalid(key, expected);
    o.*member = std::move(list);
  };
  auto check = [=](const std::string& owner, O& o) {
    if (!ok(o.*member)) option_check::invalid(owner, key, expected, Json(o.*member));
  };
  return FieldDef<O>{key, read, check, [=](Json& j, const O& o) { j[key] = o.*member; }};
}

// `a` then `b`: a table built from shared parts.
template <class O>
FieldTable<O> operator+(FieldTable<O> a, const FieldTable<O>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Reads every field of `table` from `r` into `o` (absent keys keep o's values).
template <class O>
void read_fields(ConfigReader& r, O& o, const FieldTable<O>& table) {
  for (const auto& f : table) f.read(r, o);
}

// The options of `config` (an object or null); ValueError naming `owner` for a
// bad value or a key outside `table` and the base keys.
template <class O>
O read_fields(const Json& config, const std::string& owner, const FieldTable<O>& table) {
  ConfigReader r(config, owner);
  O o;
  read_fields(r, o, table);
  r.finish();
  return o;
}

// Checks typed options with the reader's messages; normalizes `o` in place.
template <class O>
void check_fields(const std::string& owner, O& o, const FieldTable<O>& table) {
  for (const auto& f : table)
    if (f.check) f.check(owner, o);
}

// Sets the config keys of `table` from `o` (checked), in table order.
template <class O>
void write_fields(Json& j, const O& o, const FieldTable<O>& table) {
  for (const auto& f : table) f.write(j, o);
}

// The keys Dense and the convolutions share: activation, use_bias, the
// kernel and bias initializers and regularizers (and, unless
// `activity_last`, the activity regularizer before the constraints; Dense
// writes it after them and only when set, as Keras does).
template <class O>
FieldTable<O> kernel_fields(bool activity_last = false) {
  FieldTable<O> t = {
      field("activation", &O::activation).activation(),    field("use_bias", &O::use_bias),
      field("kernel_initializer", &O::kernel_initializer), field("bias_initializer", &O::bias_initializer),
      field("kernel_regularizer", &O::kernel_regularizer), field("bias_regularizer", &O::bias_regularizer)};
  if (!activity_last) t.push_back(field("activity_regularizer", &O::activity_regularizer));
  t.push_back(no_constraint<O>("kernel_constraint"));
  t.push_back(no_constraint<O>("bias_constraint"));
  if (activity_last) t.push_back(field("activity_regularizer", &O::activity_regularizer).omit_if_unset());
  return t;
}

// The keys of a normalization's beta and gamma weights (GroupNormalization
// and LayerNormalization, after their own keys).
template <class O>
FieldTable<O> beta_gamma_fields() {
  return {field("beta_initializer", &O::beta_initializer),
          field("gamma_initializer", &O::gamma_initializer),
          field("beta_regularizer", &O::beta_regularizer),
          field("gamma_regularizer", &O::gamma_regularizer),
          no_constraint<O>("beta_constraint"),
          no_constraint<O>("gamma_constraint")};
}

}  // namespace kiln
