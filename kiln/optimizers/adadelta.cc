#include "kiln/optimizers/adadelta.h"

namespace kiln::optimizers {

namespace {
// Adadelta's own keys (after the base optimizer's).
const config::FieldTable<AdadeltaOptions>& adadelta_fields() {
  static const config::FieldTable<AdadeltaOptions> t = {config::field("rho", &AdadeltaOptions::rho).in_range(0, 1),
                                                        non_negative("epsilon", &AdadeltaOptions::epsilon)};
  return t;
}
}  // namespace

Adadelta::Adadelta(const Json& config) : Adadelta(read_optimizer_options(config, "Adadelta", adadelta_fields())) {}

Adadelta::Adadelta(const AdadeltaOptions& o) : Optimizer("Adadelta", o.base, o.learning_rate, "adadelta"), options_(o) {
  config::check_fields("Adadelta", options_, adadelta_fields());
}

void Adadelta::update_step(const at::Tensor& grad, at::Tensor& var, std::vector<at::Tensor>& slots, double lr,
                           int64_t) {
  at::Tensor& acc_g = slots[0];
  at::Tensor& acc_d = slots[1];
  acc_g.mul_(options_.rho).add_(grad.square() * (1.0 - options_.rho));
  at::Tensor delta = -(acc_d + options_.epsilon).sqrt() * grad / (acc_g + options_.epsilon).sqrt();
  acc_d.mul_(options_.rho).add_(delta.square() * (1.0 - options_.rho));
  var.add_(delta * lr);
}

Json Adadelta::get_config() const {
  Json c = Optimizer::get_config();
  config::write_fields(c, options_, adadelta_fields());
  return c;
}

}  // namespace kiln::optimizers
