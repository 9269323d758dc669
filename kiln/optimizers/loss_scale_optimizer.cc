#include "kiln/optimizers/loss_scale_optimizer.h"

#include <cmath>

#include "kiln/core/error.h"
#include "kiln/core/json_limits.h"
#include "kiln/core/variable.h"

namespace kiln {
namespace {

const config::FieldTable<LossScaleOptions>& loss_scale_fields() {
  using O = LossScaleOptions;
  static const config::FieldTable<O> t = {config::field("initial_scale", &O::initial_scale),
                                          config::field("dynamic_growth_steps", &O::dynamic_growth_steps),
                                          config::field("dynamic", &O::dynamic)};
  return t;
}

}  // namespace

OptimizerOptions LossScaleOptimizer::inner_base(const OptimizerPtr& inner, const std::string& name) {
  if (!inner) throw ValueError("LossScaleOptimizer: `inner_optimizer` is required (e.g. Optimizer::get(\"adam\"))");
  if (dynamic_cast<LossScaleOptimizer*>(inner.get()))
    throw ValueError("LossScaleOptimizer: the inner optimizer is already a LossScaleOptimizer");
  OptimizerOptions base = inner->base_;
  base.name = name.empty() ? "loss_scale_optimizer" : name;
  return base;
}

LearningRate LossScaleOptimizer::inner_learning_rate(const OptimizerPtr& inner) {
  if (!inner) return 0.0;  // inner_base reports it
  return inner->schedule_ ? LearningRate(inner->schedule_) : LearningRate(inner->lr_);
}

LossScaleOptimizer::LossScaleOptimizer(OptimizerPtr inner, const LossScaleOptions& o, const std::string& name)
    : Optimizer("LossScaleOptimizer", inner_base(inner, name), inner_learning_rate(inner), "loss_scale_optimizer"),
      inner_(std::move(inner)),
      options_(o) {
  if (!(o.initial_scale >= 1) || !std::isfinite(o.initial_scale))
    throw ValueError("LossScaleOptimizer: `initial_scale` must be a finite number >= 1. Received: initial_scale=" +
                     std::to_string(o.initial_scale));
  if (o.dynamic_growth_steps < 1)
    throw ValueError("LossScaleOptimizer: `dynamic_growth_steps` must be >= 1. Received: dynamic_growth_steps=" +
                     std::to_string(o.dynamic_growth_steps));
  scale_ = o.initial_scale;
  exclude_from_weight_decay(inner_->exclude_from_wd_);
}

std::shared_ptr<LossScaleOptimizer> LossScaleOptimizer::from_config(const Json& c) {
  config::Reader r(c, "LossScaleOptimizer");
  const Json* inner = r.get("inner_optimizer");
  if (!inner)
    throw ValueError("LossScaleOptimizer config needs `inner_optimizer` ({\"class_name\": \"Adam\", ...}). Received: " +
                     json_excerpt(c));
  const std::string name = r.string("name", "");
  LossScaleOptions o;
  config::read_fields(r, o, loss_scale_fields());
  r.finish();
  return std::make_shared<LossScaleOptimizer>(Optimizer::from_json(*inner), o, name);
}

Json LossScaleOptimizer::get_config() const {
  // The inner optimizer's config carries the live learning rate (which
  // ReduceLROnPlateau may have changed here).
  Json inner = inner_->to_json();
  Json mine = Optimizer::get_config();
  inner["config"]["learning_rate"] = mine["learning_rate"];
  Json c{{"name", name()}, {"inner_optimizer", inner}};
  config::write_fields(c, options_, loss_scale_fields());
  return c;
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
