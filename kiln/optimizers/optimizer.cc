#include "kiln/optimizers/optimizer.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <mutex>
#include <set>
#include <sstream>

#include "kiln/core/error.h"
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

Optimizer::Optimizer(const std::string& class_name, OptimizerOptions base, const LearningRate& learning_rate,
                     const std::string& default_name)
    : base_(std::move(base)) {
  if (base_.name.empty()) base_.name = default_name;
  config::check_fields(class_name, base_, optimizer_base_fields());
  check_learning_rate(class_name, learning_rate);
  if (const auto* s = std::get_if<SchedulePtr>(&learning_rate))
    schedule_ = *s;
  else
    lr_ = std::get<double>(learning_rate);
  const auto& o = base_;
  if (int(o.clipnorm.has_value()) + int(o.clipvalue.has_value()) + int(o.global_clipnorm.has_value()) > 1) {
    auto str = [](const std::optional<double>& v) { return v ? num_str(*v) : std::string("None"); };
    throw ValueError(class_name + ": only one of `clipnorm`, `clipvalue` and `global_clipnorm` can be set. Received: " +
                     "clipnorm=" + str(o.clipnorm) + ", clipvalue=" + str(o.clipvalue) +
                     ", global_clipnorm=" + str(o.global_clipnorm));
  }
}

double Optimizer::learning_rate() const { return schedule_ ? (*schedule_)(iterations_) : lr_; }

void Optimizer::set_learning_rate(double lr) {
  if (schedule_)
    throw StateError(name() + ": cannot set the learning rate: it is a " + schedule_->class_name() +
                     " schedule. Set a constant learning_rate in the optimizer's config to adjust it by hand");
  if (!(lr >= 0) || !std::isfinite(lr))
    throw ValueError(name() + ": the learning rate must be a non-negative number. Received: " + num_str(lr));
  lr_ = lr;
}

void Optimizer::exclude_from_weight_decay(const std::vector<std::string>& var_names) {
  exclude_from_wd_.insert(exclude_from_wd_.end(), var_names.begin(), var_names.end());
}

std::vector<at::Tensor> Optimizer::clip(std::vector<at::Tensor> grads) const {
  const double clipnorm = base_.clipnorm.value_or(0), global_clipnorm = base_.global_clipnorm.value_or(0),
               clipvalue = base_.clipvalue.value_or(0);
  if (clipnorm > 0) {
    // Per gradient: g * clipnorm / max(||g||, clipnorm).
    for (auto& g : grads) {
      at::Tensor norm = g.to(at::kFloat).square().sum().sqrt();
      g = g * (clipnorm / at::clamp_min(norm, clipnorm)).to(g.scalar_type());
    }
  } else if (global_clipnorm > 0) {
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
    at::Tensor scale = global_clipnorm * at::minimum(1.0 / norm, at::full({}, 1.0 / global_clipnorm, norm.options()));
    scale = scale + (norm - norm);
    for (auto& g : grads) g = g * scale.to(g.device(), g.scalar_type());
  } else if (clipvalue > 0) {
    for (auto& g : grads) g = g.clamp(-clipvalue, clipvalue);
  }
  return grads;
}

