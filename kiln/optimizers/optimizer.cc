#include "kiln/optimizers/optimizer.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <mutex>
#include <set>
#include <sstream>

#include "kiln/core/config_keys.h"
#include "kiln/core/error.h"
#include "kiln/core/json_limits.h"
#include "kiln/core/registry.h"
#include "kiln/core/shape.h"
#include "kiln/optimizers/adadelta.h"
#include "kiln/optimizers/adagrad.h"
#include "kiln/optimizers/adam.h"
#include "kiln/optimizers/adamax.h"
#include "kiln/optimizers/ftrl.h"
#include "kiln/optimizers/lion.h"
#include "kiln/optimizers/loss_scale_optimizer.h"
#include "kiln/optimizers/nadam.h"
#include "kiln/optimizers/rmsprop.h"
#include "kiln/optimizers/sgd.h"

namespace kiln {
namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
  return s;
}

std::string num_str(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// A non-negative number or null (absent) config entry; 0 when absent.
double optional_non_negative(const Json& c, const char* key, const std::string& owner, bool* is_set) {
  *is_set = false;
  if (!c.is_object() || !c.contains(key) || c[key].is_null()) return 0.0;
  const Json& v = c[key];
  if (!v.is_number() || !(v.get<double>() >= 0) || !std::isfinite(v.get<double>()))
    throw ValueError(owner + ": `" + key + "` must be a non-negative number. Received: " + key + "=" + json_excerpt(v));
  *is_set = true;
  return v.get<double>();
}

const std::vector<std::string>& base_keys() {
  static const std::vector<std::string> k = {"name",
                                             "learning_rate",
                                             "weight_decay",
                                             "clipnorm",
                                             "clipvalue",
                                             "global_clipnorm",
                                             "use_ema",
                                             "ema_momentum",
                                             "ema_overwrite_frequency",
                                             "loss_scale_factor",
                                             "gradient_accumulation_steps",
                                             "jit_compile",
                                             "is_legacy_optimizer"};
  return k;
}

using OptimizerRegistry = Registry<OptimizerPtr, const Json&>;

OptimizerRegistry& registry() {
  static OptimizerRegistry* r = [] {
    auto* reg = new OptimizerRegistry("optimizer");  // never destroyed
    reg->add("SGD", [](const Json& c) -> OptimizerPtr { return std::make_shared<optimizers::SGD>(c); });
    reg->add("RMSprop", [](const Json& c) -> OptimizerPtr { return std::make_shared<optimizers::RMSprop>(c); });
    reg->add("Adam", [](const Json& c) -> OptimizerPtr { return std::make_shared<optimizers::Adam>(c); });
    reg->add("AdamW", [](const Json& c) -> OptimizerPtr { return std::make_shared<optimizers::AdamW>(c); });
    reg->add("Adagrad", [](const Json& c) -> OptimizerPtr { return std::make_shared<optimizers::Adagrad>(c); });
    reg->add("Adadelta", [](const Json& c) -> OptimizerPtr { return std::make_shared<optimizers::Adadelta>(c); });
    reg->add("Adamax", [](const Json& c) -> OptimizerPtr { return std::make_shared<optimizers::Adamax>(c); });
    reg->add("Nadam", [](const Json& c) -> OptimizerPtr { return std::make_shared<optimizers::Nadam>(c); });
    reg->add("Lion", [](const Json& c) -> OptimizerPtr { return std::make_shared<optimizers::Lion>(c); });
    reg->add("Ftrl", [](const Json& c) -> OptimizerPtr { return std::make_shared<optimizers::Ftrl>(c); });
    reg->add("LossScaleOptimizer", [](const Json& c) -> OptimizerPtr { return LossScaleOptimizer::from_config(c); });
    return reg;
  }();
  return *r;
}

Optimizer::Factory find_class(const std::string& cls) { return registry().find(cls); }

const std::map<std::string, std::string>& aliases() {
  static const std::map<std::string, std::string> a = {
      {"sgd", "SGD"},           {"rmsprop", "RMSprop"}, {"adam", "Adam"},   {"adamw", "AdamW"}, {"adagrad", "Adagrad"},
      {"adadelta", "Adadelta"}, {"adamax", "Adamax"},   {"nadam", "Nadam"}, {"lion", "Lion"},   {"ftrl", "Ftrl"}};
  return a;
}

}  // namespace

