// Typed options for optimizers built from C++: Keras's base optimizer
// arguments, shared by every optimizer's Options struct as its `base`.
//
//   auto opt = std::make_shared<optimizers::Adam>(optimizers::AdamOptions{
//       .learning_rate = 1e-3, .beta_2 = 0.98, .base = {.global_clipnorm = 1.0, .use_ema = true}});
//
// Each optimizer declares its own config keys once, in a field table over
// its Options struct (config_fields.h). The JSON constructor reads the
// config into the Options struct with optimizer_fields<O>() plus that table
// (unknown keys are a ValueError naming the key) and delegates to the typed
// constructor, which checks the struct with the same tables; the struct is
// the optimizer's state, and get_config() writes the base keys (Optimizer)
// followed by the class's own.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>

#include "kiln/core/config_fields.h"
#include "kiln/core/json.h"

namespace kiln {

class LearningRateSchedule;
using SchedulePtr = std::shared_ptr<LearningRateSchedule>;

// A constant learning rate or a schedule (schedules.h).
using LearningRate = std::variant<double, SchedulePtr>;

struct OptimizerOptions {
  std::optional<double> weight_decay;                          // unset: none (AdamW: 0.004)
  std::optional<double> clipnorm, clipvalue, global_clipnorm;  // at most one
  bool use_ema = false;
  double ema_momentum = 0.99;  // in [0, 1]
  std::optional<int64_t> ema_overwrite_frequency;
  int64_t gradient_accumulation_steps = 0;  // 0: off, else >= 2
  std::string name;                         // empty: the class's default ("adam")
};

// The base keys after name and learning_rate, in the order of Keras's
// get_config (weight_decay ... gradient_accumulation_steps; jit_compile and
// is_legacy_optimizer are accepted and left out).
const config::FieldTable<OptimizerOptions>& optimizer_base_fields();

// learning_rate: a non-negative number or a schedule {"class_name", "config"}
// (read from `r`, absent or null keeps `lr`); ValueError naming `owner` otherwise.
void read_learning_rate(config::Reader& r, LearningRate& lr);
void check_learning_rate(const std::string& owner, const LearningRate& lr);
Json learning_rate_json(const LearningRate& lr);

// A double config key that must be >= 0.
template <class O>
config::Field<O, double> non_negative(const char* key, double O::*member) {
  return config::field(key, member).where([](double v) { return v >= 0; }, "a non-negative number");
}

// The fields of `table` over member `B O::*member`, as fields of O.
template <class O, class B>
config::FieldTable<O> nested_fields(B O::*member, const config::FieldTable<B>& table) {
  config::FieldTable<O> out;
  for (const auto& f : table) {
    config::FieldDef<O> d{f.key, [f, member](config::Reader& r, O& o) { f.read(r, o.*member); }, nullptr,
                          [f, member](Json& j, const O& o) { f.write(j, o.*member); }};
    if (f.check) d.check = [f, member](const std::string& owner, O& o) { f.check(owner, o.*member); };
    out.push_back(std::move(d));
  }
  return out;
}

// The base keys of an optimizer's Options struct O (members `learning_rate`
// and `base`): name, learning_rate, then optimizer_base_fields().
template <class O>
config::FieldTable<O> optimizer_fields() {
  config::FieldTable<O> t =
      nested_fields(&O::base, config::FieldTable<OptimizerOptions>{config::field("name", &OptimizerOptions::name)});
  t.push_back(
      config::FieldDef<O>{"learning_rate", [](config::Reader& r, O& o) { read_learning_rate(r, o.learning_rate); },
                          [](const std::string& owner, O& o) { check_learning_rate(owner, o.learning_rate); },
                          [](Json& j, const O& o) { j["learning_rate"] = learning_rate_json(o.learning_rate); }});
  return t + nested_fields(&O::base, optimizer_base_fields());
}

// The Options struct O of an optimizer's config, read with the base keys and
// `own` (the class's keys); ValueError naming `owner` for a bad value or a
// key outside both.
template <class O>
O read_optimizer_options(const Json& json, const std::string& owner, const config::FieldTable<O>& own) {
  return config::read_fields(json, owner, optimizer_fields<O>() + own);
}

}  // namespace kiln
