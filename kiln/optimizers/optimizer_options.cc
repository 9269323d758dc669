#include "kiln/optimizers/optimizer_options.h"

#include <cmath>

#include "kiln/core/error.h"
#include "kiln/core/json_limits.h"
#include "kiln/optimizers/optimizer.h"

namespace kiln {
namespace {

// An option that a positive value turns on: written as null when unset or 0.
template <class T>
config::FieldDef<OptimizerOptions> positive_or_null(config::FieldDef<OptimizerOptions> d, T OptimizerOptions::*member) {
  d.write = [key = d.key, member](Json& j, const OptimizerOptions& o) {
    const T& v = o.*member;
    if constexpr (std::is_same_v<T, int64_t>)
      j[key] = v > 0 ? Json(v) : Json(nullptr);
    else
      j[key] = v && *v > 0 ? Json(*v) : Json(nullptr);
  };
  return d;
}

config::FieldDef<OptimizerOptions> optional_non_negative(const char* key,
                                                         std::optional<double> OptimizerOptions::*member) {
  return positive_or_null(
      config::field(key, member).where([](double v) { return v >= 0 && std::isfinite(v); }, "a non-negative number"),
      member);
}

// A Keras key kiln accepts and ignores (it compiles nothing).
config::FieldDef<OptimizerOptions> accepted_and_ignored(const char* key) {
  return config::FieldDef<OptimizerOptions>{key, [key](config::Reader& r, OptimizerOptions&) { r.get(key); }, nullptr,
                                            [](Json&, const OptimizerOptions&) {}};
}

}  // namespace

const config::FieldTable<OptimizerOptions>& optimizer_base_fields() {
  static const config::FieldTable<OptimizerOptions> t = {
      optional_non_negative("weight_decay", &OptimizerOptions::weight_decay),
      optional_non_negative("clipnorm", &OptimizerOptions::clipnorm),
      optional_non_negative("global_clipnorm", &OptimizerOptions::global_clipnorm),
      optional_non_negative("clipvalue", &OptimizerOptions::clipvalue),
      config::field("use_ema", &OptimizerOptions::use_ema),
      config::field("ema_momentum", &OptimizerOptions::ema_momentum).in_range(0, 1),
      positive_or_null(config::field("ema_overwrite_frequency", &OptimizerOptions::ema_overwrite_frequency)
                           .where([](int64_t v) { return v >= 0; }, "an integer >= 1 or null"),
                       &OptimizerOptions::ema_overwrite_frequency),
      // Keras's loss_scale_factor: kiln scales losses in the trainer instead.
      config::FieldDef<OptimizerOptions>{
          "loss_scale_factor",
          [](config::Reader& r, OptimizerOptions&) {
            if (r.get("loss_scale_factor"))
              r.invalid("loss_scale_factor", "null (kiln scales losses in the trainer: use its loss scaling)");
          },
          nullptr, [](Json& j, const OptimizerOptions&) { j["loss_scale_factor"] = nullptr; }},
      // Keras: a falsy value (0) turns it off; anything else must be >= 2.
      positive_or_null(config::field("gradient_accumulation_steps", &OptimizerOptions::gradient_accumulation_steps)
                           .where([](int64_t v) { return v == 0 || v >= 2; }, "an integer >= 2 (or 0: off)"),
                       &OptimizerOptions::gradient_accumulation_steps),
      accepted_and_ignored("jit_compile"), accepted_and_ignored("is_legacy_optimizer")};
  return t;
}

void read_learning_rate(config::Reader& r, LearningRate& lr) {
  const Json* j = r.get("learning_rate");
  if (!j) return;
  if (j->is_object())
    lr = LearningRateSchedule::from_json(*j);
  else if (j->is_number() && j->get<double>() >= 0 && std::isfinite(j->get<double>()))
    lr = j->get<double>();
  else
    r.invalid("learning_rate", "a non-negative number or a schedule {\"class_name\", \"config\"}");
}

void check_learning_rate(const std::string& owner, const LearningRate& lr) {
  if (const auto* s = std::get_if<SchedulePtr>(&lr)) {
    if (!*s) throw ValueError(owner + ": `learning_rate` is a null schedule; give a number or a schedule");
    return;
  }
  const double v = std::get<double>(lr);
  if (!(v >= 0) || !std::isfinite(v))
    option_check::invalid(owner, "learning_rate", "a non-negative number or a schedule {\"class_name\", \"config\"}",
                          Json(v));
}

Json learning_rate_json(const LearningRate& lr) {
  if (const auto* s = std::get_if<SchedulePtr>(&lr)) return *s ? (*s)->to_json() : Json(nullptr);
  return std::get<double>(lr);
}

}  // namespace kiln
