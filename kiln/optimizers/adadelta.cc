#include "kiln/optimizers/adadelta.h"

#include <sstream>

#include "kiln/core/error.h"

namespace kiln::optimizers {

namespace {
Json adadelta_config(const AdadeltaOptions& o) {
  Json c = optimizer_config(o.base, o.learning_rate);
  c["rho"] = o.rho;
  c["epsilon"] = o.epsilon;
  return c;
}
}  // namespace

Adadelta::Adadelta(const AdadeltaOptions& o) : Adadelta(adadelta_config(o)) {}

Adadelta::Adadelta(const Json& config)
    : Optimizer(config, 0.001, "adadelta"),
      rho_(get_or<double>(config, "rho", 0.95)),
      epsilon_(get_or<double>(config, "epsilon", 1e-7)) {
  check_keys(config, {"rho", "epsilon"});
  std::ostringstream os;
  if (!(rho_ >= 0.0 && rho_ <= 1.0))
    os << "Adadelta: `rho` must be in [0, 1]. Received: rho=" << rho_;
  else if (!(epsilon_ >= 0.0))
    os << "Adadelta: `epsilon` must be non-negative. Received: epsilon=" << epsilon_;
  if (!os.str().empty()) throw ValueError(os.str());
}

void Adadelta::update_step(const at::Tensor& grad, at::Tensor& var, std::vector<at::Tensor>& slots, double lr,
                           int64_t) {
  at::Tensor& acc_g = slots[0];
  at::Tensor& acc_d = slots[1];
  acc_g.mul_(rho_).add_(grad.square() * (1.0 - rho_));
  at::Tensor delta = -(acc_d + epsilon_).sqrt() * grad / (acc_g + epsilon_).sqrt();
  acc_d.mul_(rho_).add_(delta.square() * (1.0 - rho_));
  var.add_(delta * lr);
}

Json Adadelta::get_config() const {
  Json c = Optimizer::get_config();
  c["rho"] = rho_;
  c["epsilon"] = epsilon_;
  return c;
}

}  // namespace kiln::optimizers
