#include "kiln/optimizers/adamax.h"

#include <cmath>

#include "kiln/core/error.h"
#include "kiln/optimizers/betas.h"

namespace kiln::optimizers {

Adamax::Adamax(const AdamaxOptions& o) : Adamax(beta_optimizer_config(o)) {}

Adamax::Adamax(const Json& config)
    : Optimizer(config, 0.001, "adamax"),
      beta_1_(get_or<double>(config, "beta_1", 0.9)),
      beta_2_(get_or<double>(config, "beta_2", 0.999)),
      epsilon_(get_or<double>(config, "epsilon", 1e-7)) {
  check_keys(config, {"beta_1", "beta_2", "epsilon"});
  check_betas("Adamax", beta_1_, beta_2_, epsilon_);
}

void Adamax::update_step(const at::Tensor& grad, at::Tensor& var, std::vector<at::Tensor>& slots, double lr,
                         int64_t step) {
  at::Tensor& m = slots[0];
  at::Tensor& u = slots[1];
  m.add_((grad - m) * (1.0 - beta_1_));
  u.copy_(at::maximum(u * beta_2_, grad.abs()));
  const double correction = 1.0 - std::pow(beta_1_, static_cast<double>(step));
  var.sub_(m * lr / ((u + epsilon_) * correction));
}

Json Adamax::get_config() const {
  Json c = Optimizer::get_config();
  c["beta_1"] = beta_1_;
  c["beta_2"] = beta_2_;
  c["epsilon"] = epsilon_;
  return c;
}

}  // namespace kiln::optimizers
