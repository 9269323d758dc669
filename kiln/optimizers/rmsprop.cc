#include "kiln/optimizers/rmsprop.h"

namespace kiln::optimizers {

namespace {
// RMSprop's own keys (after the base optimizer's).
const config::FieldTable<RMSpropOptions>& rmsprop_fields() {
  static const config::FieldTable<RMSpropOptions> t = {
      config::field("rho", &RMSpropOptions::rho).in_range(0, 1, false),
      config::field("momentum", &RMSpropOptions::momentum).in_range(0, 1),
      non_negative("epsilon", &RMSpropOptions::epsilon), config::field("centered", &RMSpropOptions::centered)};
  return t;
}
}  // namespace

RMSprop::RMSprop(const Json& config) : RMSprop(read_optimizer_options(config, "RMSprop", rmsprop_fields())) {}

RMSprop::RMSprop(const RMSpropOptions& o) : Optimizer("RMSprop", o.base, o.learning_rate, "rmsprop"), options_(o) {
  config::check_fields("RMSprop", options_, rmsprop_fields());
}

std::vector<std::string> RMSprop::slot_names() const {
  std::vector<std::string> names = {"velocity"};
  if (options_.momentum > 0) names.push_back("momentum");
  if (options_.centered) names.push_back("average_gradient");
  return names;
}

void RMSprop::update_step(const at::Tensor& grad, at::Tensor& var, std::vector<at::Tensor>& slots, double lr,
                          int64_t step) {
  at::Tensor& velocity = slots[0];
  velocity.mul_(options_.rho).add_(grad.square() * (1.0 - options_.rho));
  at::Tensor denominator;
  if (options_.centered) {
    at::Tensor& average_grad = slots.back();
    average_grad.mul_(options_.rho).add_(grad * (1.0 - options_.rho));
    denominator = velocity - average_grad.square() + options_.epsilon;
  } else {
    denominator = velocity + options_.epsilon;
  }
  at::Tensor increment = grad * lr / denominator.sqrt();
  if (options_.momentum > 0) {
    at::Tensor& momentum = slots[1];
    momentum.mul_(options_.momentum).add_(increment);
    var.sub_(momentum);
  } else {
    var.sub_(increment);
  }
}

Json RMSprop::get_config() const {
  Json c = Optimizer::get_config();
  config::write_fields(c, options_, rmsprop_fields());
  return c;
}

}  // namespace kiln::optimizers
