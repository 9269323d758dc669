// CompileArgs (declared in kiln/models/fit_args.h): Keras names and Keras 3's
// compile config (model.get_compile_config()).
#include <cmath>

#include "kiln/core/config_keys.h"
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

namespace {

const char* const kWhere = "the compile config";

// A serialized Keras object: {"module", "class_name", "config", "registered_name"}.
bool is_serialized_object(const Json& j) { return j.is_object() && j.contains("class_name"); }

void check_object_keys(const Json& j, const std::string& where) {
  check_config_keys(j, {"module", "class_name", "config", "registered_name"}, where);
}

LossPtr one_loss(const Json& l, const std::string& where) {
  if (l.is_null()) return nullptr;
  if (l.is_string()) return Loss::get(l.get<std::string>());
  if (!is_serialized_object(l))
    throw ValueError(where + " must be a loss name or {\"class_name\", \"config\"}. Received: " + json_excerpt(l));
  check_object_keys(l, where);
  return Loss::from_json(l);
}

MetricPtr one_metric(const Json& m, const Loss* loss, const std::string& where) {
  if (m.is_string()) return Metric::get(m.get<std::string>(), loss);
  if (!is_serialized_object(m))
    throw ValueError(where + " must be a metric name or {\"class_name\", \"config\"}. Received: " + json_excerpt(m));
  check_object_keys(m, where);
  return Metric::from_json(m, loss);
}

// A metric or a list of metrics (Keras's dict values may be either).
std::vector<MetricPtr> metric_list(const Json& m, const Loss* loss, const std::string& where) {
  std::vector<MetricPtr> out;
  if (m.is_null()) return out;
  if (!m.is_array()) return {one_metric(m, loss, where)};
  for (size_t i = 0; i < m.size(); ++i) out.push_back(one_metric(m[i], loss, where + "[" + std::to_string(i) + "]"));
  return out;
}

double loss_weight(const Json& w, const std::string& where) {
  if (!w.is_number() || !std::isfinite(w.get<double>()) || w.get<double>() < 0)
    throw ValueError(where + " must be a number >= 0. Received: " + json_excerpt(w));
  return w.get<double>();
}

Json with_module(Json j, const char* module) {
  if (!j.is_object()) return j;
  Json out;
  out["module"] = module;
  for (auto it = j.begin(); it != j.end(); ++it) out[it.key()] = it.value();
  out["registered_name"] = nullptr;
  return out;
}

}  // namespace

