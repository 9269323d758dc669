#include "kiln/optimizers/lion.h"

#include <sstream>

#include "kiln/core/error.h"

namespace kiln::optimizers {

namespace {
Json lion_config(const LionOptions& o) {
  Json c = optimizer_config(o.base, o.learning_rate);
  c["beta_1"] = o.beta_1;
  c["beta_2"] = o.beta_2;
  return c;
}
}  // namespace

Lion::Lion(const LionOptions& o) : Lion(lion_config(o)) {}

Lion::Lion(const Json& config)
    : Optimizer(config, 0.001, "lion"),
      beta_1_(get_or<double>(config, "beta_1", 0.9)),
      beta_2_(get_or<double>(config, "beta_2", 0.99)) {
  check_keys(config, {"beta_1", "beta_2"});
  std::ostringstream os;
  if (!(beta_1_ > 0.0 && beta_1_ <= 1.0))
    os << "Lion: `beta_1` must be in the (0, 1] range; otherwise the optimizer degenerates to SignSGD. "
          "Received: beta_1="
       << beta_1_;
  else if (!(beta_2_ >= 0.0 && beta_2_ <= 1.0))
    os << "Lion: `beta_2` must be in [0, 1]. Received: beta_2=" << beta_2_;
  if (!os.str().empty()) throw ValueError(os.str());
}

void Lion::update_step(const at::Tensor& grad, at::Tensor& var, std::vector<at::Tensor>& slots, double lr, int64_t) {
  at::Tensor& m = slots[0];
  var.sub_((m * beta_1_ + grad * (1.0 - beta_1_)).sign() * lr);
  m.mul_(beta_2_).add_(grad * (1.0 - beta_2_));
}

Json Lion::get_config() const {
  Json c = Optimizer::get_config();
  c["beta_1"] = beta_1_;
  c["beta_2"] = beta_2_;
  return c;
}

}  // namespace kiln::optimizers