Optimizer::Optimizer(const Json& config, double default_learning_rate, const std::string& default_name)
    : lr_(default_learning_rate) {
  const Json c = config.is_null() ? Json::object() : config;
  if (!c.is_object()) throw ValueError(default_name + ": config must be a JSON object. Received: " + json_excerpt(c));
  name_ = get_or<std::string>(c, "name", default_name);
  const std::string owner = name_;

  if (c.contains("learning_rate") && !c["learning_rate"].is_null()) {
    const Json& lr = c["learning_rate"];
    if (lr.is_object()) {
      schedule_ = LearningRateSchedule::from_json(lr);
    } else if (lr.is_number() && lr.get<double>() >= 0 && std::isfinite(lr.get<double>())) {
      lr_ = lr.get<double>();
    } else {
      throw ValueError(owner +
                       ": `learning_rate` must be a non-negative number or a schedule "
                       "{\"class_name\", \"config\"}. Received: learning_rate=" +
                       json_excerpt(lr));
    }
  }
  bool set = false;
  weight_decay_ = optional_non_negative(c, "weight_decay", owner, &set);
  bool clipnorm_set = false, clipvalue_set = false, global_set = false;
  clipnorm_ = optional_non_negative(c, "clipnorm", owner, &clipnorm_set);
  clipvalue_ = optional_non_negative(c, "clipvalue", owner, &clipvalue_set);
  global_clipnorm_ = optional_non_negative(c, "global_clipnorm", owner, &global_set);
  if (int(clipnorm_set) + int(clipvalue_set) + int(global_set) > 1)
    throw ValueError(owner +
                     ": only one of `clipnorm`, `clipvalue` and `global_clipnorm` can be set. Received: "
                     "clipnorm=" +
                     (clipnorm_set ? num_str(clipnorm_) : "None") +
                     ", clipvalue=" + (clipvalue_set ? num_str(clipvalue_) : "None") +
                     ", global_clipnorm=" + (global_set ? num_str(global_clipnorm_) : "None"));
  // Keras's loss_scale_factor: kiln scales losses in the trainer instead.
  if (c.contains("loss_scale_factor") && !c["loss_scale_factor"].is_null())
    throw ValueError(owner + ": loss_scale_factor is not supported (use the trainer's loss scaling). Received: " +
                     json_excerpt(c["loss_scale_factor"]));
  if (c.contains("gradient_accumulation_steps") && !c["gradient_accumulation_steps"].is_null()) {
    const Json& v = c["gradient_accumulation_steps"];
    // Keras: a falsy value (0) turns it off; anything else must be an integer >= 2.
    const bool is_int = v.is_number_integer() || (v.is_number() && std::floor(v.get<double>()) == v.get<double>());
    if (!is_int || (v.get<double>() != 0 && v.get<double>() < 2))
      throw ValueError(owner +
                       ": `gradient_accumulation_steps` must be an integer >= 2. Received: "
                       "gradient_accumulation_steps=" +
                       v.dump());
    accumulation_steps_ = v.get<int64_t>();
  }
  if (c.contains("use_ema") && !c["use_ema"].is_null() && !c["use_ema"].is_boolean())
    throw ValueError(owner + ": `use_ema` must be true or false. Received: use_ema=" + c["use_ema"].dump());
  use_ema_ = get_or<bool>(c, "use_ema", false);
  if (c.contains("ema_momentum") && !c["ema_momentum"].is_null()) {
    const Json& v = c["ema_momentum"];
    if (!v.is_number() || !(v.get<double>() >= 0 && v.get<double>() <= 1))
      throw ValueError(owner + ": `ema_momentum` must be in the range [0, 1]. Received: ema_momentum=" + v.dump());
    ema_momentum_ = v.get<double>();
  }
  if (c.contains("ema_overwrite_frequency") && !c["ema_overwrite_frequency"].is_null()) {
    const Json& v = c["ema_overwrite_frequency"];
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      throw ValueError(owner +
                       ": `ema_overwrite_frequency` must be an integer >= 1 or null. Received: "
                       "ema_overwrite_frequency=" +
                       v.dump());
    ema_overwrite_frequency_ = v.get<int64_t>();
  }
}

