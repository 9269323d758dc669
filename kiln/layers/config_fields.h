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
//
// The machinery is kiln/core/config_fields.h (namespace kiln::config); this
// header binds it to the layer ConfigReader and adds the layer kinds through
// core's extension points: FieldCodec<InitializerArg> and
// FieldCodec<RegularizerPtr>, the `.activation()` modifier (a `custom` read
// and check), no_constraint, kernel_fields and beta_gamma_fields.
#pragma once

#include <string>

#include "kiln/core/config_fields.h"
#include "kiln/core/error.h"
#include "kiln/core/json.h"
#include "kiln/layers/config_reader.h"
#include "kiln/layers/layer_options.h"

namespace kiln {
namespace config {

// An initializer key: absent keeps the Options default, which check_fields
// resolves; written as the resolved initializer's JSON.
template <>
struct FieldCodec<InitializerArg> {
  static void read(ConfigReader& r, const char* key, InitializerArg& v) {
    if (r.has(key))
      v = r.initializer(key, "");
    else
      r.get(key);  // marks it read; the default resolves in check()
  }
  static void check(const std::string& owner, const char* key, InitializerArg& v) { v = v.resolve(owner, key); }
  static void write(Json& j, const char* key, const InitializerArg& v, bool /*omit_if_unset*/) {
    if (!v.resolved()) throw Error(std::string("internal: initializer `") + key + "` written before check_fields");
    j[key] = v.resolved()->to_json();
  }
};

// A regularizer key: absent is none, written as null unless omit_if_unset.
template <>
struct FieldCodec<RegularizerPtr> {
  static void read(ConfigReader& r, const char* key, RegularizerPtr& v) { v = r.regularizer(key); }
  static void write(Json& j, const char* key, const RegularizerPtr& v, bool omit_if_unset) {
    if (v || !omit_if_unset) j[key] = regularizer_json(v);
  }
};

}  // namespace config

template <class O>
using FieldDef = config::FieldDef<O, ConfigReader>;
template <class O>
using FieldTable = config::FieldTable<O, ConfigReader>;

// A field of a layer config: core's modifiers (positive, required, tuple,
// choice, in_range, where, described, omit_if_unset) and `.activation()`.
template <class O, class T>
class Field : public config::BasicField<O, T, ConfigReader, Field<O, T>> {
 public:
  using config::BasicField<O, T, ConfigReader, Field<O, T>>::BasicField;

  // std::string: a known activation name.
  Field& activation() {
    return this->custom(
        [](ConfigReader& r, const char* key, const T& v) { return r.activation(key, v); },
        [](const std::string& owner, const char* key, const T& v) { return option_check::activation(owner, key, v); });
  }
};

template <class O, class T>
Field<O, T> field(const char* key, T O::*member) {
  return Field<O, T>(key, member);
}

using config::check_fields;
using config::read_fields;
using config::write_fields;

// config::int_list_field for a layer config (Reshape's target_shape, Permute's dims).
template <class O>
FieldDef<O> int_list_field(const char* key, std::vector<int64_t> O::*member,
                           std::function<bool(const std::vector<int64_t>&)> ok, std::string expected,
                           std::string missing) {
  return config::int_list_field<O, ConfigReader>(key, member, std::move(ok), std::move(expected), std::move(missing));
}

// A Keras key kiln accepts only as null (weight constraints) and writes as null.
template <class O>
FieldDef<O> no_constraint(const char* key) {
  return FieldDef<O>{key, [key](ConfigReader& r, O&) { r.no_constraint(key); }, nullptr,
                     [key](Json& j, const O&) { j[key] = nullptr; }};
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
