#include "kiln/optimizers/lion.h"

namespace kiln::optimizers {

namespace {
// Lion's own keys (after the base optimizer's).
const config::FieldTable<LionOptions>& lion_fields() {
  static const config::FieldTable<LionOptions> t = {
      config::field("beta_1", &LionOptions::beta_1)
          .where([](double v) { return v > 0 && v <= 1; },
                 "a float in (0, 1] (otherwise the optimizer degenerates to SignSGD)"),
      config::field("beta_2", &LionOptions::beta_2).in_range(0, 1)};
  return t;
}
}  // namespace

Lion::Lion(const Json& config) : Lion(read_optimizer_options(config, "Lion", lion_fields())) {}

Lion::Lion(const LionOptions& o) : Optimizer("Lion", o.base, o.learning_rate, "lion"), options_(o) {
  config::check_fields("Lion", options_, lion_fields());
}

void Lion::update_step(const at::Tensor& grad, at::Tensor& var, std::vector<at::Tensor>& slots, double lr, int64_t) {
  at::Tensor& m = slots[0];
  var.sub_((m * options_.beta_1 + grad * (1.0 - options_.beta_1)).sign() * lr);
  m.mul_(options_.beta_2).add_(grad * (1.0 - options_.beta_2));
}

Json Lion::get_config() const {
  Json c = Optimizer::get_config();
  config::write_fields(c, options_, lion_fields());
  return c;
}

}  // namespace kiln::optimizers
