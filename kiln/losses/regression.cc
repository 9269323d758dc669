#include "kiln/losses/regression.h"

#include <sstream>

#include "kiln/core/error.h"

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
  check_keys(c, {}, "MeanSquaredError");
  return std::make_shared<MeanSquaredError>(get_or<std::string>(c, "reduction", "sum_over_batch_size"),
                                            get_or<std::string>(c, "name", "mean_squared_error"));
}

at::Tensor MeanSquaredError::call(const at::Tensor& y_true, const at::Tensor& y_pred) const {
  return mean_last(error(y_true, y_pred, class_name()).square());
}

MeanAbsoluteError::MeanAbsoluteError(std::string reduction, std::string name)
    : Loss(std::move(name), std::move(reduction)) {}

std::shared_ptr<MeanAbsoluteError> MeanAbsoluteError::from_config(const Json& c) {
  check_keys(c, {}, "MeanAbsoluteError");
  return std::make_shared<MeanAbsoluteError>(get_or<std::string>(c, "reduction", "sum_over_batch_size"),
                                             get_or<std::string>(c, "name", "mean_absolute_error"));
}

at::Tensor MeanAbsoluteError::call(const at::Tensor& y_true, const at::Tensor& y_pred) const {
  return mean_last(error(y_true, y_pred, class_name()).abs());
}

Huber::Huber(const HuberOptions& o) : Loss(o.name, o.reduction), delta_(o.delta) {
  if (!(delta_ > 0)) {
    std::ostringstream os;
    os << "Huber: `delta` must be a positive number. Received: delta=" << delta_;
    throw ValueError(os.str());
  }
}

std::shared_ptr<Huber> Huber::from_config(const Json& c) {
  check_keys(c, {"delta"}, "Huber");
  return std::make_shared<Huber>(HuberOptions{.delta = get_or<double>(c, "delta", 1.0),
                                              .reduction = get_or<std::string>(c, "reduction", "sum_over_batch_size"),
                                              .name = get_or<std::string>(c, "name", "huber_loss")});
}

at::Tensor Huber::call(const at::Tensor& y_true, const at::Tensor& y_pred) const {
  at::Tensor e = error(y_true, y_pred, class_name());
  at::Tensor abs_e = e.abs();
  at::Tensor quadratic = 0.5 * e.square();
  at::Tensor linear = delta_ * abs_e - 0.5 * delta_ * delta_;
  return mean_last(at::where(abs_e <= delta_, quadratic, linear));
}

Json Huber::get_config() const {
  Json c = Loss::get_config();
  c["delta"] = delta_;
  return c;
}

}  // namespace kiln::losses
