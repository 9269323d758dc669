// Field tables: an object's config keys declared once, next to its Options
// struct, instead of four times (struct, members, from_config, get_config).
// One table gives the JSON reader (config::Reader's checks and messages,
// unknown keys refused), the checks of typed options, and the config's keys
// in get_config(), in table order (Json keeps insertion order, so the order
// of the table is the order of the saved config).
//
//   const config::FieldTable<HuberOptions>& huber_fields() {
//     static const config::FieldTable<HuberOptions> t = {
//         config::field("delta", &HuberOptions::delta).where([](double d) { return d >= 0; }, "a number >= 0")};
//     return t;
//   }
//   config::Reader r(json, "Huber", {"name", "reduction"});
//   HuberOptions o;
//   config::read_fields(r, o, huber_fields());  // JSON -> options
//   r.finish();                                  // unknown keys -> ValueError
//   config::check_fields("Huber", o, huber_fields());  // typed options: same checks, normalized in place
//   config::write_fields(j, o, huber_fields());        // options -> the config's keys
//
// A field's default is the Options struct's member initializer. After
// check_fields, strings of a choice are lower-case and tuples have one entry
// per axis, so the checked struct is the object's state and writes its
// config directly.
//
// Kinds of value here: int64_t (optionally a positive size), double
// (optionally in a range), bool, std::string (optionally one of choices),
// std::vector<int64_t> tuples, std::optional<int64_t>, std::optional<double>,
// IntOrList, plus `where` checks on any of them.
//
// Extension points, for a folder whose configs hold kinds core does not know
// (kiln/layers/config_fields.h uses both):
// - FieldCodec<T>: specialise it in namespace kiln::config for a member type
//   T; it gives `static void read(R& reader, const char* key, T& v)` (absent
//   keeps v; marks the key read), optionally `static void check(const
//   std::string& owner, const char* key, T& v)`, and `static void write(Json&
//   j, const char* key, const T& v, bool omit_if_unset)`.
// - A reader type R derived from config::Reader (FieldDef<O, R>, Field<O, T,
//   R>): hand-written FieldDefs then take R&.
// - BasicField<O, T, R, Self>::custom(read, check): a modifier (such as
//   layers' `.activation()`) that reads and checks the value its own way; a
//   folder's Field derives from BasicField (CRTP) to name such modifiers.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "kiln/core/config_reader.h"
#include "kiln/core/error.h"
#include "kiln/core/json.h"

namespace kiln::config {

// One config key of Options struct O, type-erased; R is the reader type.
template <class O, class R = Reader>
struct FieldDef {
  const char* key;
  std::function<void(R&, O&)> read;                         // reads and checks the key
  std::function<void(const std::string& owner, O&)> check;  // empty: nothing to check
  std::function<void(Json&, const O&)> write;               // sets j[key] (or leaves it out)
};
template <class O, class R = Reader>
using FieldTable = std::vector<FieldDef<O, R>>;

// How a member type core does not know is read, checked and written (see the
// header comment); specialised by the folder that owns the type.
template <class T>
struct FieldCodec {};

// Whether FieldCodec<T> has read / check / write (C++17 detection: the
// clang build compiles as C++17, so no requires-expressions here).
namespace detail {
template <class T, class R, class = void>
struct codec_reads : std::false_type {};
template <class T, class R>
struct codec_reads<T, R, std::void_t<decltype(FieldCodec<T>::read(std::declval<R&>(), "", std::declval<T&>()))>>
    : std::true_type {};
template <class T, class = void>
struct codec_checks : std::false_type {};
template <class T>
struct codec_checks<T, std::void_t<decltype(FieldCodec<T>::check(std::string(), "", std::declval<T&>()))>>
    : std::true_type {};
template <class T, class = void>
struct codec_writes : std::false_type {};
template <class T>
struct codec_writes<
    T, std::void_t<decltype(FieldCodec<T>::write(std::declval<Json&>(), "", std::declval<const T&>(), false))>>
    : std::true_type {};
}  // namespace detail

// A field bound to member `T O::*`; the kind of value comes from T and the
// modifiers below, which return Self (the folder's Field type). Converts to
// FieldDef<O, R>.
template <class O, class T, class R, class Self>
class BasicField {
 public:
  BasicField(const char* key, T O::*member) : key_(key), member_(member) {}

