#include "kiln/optimizers/loss_scale_optimizer.h"

#include <cmath>

#include "kiln/core/config_keys.h"
#include "kiln/core/error.h"
#include "kiln/core/json_limits.h"
#include "kiln/core/variable.h"

namespace kiln {
namespace {

Json inner_config(const OptimizerPtr& inner, const std::string& name) {
  if (!inner) throw ValueError("LossScaleOptimizer: `inner_optimizer` is required (e.g. Optimizer::get(\"adam\"))");
  if (dynamic_cast<LossScaleOptimizer*>(inner.get()))
    throw ValueError("LossScaleOptimizer: the inner optimizer is already a LossScaleOptimizer");
  Json c = inner->get_config();
  c["name"] = name.empty() ? "loss_scale_optimizer" : name;
  return c;
}

}  // namespace

LossScaleOptimizer::LossScaleOptimizer(OptimizerPtr inner, const LossScaleOptions& o, const std::string& name)
    : Optimizer(inner_config(inner, name), 0.001, "loss_scale_optimizer"), inner_(std::move(inner)), options_(o) {
  if (!(o.initial_scale >= 1) || !std::isfinite(o.initial_scale))
    throw ValueError("LossScaleOptimizer: `initial_scale` must be a finite number >= 1. Received: initial_scale=" +
                     std::to_string(o.initial_scale));
  if (o.dynamic_growth_steps < 1)
    throw ValueError("LossScaleOptimizer: `dynamic_growth_steps` must be >= 1. Received: dynamic_growth_steps=" +
                     std::to_string(o.dynamic_growth_steps));
  scale_ = o.initial_scale;
  weight_decay_ = inner_->weight_decay_;
  exclude_from_weight_decay(inner_->exclude_from_wd_);
}

std::shared_ptr<LossScaleOptimizer> LossScaleOptimizer::from_config(const Json& c) {
  if (!c.is_object() || !c.contains("inner_optimizer"))
    throw ValueError("LossScaleOptimizer config needs `inner_optimizer` ({\"class_name\": \"Adam\", ...}). Received: " +
                     json_excerpt(c));
  check_config_keys(c, {"name", "inner_optimizer", "initial_scale", "dynamic_growth_steps", "dynamic"},
                    "LossScaleOptimizer config");
  LossScaleOptions o;
  if (c.contains("initial_scale") && !c["initial_scale"].is_null()) {
    if (!c["initial_scale"].is_number())
      throw ValueError("LossScaleOptimizer: `initial_scale` must be a number. Received: " +
                       json_excerpt(c["initial_scale"]));
    o.initial_scale = c["initial_scale"].get<double>();
  }
  if (c.contains("dynamic_growth_steps") && !c["dynamic_growth_steps"].is_null()) {
    if (!c["dynamic_growth_steps"].is_number_integer())
      throw ValueError("LossScaleOptimizer: `dynamic_growth_steps` must be an integer. Received: " +
                       json_excerpt(c["dynamic_growth_steps"]));
    o.dynamic_growth_steps = c["dynamic_growth_steps"].get<int64_t>();
  }
  if (c.contains("dynamic") && !c["dynamic"].is_null()) {
    if (!c["dynamic"].is_boolean())
      throw ValueError("LossScaleOptimizer: `dynamic` must be true or false. Received: " + json_excerpt(c["dynamic"]));
    o.dynamic = c["dynamic"].get<bool>();
  }
  return std::make_shared<LossScaleOptimizer>(Optimizer::from_json(c["inner_optimizer"]), o,
                                              get_or<std::string>(c, "name", ""));
}

Json LossScaleOptimizer::get_config() const {
  // The inner optimizer's config carries the live learning rate (which
  // ReduceLROnPlateau may have changed here).
  Json inner = inner_->to_json();
  Json mine = Optimizer::get_config();
  inner["config"]["learning_rate"] = mine["learning_rate"];
  return Json{{"name", name()},
              {"inner_optimizer", inner},
              {"initial_scale", options_.initial_scale},
              {"dynamic_growth_steps", options_.dynamic_growth_steps},
              {"dynamic", options_.dynamic}};
}

at::Tensor LossScaleOptimizer::scale_loss(const at::Tensor& loss) const { return loss * scale_; }

bool LossScaleOptimizer::prepare_gradients(std::vector<at::Tensor>& grads) {
  at::NoGradGuard ng;
  bool finite = true;
  for (auto& g : grads) {
    g = g / scale_;
    if (finite && !at::isfinite(g).all().item<bool>()) finite = false;
  }
  // Every replica must take the same decision, or their weights diverge.
  if (auto dist = distribution(); dist && dist->num_replicas() > 1) {
    std::vector<at::Tensor> flag = {at::full({1}, finite ? 0.0f : 1.0f, at::kFloat)};
    dist->all_reduce_sum(flag);
    finite = flag[0].item<float>() == 0.0f;
  }
  if (!finite) {
    ++skipped_;
    step_counter_ = 0;
    if (options_.dynamic) scale_ = std::max(1.0, scale_ / 2);
    return false;
  }
  if (options_.dynamic && ++step_counter_ >= options_.dynamic_growth_steps) {
    step_counter_ = 0;
    if (std::isfinite(scale_ * 2)) scale_ *= 2;
  }
  return true;
}

void LossScaleOptimizer::update_step(const at::Tensor& grad, at::Tensor& var, std::vector<at::Tensor>& slots, double lr,
                                     int64_t step) {
  inner_->update_step(grad, var, slots, lr, step);
}

std::vector<std::string> LossScaleOptimizer::slot_names() const { return inner_->slot_names(); }
double LossScaleOptimizer::slot_initial_value(size_t index) const { return inner_->slot_initial_value(index); }

std::map<std::string, at::Tensor> LossScaleOptimizer::state_dict() const {
  auto s = Optimizer::state_dict();
  s["loss_scale/dynamic_scale"] = at::full({}, scale_, at::kDouble);
  s["loss_scale/step_counter"] = at::full({}, step_counter_, at::kLong);
  return s;
}

void LossScaleOptimizer::load_state_dict(const std::map<std::string, at::Tensor>& state) {
  auto s = state;
  auto take = [&](const char* key) {
    auto it = s.find(key);
    at::Tensor t;
    if (it != s.end()) {
      t = it->second;
      s.erase(it);
    }
    return t;
  };
  at::Tensor scale = take("loss_scale/dynamic_scale"), counter = take("loss_scale/step_counter");
  Optimizer::load_state_dict(s);
  if (scale.defined()) scale_ = scale.item<double>();
  if (counter.defined()) step_counter_ = counter.item<int64_t>();
}

}  // namespace kiln
