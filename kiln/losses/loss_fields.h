// Field tables for losses (kiln/core/config_fields.h): a loss's config keys
// declared once, in its Options struct, which is also the loss's state.
//
//   const config::FieldTable<HuberOptions>& huber_fields() {
//     static const auto t = loss_fields<HuberOptions>({config::field("delta", &HuberOptions::delta)});
//     return t;
//   }
//   from_config: std::make_shared<Huber>(read_loss_config(c, "Huber", huber_fields()));
//   get_config:  config::fields_json(options_, huber_fields());
//
// The Options struct holds `name` and `reduction` (Keras's base Loss
// arguments, written first) with the class's defaults; the Loss constructor
// checks the reduction, with its own message.
#pragma once

#include <memory>
#include <string>

#include "kiln/core/config_fields.h"
#include "kiln/core/json.h"

namespace kiln::losses {

// The keys of a loss that has no others.
struct LossOptions {
  std::string reduction = "sum_over_batch_size";
  std::string name;
};

// A loss's table: name and reduction (members of O), then `own`, the loss's
// own keys; the order of its config.
template <class O>
config::FieldTable<O> loss_fields(const config::FieldTable<O>& own = {}) {
  return config::FieldTable<O>{config::field("name", &O::name), config::field("reduction", &O::reduction)} + own;
}

// `config` (an object or null) read over `o` through `table`; ValueError
// naming `owner` for a bad value or a key outside the table and dtype
// (accepted and ignored, as Keras's base Loss does).
template <class O>
O read_loss_config(const Json& config, const std::string& owner, const config::FieldTable<O>& table, O o = {}) {
  config::Reader r(config, owner, {"dtype"});
  config::read_fields(r, o, table);
  r.finish();
  return o;
}

// from_config of a loss L whose keys are name and reduction, constructed as
// L(reduction, name); the defaults are L()'s.
template <class L>
std::shared_ptr<L> plain_loss_from_config(const Json& config) {
  static const config::FieldTable<LossOptions> table = loss_fields<LossOptions>();
  const L defaults;
  const LossOptions o = read_loss_config(config, defaults.class_name(), table,
                                         {.reduction = defaults.reduction(), .name = defaults.name()});
  return std::make_shared<L>(o.reduction, o.name);
}

}  // namespace kiln::losses
