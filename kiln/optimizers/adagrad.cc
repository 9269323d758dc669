#include "kiln/optimizers/adagrad.h"

#include <sstream>

#include "kiln/core/error.h"

namespace kiln::optimizers {

namespace {
Json adagrad_config(const AdagradOptions& o) {
  Json c = optimizer_config(o.base, o.learning_rate);
  c["initial_accumulator_value"] = o.initial_accumulator_value;
  c["epsilon"] = o.epsilon;
  return c;
}
}  // namespace

Adagrad::Adagrad(const AdagradOptions& o) : Adagrad(adagrad_config(o)) {}

Adagrad::Adagrad(const Json& config)
    : Optimizer(config, 0.001, "adagrad"),
      initial_accumulator_value_(get_or<double>(config, "initial_accumulator_value", 0.1)),
      epsilon_(get_or<double>(config, "epsilon", 1e-7)) {
  check_keys(config, {"initial_accumulator_value", "epsilon"});
  std::ostringstream os;
  if (!(initial_accumulator_value_ >= 0.0))
    os << "Adagrad: `initial_accumulator_value` must be non-negative. Received: initial_accumulator_value="
       << initial_accumulator_value_;
  else if (!(epsilon_ >= 0.0))
    os << "Adagrad: `epsilon` must be non-negative. Received: epsilon=" << epsilon_;
  if (!os.str().empty()) throw ValueError(os.str());
}

void Adagrad::update_step(const at::Tensor& grad, at::Tensor& var, std::vector<at::Tensor>& slots, double lr, int64_t) {
  at::Tensor& acc = slots[0];
  acc.add_(grad.square());
  var.sub_(grad * lr / (acc + epsilon_).sqrt());
}

Json Adagrad::get_config() const {
  Json c = Optimizer::get_config();
  c["initial_accumulator_value"] = initial_accumulator_value_;
  c["epsilon"] = epsilon_;
  return c;
}

}  // namespace kiln::optimizers
