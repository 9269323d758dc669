#include "kiln/optimizers/adagrad.h"

namespace kiln::optimizers {

namespace {
// Adagrad's own keys (after the base optimizer's).
const config::FieldTable<AdagradOptions>& adagrad_fields() {
  static const config::FieldTable<AdagradOptions> t = {
      non_negative("initial_accumulator_value", &AdagradOptions::initial_accumulator_value),
      non_negative("epsilon", &AdagradOptions::epsilon)};
  return t;
}
}  // namespace

Adagrad::Adagrad(const Json& config) : Adagrad(read_optimizer_options(config, "Adagrad", adagrad_fields())) {}

Adagrad::Adagrad(const AdagradOptions& o) : Optimizer("Adagrad", o.base, o.learning_rate, "adagrad"), options_(o) {
  config::check_fields("Adagrad", options_, adagrad_fields());
}

void Adagrad::update_step(const at::Tensor& grad, at::Tensor& var, std::vector<at::Tensor>& slots, double lr, int64_t) {
  at::Tensor& acc = slots[0];
  acc.add_(grad.square());
  var.sub_(grad * lr / (acc + options_.epsilon).sqrt());
}

Json Adagrad::get_config() const {
  Json c = Optimizer::get_config();
  config::write_fields(c, options_, adagrad_fields());
  return c;
}

}  // namespace kiln::optimizers