  // int64_t: a size in [1, kMaxConfigDim].
  Self& positive() { return positive_ = true, self(); }
  // int64_t sizes and tuples: absent is an error.
  Self& required() { return required_ = true, self(); }
  // Any other kind: absent is "the config is missing `key` (<what>)" (for
  // Json, null in typed options too).
  Self& required(std::string what) { return missing_ = std::move(what), self(); }
  // std::vector<int64_t>: one positive int for every one of `n` axes, or one per axis.
  Self& tuple(size_t n) { return tuple_ = n, self(); }
  // std::string: one of `choices`, case-insensitive, kept lower-case.
  Self& choice(std::vector<std::string> choices) { return choices_ = std::move(choices), self(); }
  // double: lo <= v <= hi (< hi unless hi_inclusive).
  Self& in_range(double lo, double hi, bool hi_inclusive = true) {
    range_ = std::make_pair(lo, hi);
    hi_inclusive_ = hi_inclusive;
    return self();
  }
  // Any value (the inner value of an optional, a Json that is not null):
  // `ok(v)` or "received an invalid value for `key`, expected <expected>".
  template <class P>
  Self& where(P ok, std::string expected) {
    ok_ = std::move(ok);
    expected_ = std::move(expected);
    return self();
  }
  // IntOrList: what the error says a bad value should be.
  Self& described(std::string expected) { return expected_ = std::move(expected), self(); }
  // std::optional (and codecs that honour it): unset is left out of the
  // config instead of written as null.
  Self& omit_if_unset() { return omit_if_unset_ = true, self(); }

  // The extension point for a folder's own modifiers: `read(reader, key,
  // fallback)` and `check(owner, key, v)` replace the kind's own reading and
  // checking (a `where` check still applies).
  using CustomRead = std::function<T(R&, const char* key, const T& fallback)>;
  using CustomCheck = std::function<T(const std::string& owner, const char* key, const T& v)>;
  Self& custom(CustomRead read, CustomCheck check) {
    custom_read_ = std::move(read);
    custom_check_ = std::move(check);
    return self();
  }

  operator FieldDef<O, R>() const {  // NOLINT(google-explicit-constructor)
    const BasicField f = *this;
    return FieldDef<O, R>{key_, [f](R& r, O& o) { f.read(r, o.*f.member_); },
                          [f](const std::string& owner, O& o) { f.check(owner, o.*f.member_); },
                          [f](Json& j, const O& o) { f.write(j, o.*f.member_); }};
  }

 private:
  template <class>
  struct is_optional : std::false_type {};
  template <class U>
  struct is_optional<std::optional<U>> : std::true_type {};
  using Inner = typename std::conditional_t<is_optional<T>::value, T, std::optional<T>>::value_type;

  Self& self() { return static_cast<Self&>(*this); }

  void read(R& r, T& v) const {
    const char* k = key_;
    if (!missing_.empty() && !r.has(k))
      throw ValueError(r.owner() + ": the config is missing `" + k + "` (" + missing_ + ")");
    if (custom_read_) {
      v = custom_read_(r, k, v);
    } else if constexpr (std::is_same_v<T, int64_t>) {
      if (positive_)
        v = required_ ? r.positive_int(k) : r.positive_int(k, v);
      else
        v = r.integer(k, v);
    } else if constexpr (std::is_same_v<T, double>) {
      v = range_ ? r.number_in(k, v, range_->first, range_->second, hi_inclusive_) : r.number(k, v);
    } else if constexpr (std::is_same_v<T, bool>) {
      v = r.boolean(k, v);
    } else if constexpr (std::is_same_v<T, std::string>) {
      v = choices_.empty() ? r.string(k, v) : r.choice(k, v, choices_);
    } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      v = required_ ? r.int_tuple(k, tuple_) : r.int_tuple(k, tuple_, v);
    } else if constexpr (detail::codec_reads<T, R>::value) {
      FieldCodec<T>::read(r, k, v);
    } else if constexpr (std::is_same_v<T, std::optional<int64_t>>) {
      const Json* j = r.get(k);
      if (j && !j->is_number_integer()) r.invalid(k, expected_.empty() ? "null or an integer" : expected_);
      v = j ? std::optional<int64_t>(j->get<int64_t>()) : std::nullopt;
    } else if constexpr (std::is_same_v<T, std::optional<double>>) {
      v = r.has(k) ? std::optional<double>(r.number(k, 0.0)) : (r.get(k), std::nullopt);
    } else if constexpr (std::is_same_v<T, Json>) {
      if (const Json* j = r.get(k)) v = *j;  // a value of several forms, kept as given (check it with where())
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
      static_assert(sizeof(T) == 0, "no field kind for this member type (specialise config::FieldCodec<T>)");
    }
    if (ok_ && is_set(v) && !ok_(inner(v))) r.invalid(k, expected_);
  }

