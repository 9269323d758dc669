#include "kiln/optimizers/optimizer_options.h"

namespace kiln {

Json optimizer_config(const OptimizerOptions& o, const LearningRate& learning_rate) {
  Json c = Json::object();
  if (const auto* s = std::get_if<SchedulePtr>(&learning_rate))
    c["learning_rate"] = *s ? (*s)->to_json() : Json(nullptr);
  else
    c["learning_rate"] = std::get<double>(learning_rate);
  if (o.weight_decay) c["weight_decay"] = *o.weight_decay;
  if (o.clipnorm) c["clipnorm"] = *o.clipnorm;
  if (o.clipvalue) c["clipvalue"] = *o.clipvalue;
  if (o.global_clipnorm) c["global_clipnorm"] = *o.global_clipnorm;
  if (o.use_ema) c["use_ema"] = true;
  c["ema_momentum"] = o.ema_momentum;
  if (o.ema_overwrite_frequency) c["ema_overwrite_frequency"] = *o.ema_overwrite_frequency;
  if (o.gradient_accumulation_steps != 0) c["gradient_accumulation_steps"] = o.gradient_accumulation_steps;
  if (!o.name.empty()) c["name"] = o.name;
  return c;
}

}  // namespace kiln