void Optimizer::check_keys(const Json& config, const std::vector<std::string>& own) const {
  if (!config.is_object()) return;  // the base constructor reports it
  std::vector<std::string> known = own;
  known.insert(known.end(), base_keys().begin(), base_keys().end());
  check_config_keys(config, known, class_name() + " config");
}

double Optimizer::learning_rate() const { return schedule_ ? (*schedule_)(iterations_) : lr_; }

void Optimizer::set_learning_rate(double lr) {
  if (schedule_)
    throw StateError(name_ + ": cannot set the learning rate: it is a " + schedule_->class_name() +
                     " schedule. Set a constant learning_rate in the optimizer's config to adjust it by hand");
  if (!(lr >= 0) || !std::isfinite(lr))
    throw ValueError(name_ + ": the learning rate must be a non-negative number. Received: " + num_str(lr));
  lr_ = lr;
}

void Optimizer::exclude_from_weight_decay(const std::vector<std::string>& var_names) {
  exclude_from_wd_.insert(exclude_from_wd_.end(), var_names.begin(), var_names.end());
}

std::vector<at::Tensor> Optimizer::clip(std::vector<at::Tensor> grads) const {
  if (clipnorm_ > 0) {
    // Per gradient: g * clipnorm / max(||g||, clipnorm).
    for (auto& g : grads) {
      at::Tensor norm = g.to(at::kFloat).square().sum().sqrt();
      g = g * (clipnorm_ / at::clamp_min(norm, clipnorm_)).to(g.scalar_type());
    }
  } else if (global_clipnorm_ > 0) {
    at::Tensor sq = at::zeros({}, grads.empty() ? at::TensorOptions(at::kFloat) : grads[0].options().dtype(at::kFloat));
    for (auto& g : grads) sq = sq + g.to(at::kFloat).square().sum().to(sq.device());
    if (owns_) {
      // Sharded: each replica holds its own variables' gradients; the
      // global norm needs them all.
      if (auto d = distribution(); d && d->num_replicas() > 1) {
        std::vector<at::Tensor> t = {sq.reshape({1}).cpu()};
        d->all_reduce_sum(t);
        sq = t[0].reshape({}).to(sq.device());
      }
    }
    at::Tensor norm = sq.sqrt();
    // Keras's form: a NaN/inf norm makes the scale NaN rather than zeroing.
    at::Tensor scale = global_clipnorm_ * at::minimum(1.0 / norm, at::full({}, 1.0 / global_clipnorm_, norm.options()));
    scale = scale + (norm - norm);
    for (auto& g : grads) g = g * scale.to(g.device(), g.scalar_type());
  } else if (clipvalue_ > 0) {
    for (auto& g : grads) g = g.clamp(-clipvalue_, clipvalue_);
  }
  return grads;
}