  void check(const std::string& owner, T& v) const {
    namespace oc = option_check;
    if (custom_check_) {
      v = custom_check_(owner, key_, v);
    } else if constexpr (std::is_same_v<T, int64_t>) {
      if (positive_) oc::positive(owner, key_, v);
    } else if constexpr (std::is_same_v<T, double>) {
      if (range_) oc::in_range(owner, key_, v, range_->first, range_->second, hi_inclusive_);
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!choices_.empty()) v = oc::choice(owner, key_, v, choices_);
    } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
      v = oc::tuple(owner, key_, v, tuple_);
    } else if constexpr (detail::codec_checks<T>::value) {
      FieldCodec<T>::check(owner, key_, v);
    } else if constexpr (std::is_same_v<T, IntOrList>) {
      const auto* list = std::get_if<std::vector<int64_t>>(&v);
      if (list && list->empty()) oc::invalid(owner, key_, expected_, Json(*list));
    } else if constexpr (std::is_same_v<T, Json>) {
      if (!missing_.empty() && v.is_null())
        throw ValueError(owner + ": the config is missing `" + key_ + "` (" + missing_ + ")");
    }
    if constexpr (std::is_arithmetic_v<Inner> || std::is_same_v<Inner, std::string> || std::is_same_v<Inner, Json>)
      if (ok_ && is_set(v) && !ok_(inner(v))) oc::invalid(owner, key_, expected_, Json(inner(v)));
  }

  void write(Json& j, const T& v) const {
    if constexpr (detail::codec_writes<T>::value) {
      FieldCodec<T>::write(j, key_, v, omit_if_unset_);
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
    else if constexpr (std::is_same_v<T, Json>)
      return !v.is_null();
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
  bool positive_ = false, required_ = false, hi_inclusive_ = true, omit_if_unset_ = false;
  size_t tuple_ = 1;
  std::vector<std::string> choices_;
  std::optional<std::pair<double, double>> range_;
  std::function<bool(const Inner&)> ok_;
  std::string expected_, missing_;
  CustomRead custom_read_;
  CustomCheck custom_check_;
};

// The Field of configs read by reader type R (config::Reader unless a folder
// derives its own).
template <class O, class T, class R = Reader>
class Field : public BasicField<O, T, R, Field<O, T, R>> {
 public:
  using BasicField<O, T, R, Field<O, T, R>>::BasicField;
};

template <class O, class T>
Field<O, T> field(const char* key, T O::*member) {
  return Field<O, T>(key, member);
}

// A list of integers checked as a whole (`ok`, else "expected <expected>"),
// written as given: Reshape's target_shape, Permute's dims. Absent is "the
// config is missing `key` (<missing>)".
template <class O, class R = Reader>
FieldDef<O, R> int_list_field(const char* key, std::vector<int64_t> O::*member,
                              std::function<bool(const std::vector<int64_t>&)> ok, std::string expected,
                              std::string missing) {
  auto read = [=](R& r, O& o) {
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
  return FieldDef<O, R>{key, read, check, [=](Json& j, const O& o) { j[key] = o.*member; }};
}

// `a` then `b`: a table built from shared parts.
template <class O, class R>
FieldTable<O, R> operator+(FieldTable<O, R> a, const FieldTable<O, R>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Reads every field of `table` from `r` into `o` (absent keys keep o's values).
template <class O, class R>
void read_fields(R& r, O& o, const FieldTable<O, R>& table) {
  for (const auto& f : table) f.read(r, o);
}

// The options of `config` (an object or null) read with an R(config, owner);
// ValueError naming `owner` for a bad value or a key outside `table` and R's
// base keys.
template <class O, class R>
O read_fields(const Json& config, const std::string& owner, const FieldTable<O, R>& table) {
  R r(config, owner);
  O o;
  read_fields(r, o, table);
  r.finish();
  return o;
}

// Checks typed options with the reader's messages; normalizes `o` in place.
template <class O, class R>
void check_fields(const std::string& owner, O& o, const FieldTable<O, R>& table) {
  for (const auto& f : table)
    if (f.check) f.check(owner, o);
}

// Sets the config keys of `table` from `o` (checked), in table order.
template <class O, class R>
void write_fields(Json& j, const O& o, const FieldTable<O, R>& table) {
  for (const auto& f : table) f.write(j, o);
}

// The config object `table` writes from `o`.
template <class O, class R>
Json fields_json(const O& o, const FieldTable<O, R>& table) {
  Json j = Json::object();
  write_fields(j, o, table);
  return j;
}

}  // namespace kiln::config
