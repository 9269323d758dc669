#include "kiln/optimizers/adam.h"
#include "kiln/optimizers/betas.h"

#include <cmath>

#include "kiln/core/error.h"

namespace kiln::optimizers {
namespace {

Json with_default_weight_decay(const Json& config) {
  Json c = config.is_null() ? Json::object() : config;
  if (!c.is_object()) return c;  // the base constructor reports it
  if (c.contains("weight_decay") && c["weight_decay"].is_null())
    throw ValueError("AdamW: argument `weight_decay` must be a float. Received: weight_decay=None");
  if (!c.contains("weight_decay")) c["weight_decay"] = 0.004;
  return c;
}

}  // namespace

namespace {
Json adam_config(const AdamOptions& o) {
  Json c = beta_optimizer_config(o);
  c["amsgrad"] = o.amsgrad;
  return c;
}
}  // namespace

Adam::Adam(const AdamOptions& o) : Adam(adam_config(o)) {}

AdamW::AdamW(const AdamWOptions& o) : AdamW(adam_config(o)) {}

Adam::Adam(const Json& config) : Adam(config, "adam") {}

Adam::Adam(const Json& config, const std::string& default_name)
    : Optimizer(config, 0.001, default_name),
      beta_1_(get_or<double>(config, "beta_1", 0.9)),
      beta_2_(get_or<double>(config, "beta_2", 0.999)),
      epsilon_(get_or<double>(config, "epsilon", 1e-7)),
      amsgrad_(get_or<bool>(config, "amsgrad", false)) {
  check_keys(config, {"beta_1", "beta_2", "epsilon", "amsgrad"});
  check_betas(class_name(), beta_1_, beta_2_, epsilon_);
}

std::vector<std::string> Adam::slot_names() const {
  if (amsgrad_) return {"momentum", "velocity", "velocity_hat"};
  return {"momentum", "velocity"};
}

void Adam::update_step(const at::Tensor& grad, at::Tensor& var, std::vector<at::Tensor>& slots, double lr,
                       int64_t step) {
  const double t = static_cast<double>(step);
  const double alpha = lr * std::sqrt(1.0 - std::pow(beta_2_, t)) / (1.0 - std::pow(beta_1_, t));
  at::Tensor& m = slots[0];
  at::Tensor& v = slots[1];
  m.add_((grad - m) * (1.0 - beta_1_));
  v.add_((grad.square() - v) * (1.0 - beta_2_));
  at::Tensor denom_v = v;
  if (amsgrad_) {
    at::Tensor& v_hat = slots[2];
    v_hat.copy_(at::maximum(v_hat, v));
    denom_v = v_hat;
  }
  var.sub_(m * alpha / (denom_v.sqrt() + epsilon_));
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
    if (amsgrad_) v_hat.push_back((*slots[i])[2]);
  }
  const double t = static_cast<double>(step);
  // One step tensor read by every variable's update (the kernel does not
  // advance it): a single fill per step rather than one per variable.
  if (!step_.defined() || step_.device() != device)
    step_ = at::empty({}, at::TensorOptions().dtype(at::kFloat).device(device));
  step_.fill_(t);
  steps.assign(vars.size(), step_);
  const double eps = epsilon_ / std::sqrt(1.0 - std::pow(beta_2_, t));
  at::_fused_adam_(vars, g, m, v, v_hat, steps, lr, beta_1_, beta_2_, /*weight_decay=*/0.0, eps, amsgrad_,
                   /*maximize=*/false);
  last_fused_ = true;
  return true;
}

Json Adam::get_config() const {
  Json c = Optimizer::get_config();
  c["beta_1"] = beta_1_;
  c["beta_2"] = beta_2_;
  c["epsilon"] = epsilon_;
  c["amsgrad"] = amsgrad_;
  return c;
}

AdamW::AdamW(const Json& config) : Adam(with_default_weight_decay(config), "adamw") {}

}  // namespace kiln::optimizers
