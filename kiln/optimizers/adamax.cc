#include "kiln/optimizers/adamax.h"

#include <cmath>

#include "kiln/optimizers/betas.h"

namespace kiln::optimizers {

namespace {
// Adamax's own keys (after the base optimizer's).
const config::FieldTable<AdamaxOptions>& adamax_fields() {
  static const config::FieldTable<AdamaxOptions> t = beta_fields<AdamaxOptions>();
  return t;
}
}  // namespace

Adamax::Adamax(const Json& config) : Adamax(read_optimizer_options(config, "Adamax", adamax_fields())) {}

Adamax::Adamax(const AdamaxOptions& o) : Optimizer("Adamax", o.base, o.learning_rate, "adamax"), options_(o) {
  config::check_fields("Adamax", options_, adamax_fields());
}

void Adamax::update_step(const at::Tensor& grad, at::Tensor& var, std::vector<at::Tensor>& slots, double lr,
                         int64_t step) {
  at::Tensor& m = slots[0];
  at::Tensor& u = slots[1];
  m.add_((grad - m) * (1.0 - options_.beta_1));
  u.copy_(at::maximum(u * options_.beta_2, grad.abs()));
  const double correction = 1.0 - std::pow(options_.beta_1, static_cast<double>(step));
  var.sub_(m * lr / ((u + options_.epsilon) * correction));
}

Json Adamax::get_config() const {
  Json c = Optimizer::get_config();
  config::write_fields(c, options_, adamax_fields());
  return c;
}

}  // namespace kiln::optimizers
