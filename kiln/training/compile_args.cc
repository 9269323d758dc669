// CompileArgs (declared in kiln/models/fit_args.h): Keras names and JSON.
#include "kiln/core/error.h"
#include "kiln/core/json_limits.h"
#include "kiln/models/fit_args.h"

namespace kiln {

CompileArgs CompileArgs::from_names(const std::string& optimizer, const std::string& loss,
                                    const std::vector<std::string>& metrics) {
  CompileArgs a;
  a.optimizer = Optimizer::get(optimizer);
  if (!loss.empty()) a.loss = Loss::get(loss);
  for (auto& m : metrics) a.metrics.push_back(Metric::get(m, a.loss.get()));
  return a;
}

CompileArgs CompileArgs::from_json(const Json& j) {
  if (!j.is_object())
    throw ValueError("compile config must be an object {\"optimizer\", \"loss\", \"metrics\"}. Received: " +
                     json_excerpt(j));
  CompileArgs a;
  const Json& o = require(j, "optimizer", "compile config");
  a.optimizer = o.is_string() ? Optimizer::get(o.get<std::string>()) : Optimizer::from_json(o);
  if (j.contains("loss") && !j["loss"].is_null()) {
    const Json& l = j["loss"];
    a.loss = l.is_string() ? Loss::get(l.get<std::string>()) : Loss::from_json(l);
  }
  if (j.contains("metrics") && !j["metrics"].is_null()) {
    if (!j["metrics"].is_array())
      throw ValueError("compile config: `metrics` must be a list. Received: " + json_excerpt(j["metrics"]));
    auto one = [&](const Json& m) {
      return m.is_string() ? Metric::get(m.get<std::string>(), a.loss.get())
                           : Metric::from_json(m, a.loss.get());
    };
    const Json& ms = j["metrics"];
    const bool nested = !ms.empty() && ms[0].is_array();
    for (auto& m : ms) {
      if (m.is_array() != nested)
        throw ValueError(
            "compile config: `metrics` must be a list of metrics or a list of lists (one per output), "
            "not a mix. Received: " +
            json_excerpt(ms));
      if (!nested) {
        a.metrics.push_back(one(m));
        continue;
      }
      a.output_metrics.emplace_back();
      for (auto& mm : m) a.output_metrics.back().push_back(one(mm));
    }
  }
  return a;
}

Json CompileArgs::to_json() const {
  Json j;
  j["optimizer"] = optimizer ? optimizer->to_json() : Json(nullptr);
  j["loss"] = loss ? loss->to_json() : Json(nullptr);
  Json m = Json::array();
  for (auto& metric : metrics) m.push_back(metric->to_json());
  for (auto& per_output : output_metrics) {
    Json o = Json::array();
    for (auto& metric : per_output) o.push_back(metric->to_json());
    m.push_back(o);
  }
  j["metrics"] = m;
  return j;
}

}  // namespace kiln