void Optimizer::apply_gradients(const std::vector<at::Tensor>& grads, const std::vector<VariablePtr>& vars) {
  if (grads.size() != vars.size())
    throw ValueError(name_ + ": apply_gradients got " + std::to_string(grads.size()) + " gradients for " +
                     std::to_string(vars.size()) + " variables");
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> g;
  std::vector<Variable*> v;
  std::set<std::string> paths;
  for (size_t i = 0; i < vars.size(); ++i) {
    if (!vars[i]) throw ValueError(name_ + ": apply_gradients got a null variable at index " + std::to_string(i));
    if (!grads[i].defined()) continue;
    if (!paths.insert(vars[i]->path()).second)
      throw ValueError(name_ + ": two variables share the path '" + vars[i]->path() +
                       "'; optimizer state is keyed by path, so paths must be unique");
    if (!grads[i].sizes().equals(vars[i]->value().sizes()))
      throw ShapeError(name_ + ": gradient of shape " + sizes_str(grads[i]) + " for variable " + vars[i]->path() +
                       " of shape " + sizes_str(vars[i]->value()));
    g.push_back(grads[i].detach());
    v.push_back(vars[i].get());
  }
  if (g.empty() && !owns_) {
    if (vars.empty()) return;
    std::vector<std::string> names;
    for (auto& var : vars) names.push_back(var->path());
    throw ValueError(name_ + ": no gradients provided for any variable. Variables: " + join(names));
  }
  if (!prepare_gradients(g)) return;

  // Gradient accumulation (Keras's _backend_apply_gradients): add to the
  // accumulators, and on every N-th call update with their mean.
  bool update = true;
  if (accumulation_steps_ > 1) {
    update = (iterations_ + 1) % accumulation_steps_ == 0;
    for (size_t i = 0; i < v.size(); ++i) {
      at::Tensor value = v[i]->value();
      at::Tensor& acc = accumulators_[v[i]->path()];
      if (!acc.defined() || !acc.sizes().equals(value.sizes()))
        acc = at::zeros_like(value, at::MemoryFormat::Contiguous);
      else if (acc.device() != value.device() || acc.scalar_type() != value.scalar_type())
        acc = acc.to(value.device(), value.scalar_type());
      if (update) {
        g[i] = (g[i].to(value.device(), value.scalar_type()) + acc) / static_cast<double>(accumulation_steps_);
        acc.zero_();
      } else {
        acc.add_(g[i].to(value.device(), value.scalar_type()));
      }
    }
  }
  if (update) {
    if (owns_) {
      // Only the owned variables' updates; their owners do the others.
      std::vector<at::Tensor> og;
      std::vector<Variable*> ov;
      for (size_t i = 0; i < v.size(); ++i)
        if (owns_(v[i]->path())) og.push_back(g[i]), ov.push_back(v[i]);
      update_variables(std::move(og), ov);
    } else {
      update_variables(g, v);
    }
  }

  if (use_ema_) {
    // Every variable given (Keras: all trainable variables), with or without
    // a gradient this step.
    const double m = iterations() != 0 ? ema_momentum_ : 0.0;
    const bool overwrite = ema_overwrite_frequency_ > 0 && (iterations() + 1) % ema_overwrite_frequency_ == 0;
    for (auto& var : vars) {
      if (!owns(var->path())) continue;
      at::Tensor value = var->value();
      at::Tensor& avg = averages_[var->path()];
      if (!avg.defined() || !avg.sizes().equals(value.sizes()))
        avg = value.detach().clone(at::MemoryFormat::Contiguous);
      else if (avg.device() != value.device() || avg.scalar_type() != value.scalar_type())
        avg = avg.to(value.device(), value.scalar_type());
      avg.mul_(m).add_(value * (1.0 - m));
      if (overwrite) value.copy_(avg);
    }
  }
  ++iterations_;
}

