#include "kiln/optimizers/sgd.h"

#include <sstream>

#include "kiln/core/error.h"

namespace kiln::optimizers {

namespace {
Json sgd_config(const SGDOptions& o) {
  Json c = optimizer_config(o.base, o.learning_rate);
  c["momentum"] = o.momentum;
  c["nesterov"] = o.nesterov;
  return c;
}
}  // namespace

SGD::SGD(const SGDOptions& o) : SGD(sgd_config(o)) {}

SGD::SGD(const Json& config)
    : Optimizer(config, 0.01, "SGD"),
      momentum_(get_or<double>(config, "momentum", 0.0)),
      nesterov_(get_or<bool>(config, "nesterov", false)) {
  check_keys(config, {"momentum", "nesterov"});
  if (!(momentum_ >= 0.0 && momentum_ <= 1.0)) {
    std::ostringstream os;
    os << "SGD: `momentum` must be a float between [0, 1]. Received: momentum=" << momentum_;
    throw ValueError(os.str());
  }
}

std::vector<std::string> SGD::slot_names() const {
  if (momentum_ != 0) return {"momentum"};
  return {};
}

void SGD::update_step(const at::Tensor& grad, at::Tensor& var, std::vector<at::Tensor>& slots, double lr,
                      int64_t step) {
  if (momentum_ == 0) {
    var.sub_(grad * lr);
    return;
  }
  at::Tensor& m = slots[0];
  m.mul_(momentum_).sub_(grad * lr);
  if (nesterov_)
    var.add_(m * momentum_ - grad * lr);
  else
    var.add_(m);
}

Json SGD::get_config() const {
  Json c = Optimizer::get_config();
  c["momentum"] = momentum_;
  c["nesterov"] = nesterov_;
  return c;
}

}  // namespace kiln::optimizers
