#include "kiln/optimizers/adam.h"

#include <cmath>

#include "kiln/core/error.h"
#include "kiln/optimizers/betas.h"

namespace kiln::optimizers {
namespace {

// Adam's own keys (after the base optimizer's).
const config::FieldTable<AdamOptions>& adam_fields() {
  static const config::FieldTable<AdamOptions> t =
      beta_fields<AdamOptions>() + config::FieldTable<AdamOptions>{config::field("amsgrad", &AdamOptions::amsgrad)};
  return t;
}

// AdamW's default weight decay (Keras's 0.004) where none is given.
AdamWOptions with_default_weight_decay(AdamWOptions o) {
  if (!o.base.weight_decay) o.base.weight_decay = 0.004;
  return o;
}

AdamWOptions adamw_options(const Json& config) {
  if (config.is_object() && config.contains("weight_decay") && config["weight_decay"].is_null())
    throw ValueError("AdamW: argument `weight_decay` must be a float. Received: weight_decay=None");
  return read_optimizer_options(config, "AdamW", adam_fields());
}

}  // namespace

Adam::Adam(const Json& config) : Adam(read_optimizer_options(config, "Adam", adam_fields())) {}

Adam::Adam(const AdamOptions& o) : Adam(o, "Adam", "adam") {}

Adam::Adam(const AdamOptions& o, const std::string& class_name, const std::string& default_name)
    : Optimizer(class_name, o.base, o.learning_rate, default_name), options_(o) {
  config::check_fields(class_name, options_, adam_fields());
}

AdamW::AdamW(const Json& config) : AdamW(adamw_options(config)) {}

AdamW::AdamW(const AdamWOptions& o) : Adam(with_default_weight_decay(o), "AdamW", "adamw") {}

std::vector<std::string> Adam::slot_names() const {
  if (options_.amsgrad) return {"momentum", "velocity", "velocity_hat"};
  return {"momentum", "velocity"};
}

void Adam::update_step(const at::Tensor& grad, at::Tensor& var, std::vector<at::Tensor>& slots, double lr,
                       int64_t step) {
  const double t = static_cast<double>(step);
  const double alpha = lr * std::sqrt(1.0 - std::pow(options_.beta_2, t)) / (1.0 - std::pow(options_.beta_1, t));
  at::Tensor& m = slots[0];
  at::Tensor& v = slots[1];
  m.add_((grad - m) * (1.0 - options_.beta_1));
  v.add_((grad.square() - v) * (1.0 - options_.beta_2));
  at::Tensor denom_v = v;
  if (options_.amsgrad) {
    at::Tensor& v_hat = slots[2];
    v_hat.copy_(at::maximum(v_hat, v));
    denom_v = v_hat;
  }
  var.sub_(m * alpha / (denom_v.sqrt() + options_.epsilon));
}

bool Adam::update_all(const std::vector<at::Tensor>& grads, std::vector<at::Tensor>& vars,
                      std::vector<std::vector<at::Tensor>*>& slots, double lr, int64_t step) {
  last_fused_ = false;
  if (vars.empty()) return false;
  const at::Device device = vars[0].device();
  const at::ScalarType dtype = vars[0].scalar_type();
  if (!fused_.value_or(true)) return false;
  // The kernel takes one device and one floating dtype for all tensors.
  if (dtype != at::kFloat && dtype != at::kHalf && dtype != at::kBFloat16 && dtype != at::kDouble) return false;
  std::vector<at::Tensor> g, m, v, v_hat, steps;
  for (size_t i = 0; i < vars.size(); ++i) {
    if (vars[i].device() != device || vars[i].scalar_type() != dtype || !vars[i].is_contiguous()) return false;
    g.push_back(grads[i].contiguous());
    m.push_back((*slots[i])[0]);
    v.push_back((*slots[i])[1]);
    if (options_.amsgrad) v_hat.push_back((*slots[i])[2]);
  }
  const double t = static_cast<double>(step);
  // One step tensor read by every variable's update (the kernel does not
  // advance it): a single fill per step rather than one per variable.
  if (!step_.defined() || step_.device() != device)
    step_ = at::empty({}, at::TensorOptions().dtype(at::kFloat).device(device));
  step_.fill_(t);
  steps.assign(vars.size(), step_);
  const double eps = options_.epsilon / std::sqrt(1.0 - std::pow(options_.beta_2, t));
  at::_fused_adam_(vars, g, m, v, v_hat, steps, lr, options_.beta_1, options_.beta_2, /*weight_decay=*/0.0, eps,
                   options_.amsgrad,
                   /*maximize=*/false);
  last_fused_ = true;
  return true;
}

Json Adam::get_config() const {
  Json c = Optimizer::get_config();
  config::write_fields(c, options_, adam_fields());
  return c;
}

Json AdamW::get_config() const {
  Json c = Adam::get_config();
  if (c["weight_decay"].is_null()) c["weight_decay"] = 0.0;
  return c;
}

}  // namespace kiln::optimizers
