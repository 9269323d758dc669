#include "kiln/optimizers/sgd.h"

namespace kiln::optimizers {

namespace {
// SGD's own keys (after the base optimizer's).
const config::FieldTable<SGDOptions>& sgd_fields() {
  static const config::FieldTable<SGDOptions> t = {config::field("momentum", &SGDOptions::momentum).in_range(0, 1),
                                                   config::field("nesterov", &SGDOptions::nesterov)};
  return t;
}
}  // namespace

SGD::SGD(const Json& config) : SGD(read_optimizer_options(config, "SGD", sgd_fields())) {}

SGD::SGD(const SGDOptions& o) : Optimizer("SGD", o.base, o.learning_rate, "SGD"), options_(o) {
  config::check_fields("SGD", options_, sgd_fields());
}

std::vector<std::string> SGD::slot_names() const {
  if (options_.momentum != 0) return {"momentum"};
  return {};
}

void SGD::update_step(const at::Tensor& grad, at::Tensor& var, std::vector<at::Tensor>& slots, double lr,
                      int64_t step) {
  if (options_.momentum == 0) {
    var.sub_(grad * lr);
    return;
  }
  at::Tensor& m = slots[0];
  m.mul_(options_.momentum).sub_(grad * lr);
  if (options_.nesterov)
    var.add_(m * options_.momentum - grad * lr);
  else
    var.add_(m);
}

Json SGD::get_config() const {
  Json c = Optimizer::get_config();
  config::write_fields(c, options_, sgd_fields());
  return c;
}

}  // namespace kiln::optimizers
