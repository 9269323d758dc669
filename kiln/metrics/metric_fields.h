// Field tables for metrics (kiln/core/config_fields.h): a metric's config
// keys besides name declared once, in its Options struct, which is also the
// metric's state. The name stays the Metric's own (set_name renames it).
//
//   std::string name = "binary_accuracy";
//   const Options o = read_metric_config(c, "BinaryAccuracy", name, binary_accuracy_fields());  // from_config
//   return metric_config(*this, options_, binary_accuracy_fields());                           // get_config
#pragma once

#include <memory>
#include <string>

#include "kiln/core/config_fields.h"
#include "kiln/core/json.h"
#include "kiln/metrics/metric.h"

namespace kiln::metrics {

// `config` (an object or null): its name into `name` (absent: kept), then
// the metric's own keys over `o` through `table`; ValueError naming `owner`
// for a bad value or a key outside them and dtype (accepted and ignored).
template <class O>
O read_metric_config(const Json& config, const std::string& owner, std::string& name,
                     const config::FieldTable<O>& table, O o = {}) {
  config::Reader r(config, owner, {"dtype"});
  name = r.string("name", name);
  config::read_fields(r, o, table);
  r.finish();
  return o;
}

// from_config of a metric L whose only key is name, constructed as L(name);
// the default is L()'s.
template <class L>
std::shared_ptr<L> plain_metric_from_config(const Json& config) {
  struct NoKeys {};
  const L defaults;
  std::string name = defaults.name();
  read_metric_config<NoKeys>(config, defaults.class_name(), name, {});
  return std::make_shared<L>(name);
}

// `m`'s config: its name, then the keys `table` writes from `o`.
template <class O>
Json metric_config(const Metric& m, const O& o, const config::FieldTable<O>& table) {
  Json c = m.Metric::get_config();
  config::write_fields(c, o, table);
  return c;
}

}  // namespace kiln::metrics
