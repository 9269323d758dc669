#include "kiln/optimizers/ftrl.h"

#include <sstream>

#include "kiln/core/error.h"

namespace kiln::optimizers {

namespace {
Json ftrl_config(const FtrlOptions& o) {
  Json c = optimizer_config(o.base, o.learning_rate);
  c["learning_rate_power"] = o.learning_rate_power;
  c["initial_accumulator_value"] = o.initial_accumulator_value;
  c["l1_regularization_strength"] = o.l1_regularization_strength;
  c["l2_regularization_strength"] = o.l2_regularization_strength;
  c["l2_shrinkage_regularization_strength"] = o.l2_shrinkage_regularization_strength;
  c["beta"] = o.beta;
  return c;
}
}  // namespace

Ftrl::Ftrl(const FtrlOptions& o) : Ftrl(ftrl_config(o)) {}

Ftrl::Ftrl(const Json& config)
    : Optimizer(config, 0.001, "ftrl"),
      learning_rate_power_(get_or<double>(config, "learning_rate_power", -0.5)),
      initial_accumulator_value_(get_or<double>(config, "initial_accumulator_value", 0.1)),
      l1_(get_or<double>(config, "l1_regularization_strength", 0.0)),
      l2_(get_or<double>(config, "l2_regularization_strength", 0.0)),
      l2_shrinkage_(get_or<double>(config, "l2_shrinkage_regularization_strength", 0.0)),
      beta_(get_or<double>(config, "beta", 0.0)) {
  check_keys(config, {"learning_rate_power", "initial_accumulator_value", "l1_regularization_strength",
                      "l2_regularization_strength", "l2_shrinkage_regularization_strength", "beta"});
  std::ostringstream os;
  if (!(learning_rate_power_ <= 0.0))
    os << "Ftrl: `learning_rate_power` must be negative or zero. Received: learning_rate_power="
       << learning_rate_power_;
  else if (!(initial_accumulator_value_ >= 0.0))
    os << "Ftrl: `initial_accumulator_value` must be positive or zero. Received: initial_accumulator_value="
       << initial_accumulator_value_;
  else if (!(l1_ >= 0.0))
    os << "Ftrl: `l1_regularization_strength` must be positive or zero. Received: "
          "l1_regularization_strength="
       << l1_;
  else if (!(l2_ >= 0.0))
    os << "Ftrl: `l2_regularization_strength` must be positive or zero. Received: "
          "l2_regularization_strength="
       << l2_;
  else if (!(l2_shrinkage_ >= 0.0))
    os << "Ftrl: `l2_shrinkage_regularization_strength` must be positive or zero. Received: "
          "l2_shrinkage_regularization_strength="
       << l2_shrinkage_;
  else if (!(beta_ >= 0.0))
    os << "Ftrl: `beta` must be positive or zero. Received: beta=" << beta_;
  if (!os.str().empty()) throw ValueError(os.str());
}

void Ftrl::update_step(const at::Tensor& grad, at::Tensor& var, std::vector<at::Tensor>& slots, double lr, int64_t) {
  if (!(lr > 0))
    throw ValueError(name() +
                     ": Ftrl needs a positive learning rate (it divides by it). Received: " + std::to_string(lr));
  at::Tensor& accum = slots[0];
  at::Tensor& linear = slots[1];
  const double p = -learning_rate_power_;
  const double l2 = l2_ + beta_ / (2.0 * lr);
  at::Tensor grad_to_use = grad + var * (2.0 * l2_shrinkage_);
  at::Tensor new_accum = accum + grad.square();
  at::Tensor new_pow = new_accum.pow(p);
  linear.add_(grad_to_use - (new_pow - accum.pow(p)) / lr * var);
  at::Tensor quadratic = new_pow / lr + 2.0 * l2;
  var.copy_((linear.clamp(-l1_, l1_) - linear) / quadratic);
  accum.copy_(new_accum);
}

Json Ftrl::get_config() const {
  Json c = Optimizer::get_config();
  c["learning_rate_power"] = learning_rate_power_;
  c["initial_accumulator_value"] = initial_accumulator_value_;
  c["l1_regularization_strength"] = l1_;
  c["l2_regularization_strength"] = l2_;
  c["l2_shrinkage_regularization_strength"] = l2_shrinkage_;
  c["beta"] = beta_;
  return c;
}

}  // namespace kiln::optimizers
