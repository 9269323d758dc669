#include "kiln/optimizers/nadam.h"

#include <cmath>

#include "kiln/optimizers/betas.h"

namespace kiln::optimizers {

namespace {
// Nadam's own keys (after the base optimizer's).
const config::FieldTable<NadamOptions>& nadam_fields() {
  static const config::FieldTable<NadamOptions> t = beta_fields<NadamOptions>();
  return t;
}
}  // namespace

Nadam::Nadam(const Json& config) : Nadam(read_optimizer_options(config, "Nadam", nadam_fields())) {}

Nadam::Nadam(const NadamOptions& o) : Optimizer("Nadam", o.base, o.learning_rate, "nadam"), options_(o) {
  config::check_fields("Nadam", options_, nadam_fields());
}

double Nadam::u(int64_t t) const { return options_.beta_1 * (1.0 - 0.5 * std::pow(0.96, static_cast<double>(t))); }

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
  m.add_((grad - m) * (1.0 - options_.beta_1));
  v.add_((grad.square() - v) * (1.0 - options_.beta_2));
  at::Tensor m_hat = m * (u_next / (1.0 - p_next)) + grad * ((1.0 - u_t) / (1.0 - p_t));
  at::Tensor v_hat = v / (1.0 - std::pow(options_.beta_2, static_cast<double>(step)));
  var.sub_(m_hat * lr / (v_hat.sqrt() + options_.epsilon));
}

Json Nadam::get_config() const {
  Json c = Optimizer::get_config();
  config::write_fields(c, options_, nadam_fields());
  return c;
}

}  // namespace kiln::optimizers