CompileArgs CompileArgs::from_json(const Json& j) {
  if (!j.is_object())
    throw ValueError("compile config must be an object {\"optimizer\", \"loss\", \"metrics\"}. Received: " +
                     json_excerpt(j));
  check_config_keys(j,
                    {"optimizer", "loss", "loss_weights", "metrics", "weighted_metrics", "run_eagerly",
                     "steps_per_execution", "jit_compile", "auto_scale_loss"},
                    kWhere);
  CompileArgs a;
  const Json& o = require(j, "optimizer", "compile config");
  if (!o.is_string()) check_object_keys(o, "the compile config's `optimizer`");
  a.optimizer = o.is_string() ? Optimizer::get(o.get<std::string>()) : Optimizer::from_json(o);

  // loss: one for every output, a list (one per output) or a dict by output name.
  if (j.contains("loss") && !j["loss"].is_null()) {
    const Json& l = j["loss"];
    if (l.is_array()) {
      for (size_t i = 0; i < l.size(); ++i)
        a.output_losses.push_back(one_loss(l[i], "`loss`[" + std::to_string(i) + "]"));
    } else if (l.is_object() && !is_serialized_object(l)) {
      for (auto it = l.begin(); it != l.end(); ++it)
        if (LossPtr p = one_loss(it.value(), "`loss`[\"" + it.key() + "\"]")) a.named_losses.emplace_back(it.key(), p);
    } else {
      a.loss = one_loss(l, "`loss`");
    }
  }
  if (j.contains("loss_weights") && !j["loss_weights"].is_null()) {
    const Json& w = j["loss_weights"];
    if (w.is_array()) {
      for (size_t i = 0; i < w.size(); ++i)
        a.loss_weights.push_back(loss_weight(w[i], "`loss_weights`[" + std::to_string(i) + "]"));
    } else if (w.is_object()) {
      for (auto it = w.begin(); it != w.end(); ++it)
        a.named_loss_weights.emplace_back(it.key(), loss_weight(it.value(), "`loss_weights`[\"" + it.key() + "\"]"));
    } else {
      throw ValueError("`loss_weights` must be a list (one weight per output) or a dict by output name. Received: " +
                       json_excerpt(w));
    }
  }

  // metrics: a flat list (every output), a list of lists (per output) or a dict by output name.
  if (j.contains("metrics") && !j["metrics"].is_null()) {
    const Json& ms = j["metrics"];
    auto loss_of = [&](size_t i) -> const Loss* {
      if (a.loss) return a.loss.get();
      return i < a.output_losses.size() ? a.output_losses[i].get() : nullptr;
    };
    if (ms.is_object() && !is_serialized_object(ms)) {
      for (auto it = ms.begin(); it != ms.end(); ++it) {
        const Loss* loss = a.loss.get();
        for (auto& [name, l] : a.named_losses)
          if (name == it.key()) loss = l.get();
        a.named_metrics.emplace_back(it.key(), metric_list(it.value(), loss, "`metrics`[\"" + it.key() + "\"]"));
      }
    } else if (!ms.is_array()) {
      throw ValueError("compile config: `metrics` must be a list. Received: " + json_excerpt(ms));
    } else {
      const bool nested = !ms.empty() && (ms[0].is_array() || ms[0].is_null());
      for (size_t i = 0; i < ms.size(); ++i) {
        const Json& m = ms[i];
        if ((m.is_array() || m.is_null()) != nested)
          throw ValueError(
              "compile config: `metrics` must be a list of metrics or a list of lists (one per output), "
              "not a mix. Received: " +
              json_excerpt(ms));
        const std::string where = "`metrics`[" + std::to_string(i) + "]";
        if (!nested)
          a.metrics.push_back(one_metric(m, loss_of(0), where));
        else
          a.output_metrics.push_back(metric_list(m, loss_of(i), where));
      }
    }
  }

  // What Keras's compile() also takes: honoured where it means something in
  // kiln, refused with the reason where it would be silently ignored.
  if (j.contains("weighted_metrics") && !j["weighted_metrics"].is_null() &&
      !(j["weighted_metrics"].is_array() && j["weighted_metrics"].empty()))
    throw ValueError(
        "compile config: `weighted_metrics` is not supported (kiln's metrics take sample_weight only through "
        "`metrics`); remove it or move the metrics to `metrics`. Received: " +
        json_excerpt(j["weighted_metrics"]));
  if (j.contains("steps_per_execution") && !j["steps_per_execution"].is_null()) {
    const Json& spe = j["steps_per_execution"];
    if (!spe.is_number_integer() || spe.get<int64_t>() < 1)
      throw ValueError(
          "compile config: `steps_per_execution` must be a positive integer (steps between host "
          "round trips; 1 calls the callbacks after every batch). Received: " +
          json_excerpt(spe));
  }
  // run_eagerly chooses how Keras runs the step (eager or traced); kiln
  // always runs it through LibTorch, which computes the same values, so any
  // boolean (or "auto") is accepted. jit_compile true captures the step in a
  // CUDA graph on a GPU (CompileArgs::jit_compile); "auto" leaves it off.
  for (const char* key : {"run_eagerly", "jit_compile"})
    if (j.contains(key) && !j[key].is_null() && !j[key].is_boolean() && j[key] != "auto")
      throw ValueError(std::string("compile config: `") + key +
                       "` must be true, false or \"auto\". Received: " + json_excerpt(j[key]));
  // auto_scale_loss: Keras's default (true) only acts under mixed_float16;
  // kiln has no automatic loss scaling, so the flag is accepted and noted
  // in docs/SPEC.md.
  if (j.contains("auto_scale_loss") && !j["auto_scale_loss"].is_null() && !j["auto_scale_loss"].is_boolean())
    throw ValueError("compile config: `auto_scale_loss` must be true or false. Received: " +
                     json_excerpt(j["auto_scale_loss"]));
  if (j.contains("steps_per_execution") && !j["steps_per_execution"].is_null())
    a.steps_per_execution = j["steps_per_execution"].get<int64_t>();
  if (j.contains("jit_compile") && j["jit_compile"].is_boolean()) a.jit_compile = j["jit_compile"].get<bool>();
  return a;
}

Json CompileArgs::to_json() const {
  Json j;
  j["optimizer"] = optimizer ? with_module(optimizer->to_json(), "keras.optimizers") : Json(nullptr);
  auto loss_json = [](const LossPtr& l) { return l ? with_module(l->to_json(), "keras.losses") : Json(nullptr); };
  auto metric_json = [](const MetricPtr& m) { return with_module(m->to_json(), "keras.metrics"); };
  if (!output_losses.empty()) {
    Json l = Json::array();
    for (auto& loss : output_losses) l.push_back(loss_json(loss));
    j["loss"] = l;
  } else if (!named_losses.empty()) {
    Json l = Json::object();
    for (auto& [name, loss] : named_losses) l[name] = loss_json(loss);
    j["loss"] = l;
  } else {
    j["loss"] = loss_json(loss);
  }
  if (!loss_weights.empty()) {
    j["loss_weights"] = loss_weights;
  } else if (!named_loss_weights.empty()) {
    Json w = Json::object();
    for (auto& [name, v] : named_loss_weights) w[name] = v;
    j["loss_weights"] = w;
  } else {
    j["loss_weights"] = nullptr;
  }
  Json m = Json::array();
  for (auto& metric : metrics) m.push_back(metric_json(metric));
  for (auto& per_output : output_metrics) {
    Json o = Json::array();
    for (auto& metric : per_output) o.push_back(metric_json(metric));
    m.push_back(o);
  }
  if (!named_metrics.empty()) {
    m = Json::object();
    for (auto& [name, list] : named_metrics) {
      Json o = Json::array();
      for (auto& metric : list) o.push_back(metric_json(metric));
      m[name] = o;
    }
  }
  j["metrics"] = m;
  j["weighted_metrics"] = nullptr;
  j["run_eagerly"] = false;
  j["steps_per_execution"] = steps_per_execution;
  j["jit_compile"] = jit_compile;
  j["auto_scale_loss"] = true;
  return j;
}

}  // namespace kiln
