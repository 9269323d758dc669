// Typed options for optimizers built from C++: Keras's base optimizer
// arguments, shared by every optimizer's Options struct as its `base`.
//
//   auto opt = std::make_shared<optimizers::Adam>(optimizers::AdamOptions{
//       .learning_rate = 1e-3, .beta_2 = 0.98, .base = {.global_clipnorm = 1.0, .use_ema = true}});
//
// The JSON constructors (the registry, saved configs) keep reading Keras's
// keys. An Options constructor writes its values as that config (unset
// optional values left out) and delegates to the JSON constructor, so both
// run the same checks, report the same errors and give the same get_config().
// (The reverse of the layers' direction: the base Optimizer's constructor
// still takes JSON, and moving it would touch optimizer.h, which most of the
// library includes.)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>

#include "kiln/core/json.h"
#include "kiln/optimizers/optimizer.h"

namespace kiln {

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

// The config keys for `base` and `learning_rate` (unset options are left out).
Json optimizer_config(const OptimizerOptions& base, const LearningRate& learning_rate);

}  // namespace kiln