void Optimizer::update_variables(std::vector<at::Tensor> g, const std::vector<Variable*>& v) {
  g = clip(std::move(g));
  const double lr = learning_rate();
  if (weight_decay_ > 0) {
    for (auto* var : v) {
      bool excluded = false;
      for (auto& pat : exclude_from_wd_)
        if (var->path().find(pat) != std::string::npos) excluded = true;
      if (excluded) continue;
      at::Tensor value = var->value();
      value.sub_(value * (weight_decay_ * lr));
    }
  }
  const std::vector<std::string> names = slot_names();
  std::vector<at::Tensor> grads, values;
  std::vector<std::vector<at::Tensor>*> all_slots;
  grads.reserve(v.size());
  values.reserve(v.size());
  all_slots.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    at::Tensor value = v[i]->value();
    auto& slots = slots_[v[i]->path()];
    if (slots.size() != names.size()) {
      slots.clear();
      for (size_t s = 0; s < names.size(); ++s)
        slots.push_back(at::full_like(value, slot_initial_value(s), at::MemoryFormat::Contiguous));
    } else {
      for (size_t s = 0; s < slots.size(); ++s) {
        if (!slots[s].sizes().equals(value.sizes()))
          throw ShapeError(name_ + ": optimizer slot " + v[i]->path() + "/" + names[s] + " has shape " +
                           sizes_str(slots[s]) + " but the variable has shape " + sizes_str(value));
        if (slots[s].device() != value.device() || slots[s].scalar_type() != value.scalar_type())
          slots[s] = slots[s].to(value.device(), value.scalar_type());
      }
    }
    grads.push_back(g[i].to(value.device(), value.scalar_type()));
    values.push_back(value);
    all_slots.push_back(&slots);
  }
  if (update_all(grads, values, all_slots, lr, iterations() + 1)) return;
  for (size_t i = 0; i < values.size(); ++i) update_step(grads[i], values[i], *all_slots[i], lr, iterations() + 1);
}

void Optimizer::finalize_variable_values(const std::vector<VariablePtr>& vars) {
  if (!use_ema_) return;
  at::NoGradGuard no_grad;
  for (auto& var : vars) {
    if (!var) continue;
    auto it = averages_.find(var->path());
    if (it == averages_.end()) continue;
    at::Tensor value = var->value();
    if (!it->second.sizes().equals(value.sizes()))
      throw ShapeError(name_ + ": moving average of " + var->path() + " has shape " + sizes_str(it->second) +
                       " but the variable has shape " + sizes_str(value));
    value.copy_(it->second);
  }
}

Json Optimizer::get_config() const {
  auto opt = [](double v) { return v > 0 ? Json(v) : Json(nullptr); };
  Json c;
  c["name"] = name_;
  c["learning_rate"] = schedule_ ? schedule_->to_json() : Json(lr_);
  c["weight_decay"] = opt(weight_decay_);
  c["clipnorm"] = opt(clipnorm_);
  c["global_clipnorm"] = opt(global_clipnorm_);
  c["clipvalue"] = opt(clipvalue_);
  c["use_ema"] = use_ema_;
  c["ema_momentum"] = ema_momentum_;
  c["ema_overwrite_frequency"] = ema_overwrite_frequency_ > 0 ? Json(ema_overwrite_frequency_) : Json(nullptr);
  c["loss_scale_factor"] = nullptr;
  c["gradient_accumulation_steps"] = accumulation_steps_ > 0 ? Json(accumulation_steps_) : Json(nullptr);
  return c;
}

std::map<std::string, at::Tensor> Optimizer::state_dict() const {
  std::map<std::string, at::Tensor> state;
  const std::vector<std::string> names = slot_names();
  for (const auto& [path, slots] : slots_)
    for (size_t s = 0; s < slots.size() && s < names.size(); ++s) state[path + "/" + names[s]] = slots[s].clone();
  for (const auto& [path, t] : averages_) state[path + "/average"] = t.clone();
  for (const auto& [path, t] : accumulators_) state[path + "/gradient_accumulator"] = t.clone();
  state["iterations"] = at::full({}, iterations_, at::kLong);
  if (!schedule_) state["learning_rate"] = at::full({}, lr_, at::kDouble);
  return state;
}

