#include "kiln/losses/regression.h"

#include <sstream>

#include "kiln/core/error.h"
#include "kiln/losses/loss_fields.h"

namespace kiln::losses {
namespace {

// y_pred - y_true in float32 after Keras's rank reconciliation.
at::Tensor error(const at::Tensor& y_true_in, const at::Tensor& y_pred_in, const std::string& owner) {
  at::Tensor y_pred = y_pred_in.to(at::kFloat);
  at::Tensor y_true = y_true_in.to(y_pred.device(), at::kFloat);
  squeeze_or_expand_to_same_rank(y_true, y_pred);
  check_broadcastable(y_true, y_pred, owner + ": y_true and y_pred");
  return y_pred - y_true;
}

at::Tensor mean_last(const at::Tensor& t) { return t.dim() == 0 ? t : t.mean(-1); }

}  // namespace

MeanSquaredError::MeanSquaredError(std::string reduction, std::string name)
    : Loss(std::move(name), std::move(reduction)) {}

std::shared_ptr<MeanSquaredError> MeanSquaredError::from_config(const Json& c) {
  return plain_loss_from_config<MeanSquaredError>(c);
}

at::Tensor MeanSquaredError::call(const at::Tensor& y_true, const at::Tensor& y_pred) const {
  return mean_last(error(y_true, y_pred, class_name()).square());
}

MeanAbsoluteError::MeanAbsoluteError(std::string reduction, std::string name)
    : Loss(std::move(name), std::move(reduction)) {}

std::shared_ptr<MeanAbsoluteError> MeanAbsoluteError::from_config(const Json& c) {
  return plain_loss_from_config<MeanAbsoluteError>(c);
}

at::Tensor MeanAbsoluteError::call(const at::Tensor& y_true, const at::Tensor& y_pred) const {
  return mean_last(error(y_true, y_pred, class_name()).abs());
}

namespace {
const config::FieldTable<HuberOptions>& huber_fields() {
  static const auto t = loss_fields<HuberOptions>({config::field("delta", &HuberOptions::delta)});
  return t;
}
}  // namespace

Huber::Huber(const HuberOptions& o) : Loss(o.name, o.reduction), options_(o) {
  if (!(o.delta > 0)) {
    std::ostringstream os;
    os << "Huber: `delta` must be a positive number. Received: delta=" << o.delta;
    throw ValueError(os.str());
  }
}

std::shared_ptr<Huber> Huber::from_config(const Json& c) {
  return std::make_shared<Huber>(read_loss_config(c, "Huber", huber_fields()));
}

at::Tensor Huber::call(const at::Tensor& y_true, const at::Tensor& y_pred) const {
  at::Tensor e = error(y_true, y_pred, class_name());
  at::Tensor abs_e = e.abs();
  at::Tensor quadratic = 0.5 * e.square();
  const double delta = options_.delta;
  at::Tensor linear = delta * abs_e - 0.5 * delta * delta;
  return mean_last(at::where(abs_e <= delta, quadratic, linear));
}

Json Huber::get_config() const { return config::fields_json(options_, huber_fields()); }

}  // namespace kiln::losses
