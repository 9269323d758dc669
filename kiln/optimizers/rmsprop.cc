#include "kiln/optimizers/rmsprop.h"

#include <sstream>

#include "kiln/core/error.h"

namespace kiln::optimizers {

namespace {
Json rmsprop_config(const RMSpropOptions& o) {
  Json c = optimizer_config(o.base, o.learning_rate);
  c["rho"] = o.rho;
  c["momentum"] = o.momentum;
  c["epsilon"] = o.epsilon;
  c["centered"] = o.centered;
  return c;
}
}  // namespace

RMSprop::RMSprop(const RMSpropOptions& o) : RMSprop(rmsprop_config(o)) {}

RMSprop::RMSprop(const Json& config)
    : Optimizer(config, 0.001, "rmsprop"),
      rho_(get_or<double>(config, "rho", 0.9)),
      momentum_(get_or<double>(config, "momentum", 0.0)),
      epsilon_(get_or<double>(config, "epsilon", 1e-7)),
      centered_(get_or<bool>(config, "centered", false)) {
  check_keys(config, {"rho", "momentum", "epsilon", "centered"});
  std::ostringstream os;
  if (!(rho_ >= 0.0 && rho_ < 1.0))
    os << "RMSprop: `rho` must be in [0, 1). Received: rho=" << rho_;
  else if (!(momentum_ >= 0.0 && momentum_ <= 1.0))
    os << "RMSprop: `momentum` must be in [0, 1]. Received: momentum=" << momentum_;
  else if (!(epsilon_ >= 0.0))
    os << "RMSprop: `epsilon` must be non-negative. Received: epsilon=" << epsilon_;
  if (!os.str().empty()) throw ValueError(os.str());
}

std::vector<std::string> RMSprop::slot_names() const {
  std::vector<std::string> names = {"velocity"};
  if (momentum_ > 0) names.push_back("momentum");
  if (centered_) names.push_back("average_gradient");
  return names;
}

void RMSprop::update_step(const at::Tensor& grad, at::Tensor& var, std::vector<at::Tensor>& slots, double lr,
                          int64_t step) {
  at::Tensor& velocity = slots[0];
  velocity.mul_(rho_).add_(grad.square() * (1.0 - rho_));
  at::Tensor denominator;
  if (centered_) {
    at::Tensor& average_grad = slots.back();
    average_grad.mul_(rho_).add_(grad * (1.0 - rho_));
    denominator = velocity - average_grad.square() + epsilon_;
  } else {
    denominator = velocity + epsilon_;
  }
  at::Tensor increment = grad * lr / denominator.sqrt();
  if (momentum_ > 0) {
    at::Tensor& momentum = slots[1];
    momentum.mul_(momentum_).add_(increment);
    var.sub_(momentum);
  } else {
    var.sub_(increment);
  }
}

Json RMSprop::get_config() const {
  Json c = Optimizer::get_config();
  c["rho"] = rho_;
  c["momentum"] = momentum_;
  c["epsilon"] = epsilon_;
  c["centered"] = centered_;
  return c;
}

}  // namespace kiln::optimizers