void Optimizer::load_state_dict(const std::map<std::string, at::Tensor>& state) {
  const std::vector<std::string> names = slot_names();
  std::map<std::string, std::vector<at::Tensor>> slots;
  std::map<std::string, at::Tensor> averages, accumulators;
  for (const auto& [key, t] : state) {
    if (key == "iterations" || key == "learning_rate") continue;
    const auto pos = key.rfind('/');
    const std::string slot = pos == std::string::npos ? key : key.substr(pos + 1);
    if (pos != std::string::npos && use_ema_ && slot == "average") {
      averages[key.substr(0, pos)] = t.detach().clone();
      continue;
    }
    if (pos != std::string::npos && accumulation_steps_ > 1 && slot == "gradient_accumulator") {
      accumulators[key.substr(0, pos)] = t.detach().clone();
      continue;
    }
    const auto it = std::find(names.begin(), names.end(), slot);
    if (pos == std::string::npos || it == names.end())
      throw ValueError(name_ + ": state entry '" + key + "' is not a slot of this " + class_name() +
                       " (slots: " + join(names) + ")");
    auto& v = slots[key.substr(0, pos)];
    v.resize(names.size());
    v[it - names.begin()] = t.detach().clone();
  }
  for (const auto& [path, v] : slots)
    for (size_t s = 0; s < v.size(); ++s)
      if (!v[s].defined())
        throw ValueError(name_ + ": state for variable '" + path + "' lacks its slot '" + names[s] + "'");
  slots_ = std::move(slots);
  averages_ = std::move(averages);
  accumulators_ = std::move(accumulators);
  drop_unowned();
  auto it = state.find("iterations");
  if (it != state.end()) iterations_ = it->second.item<int64_t>();
  it = state.find("learning_rate");
  if (it != state.end() && !schedule_) lr_ = it->second.item<double>();
}

void Optimizer::set_ownership(std::function<bool(const std::string& path)> owns) {
  owns_ = std::move(owns);
  drop_unowned();
}

void Optimizer::drop_unowned() {
  if (!owns_) return;
  for (auto it = slots_.begin(); it != slots_.end();) it = owns_(it->first) ? std::next(it) : slots_.erase(it);
  for (auto it = averages_.begin(); it != averages_.end();) it = owns_(it->first) ? std::next(it) : averages_.erase(it);
}

bool Optimizer::register_class(const std::string& class_name, Factory factory) {
  return registry().add(class_name, std::move(factory));
}

std::vector<std::string> Optimizer::known_names() {
  std::vector<std::string> names;
  for (auto& [alias, cls] : aliases()) names.push_back(alias);
  for (auto& cls : registry().names()) names.push_back(cls);
  return names;
}

OptimizerPtr Optimizer::get(const std::string& name) {
  auto a = aliases().find(name);
  Factory f = find_class(a != aliases().end() ? a->second : name);
  if (!f)
    throw ValueError("Could not interpret optimizer identifier: '" + name +
                     "'. Known optimizers: " + join(known_names()));
  return f(Json::object());
}

OptimizerPtr Optimizer::from_json(const Json& j) {
  if (j.is_string()) return get(j.get<std::string>());
  if (!j.is_object() || !j.contains("class_name") || !j["class_name"].is_string())
    throw ValueError("An optimizer must be a name or {\"class_name\": ..., \"config\": {...}}. Received: " +
                     json_excerpt(j));
  const std::string cls = j["class_name"].get<std::string>();
  Factory f = find_class(cls);
  if (!f) {
    auto a = aliases().find(cls);
    if (a != aliases().end()) f = find_class(a->second);
  }
  if (!f) throw ValueError("Unknown optimizer class '" + cls + "'. Known optimizers: " + join(known_names()));
  Json config = j.contains("config") && !j["config"].is_null() ? j["config"] : Json::object();
  return f(config);
}

}  // namespace kiln
