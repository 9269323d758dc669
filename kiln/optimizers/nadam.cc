#include "kiln/optimizers/nadam.h"

#include <cmath>

#include "kiln/core/error.h"
#include "kiln/optimizers/betas.h"

namespace kiln::optimizers {

Nadam::Nadam(const NadamOptions& o) : Nadam(beta_optimizer_config(o)) {}

Nadam::Nadam(const Json& config)
    : Optimizer(config, 0.001, "nadam"),
      beta_1_(get_or<double>(config, "beta_1", 0.9)),
      beta_2_(get_or<double>(config, "beta_2", 0.999)),
      epsilon_(get_or<double>(config, "epsilon", 1e-7)) {
  check_keys(config, {"beta_1", "beta_2", "epsilon"});
  check_betas("Nadam", beta_1_, beta_2_, epsilon_);
}

double Nadam::u(int64_t t) const { return beta_1_ * (1.0 - 0.5 * std::pow(0.96, static_cast<double>(t))); }

double Nadam::u_product(int64_t t) {
  if (t < cached_step_) {
    cached_step_ = 0;
    cached_product_ = 1.0;
  }
  while (cached_step_ < t) cached_product_ *= u(++cached_step_);
  return cached_product_;
}

void Nadam::update_step(const at::Tensor& grad, at::Tensor& var, std::vector<at::Tensor>& slots, double lr,
                        int64_t step) {
  const double u_t = u(step), u_next = u(step + 1);
  const double p_t = u_product(step);
  const double p_next = p_t * u_next;
  at::Tensor& m = slots[0];
  at::Tensor& v = slots[1];
  m.add_((grad - m) * (1.0 - beta_1_));
  v.add_((grad.square() - v) * (1.0 - beta_2_));
  at::Tensor m_hat = m * (u_next / (1.0 - p_next)) + grad * ((1.0 - u_t) / (1.0 - p_t));
  at::Tensor v_hat = v / (1.0 - std::pow(beta_2_, static_cast<double>(step)));
  var.sub_(m_hat * lr / (v_hat.sqrt() + epsilon_));
}

Json Nadam::get_config() const {
  Json c = Optimizer::get_config();
  c["beta_1"] = beta_1_;
  c["beta_2"] = beta_2_;
  c["epsilon"] = epsilon_;
  return c;
}

}  // namespace kiln::optimizers
