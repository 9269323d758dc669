#include "kiln/metrics/regression_metrics.h"

#include "kiln/losses/regression.h"

namespace kiln::metrics {

std::shared_ptr<MeanAbsoluteError> MeanAbsoluteError::from_config(const Json& c) {
  check_keys(c, {}, "MeanAbsoluteError");
  return std::make_shared<MeanAbsoluteError>(get_or<std::string>(c, "name", "mean_absolute_error"));
}

at::Tensor MeanAbsoluteError::values(const at::Tensor& y_true, const at::Tensor& y_pred) const {
  static const losses::MeanAbsoluteError fn;
  return fn.call(y_true, y_pred);
}

std::shared_ptr<MeanSquaredError> MeanSquaredError::from_config(const Json& c) {
  check_keys(c, {}, "MeanSquaredError");
  return std::make_shared<MeanSquaredError>(get_or<std::string>(c, "name", "mean_squared_error"));
}

at::Tensor MeanSquaredError::values(const at::Tensor& y_true, const at::Tensor& y_pred) const {
  static const losses::MeanSquaredError fn;
  return fn.call(y_true, y_pred);
}

}  // namespace kiln::metrics
