#include "kiln/optimizers/ftrl.h"

#include "kiln/core/error.h"

namespace kiln::optimizers {

namespace {
// Ftrl's own keys (after the base optimizer's).
const config::FieldTable<FtrlOptions>& ftrl_fields() {
  static const config::FieldTable<FtrlOptions> t = {
      config::field("learning_rate_power", &FtrlOptions::learning_rate_power)
          .where([](double v) { return v <= 0; }, "a negative number or zero"),
      non_negative("initial_accumulator_value", &FtrlOptions::initial_accumulator_value),
      non_negative("l1_regularization_strength", &FtrlOptions::l1_regularization_strength),
      non_negative("l2_regularization_strength", &FtrlOptions::l2_regularization_strength),
      non_negative("l2_shrinkage_regularization_strength", &FtrlOptions::l2_shrinkage_regularization_strength),
      non_negative("beta", &FtrlOptions::beta)};
  return t;
}
}  // namespace

Ftrl::Ftrl(const Json& config) : Ftrl(read_optimizer_options(config, "Ftrl", ftrl_fields())) {}

Ftrl::Ftrl(const FtrlOptions& o) : Optimizer("Ftrl", o.base, o.learning_rate, "ftrl"), options_(o) {
  config::check_fields("Ftrl", options_, ftrl_fields());
}

void Ftrl::update_step(const at::Tensor& grad, at::Tensor& var, std::vector<at::Tensor>& slots, double lr, int64_t) {
  if (!(lr > 0))
    throw ValueError(name() +
                     ": Ftrl needs a positive learning rate (it divides by it). Received: " + std::to_string(lr));
  at::Tensor& accum = slots[0];
  at::Tensor& linear = slots[1];
  const double p = -options_.learning_rate_power;
  const double l2 = options_.l2_regularization_strength + options_.beta / (2.0 * lr);
  at::Tensor grad_to_use = grad + var * (2.0 * options_.l2_shrinkage_regularization_strength);
  at::Tensor new_accum = accum + grad.square();
  at::Tensor new_pow = new_accum.pow(p);
  linear.add_(grad_to_use - (new_pow - accum.pow(p)) / lr * var);
  at::Tensor quadratic = new_pow / lr + 2.0 * l2;
  var.copy_((linear.clamp(-options_.l1_regularization_strength, options_.l1_regularization_strength) - linear) /
            quadratic);
  accum.copy_(new_accum);
}

Json Ftrl::get_config() const {
  Json c = Optimizer::get_config();
  config::write_fields(c, options_, ftrl_fields());
  return c;
}

}  // namespace kiln::optimizers