void Optimizer::apply_gradients(const std::vector<at::Tensor>& grads, const std::vector<VariablePtr>& vars) {
  if (grads.size() != vars.size())
    throw ValueError(name() + ": apply_gradients got " + std::to_string(grads.size()) + " gradients for " +
                     std::to_string(vars.size()) + " variables");
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> g;
  std::vector<Variable*> v;
  std::set<std::string> paths;
  for (size_t i = 0; i < vars.size(); ++i) {
    if (!vars[i]) throw ValueError(name() + ": apply_gradients got a null variable at index " + std::to_string(i));
    if (!grads[i].defined()) continue;
    if (!paths.insert(vars[i]->path()).second)
      throw ValueError(name() + ": two variables share the path '" + vars[i]->path() +
                       "'; optimizer state is keyed by path, so paths must be unique");
    if (!grads[i].sizes().equals(vars[i]->value().sizes()))
      throw ShapeError(name() + ": gradient of shape " + sizes_str(grads[i]) + " for variable " + vars[i]->path() +
                       " of shape " + sizes_str(vars[i]->value()));
    g.push_back(grads[i].detach());
    v.push_back(vars[i].get());
  }
  if (g.empty() && !owns_) {
    if (vars.empty()) return;
    std::vector<std::string> names;
    for (auto& var : vars) names.push_back(var->path());
    throw ValueError(name() + ": no gradients provided for any variable. Variables: " + join(names));
  }
  if (!prepare_gradients(g)) return;

  // Gradient accumulation (Keras's _backend_apply_gradients): add to the
  // accumulators, and on every N-th call update with their mean.
  bool update = true;
  if (base_.gradient_accumulation_steps > 1) {
    update = (iterations_ + 1) % base_.gradient_accumulation_steps == 0;
    for (size_t i = 0; i < v.size(); ++i) {
      at::Tensor value = v[i]->value();
      at::Tensor& acc = accumulators_[v[i]->path()];
      if (!acc.defined() || !acc.sizes().equals(value.sizes()))
        acc = at::zeros_like(value, at::MemoryFormat::Contiguous);
      else if (acc.device() != value.device() || acc.scalar_type() != value.scalar_type())
        acc = acc.to(value.device(), value.scalar_type());
      if (update) {
        g[i] = (g[i].to(value.device(), value.scalar_type()) + acc) /
               static_cast<double>(base_.gradient_accumulation_steps);
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

  if (base_.use_ema) {
    // Every variable given (Keras: all trainable variables), with or without
    // a gradient this step.
    const double m = iterations() != 0 ? base_.ema_momentum : 0.0;
    const int64_t every = base_.ema_overwrite_frequency.value_or(0);
    const bool overwrite = every > 0 && (iterations() + 1) % every == 0;
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
  const double weight_decay = this->weight_decay();
  if (weight_decay > 0) {
    for (auto* var : v) {
      bool excluded = false;
      for (auto& pat : exclude_from_wd_)
        if (var->path().find(pat) != std::string::npos) excluded = true;
      if (excluded) continue;
      at::Tensor value = var->value();
      value.sub_(value * (weight_decay * lr));
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
          throw ShapeError(name() + ": optimizer slot " + v[i]->path() + "/" + names[s] + " has shape " +
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
  if (!base_.use_ema) return;
  at::NoGradGuard no_grad;
  for (auto& var : vars) {
    if (!var) continue;
    auto it = averages_.find(var->path());
    if (it == averages_.end()) continue;
    at::Tensor value = var->value();
    if (!it->second.sizes().equals(value.sizes()))
      throw ShapeError(name() + ": moving average of " + var->path() + " has shape " + sizes_str(it->second) +
                       " but the variable has shape " + sizes_str(value));
    value.copy_(it->second);
  }
}

Json Optimizer::get_config() const {
  Json c;
  c["name"] = base_.name;
  c["learning_rate"] = schedule_ ? schedule_->to_json() : Json(lr_);
  config::write_fields(c, base_, optimizer_base_fields());
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
    if (pos != std::string::npos && base_.use_ema && slot == "average") {
      averages[key.substr(0, pos)] = t.detach().clone();
      continue;
    }
    if (pos != std::string::npos && base_.gradient_accumulation_steps > 1 && slot == "gradient_accumulator") {
      accumulators[key.substr(0, pos)] = t.detach().clone();
      continue;
    }
    const auto it = std::find(names.begin(), names.end(), slot);
    if (pos == std::string::npos || it == names.end())
      throw ValueError(name() + ": state entry '" + key + "' is not a slot of this " + class_name() +
                       " (slots: " + join(names) + ")");
    auto& v = slots[key.substr(0, pos)];
    v.resize(names.size());
    v[it - names.begin()] = t.detach().clone();
  }
  for (const auto& [path, v] : slots)
    for (size_t s = 0; s < v.size(); ++s)
      if (!v[s].defined())
        throw ValueError(name() + ": state for variable '" + path + "' lacks its slot '" + names[s] + "'");
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
