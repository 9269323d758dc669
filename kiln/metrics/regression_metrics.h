// Regression metrics (Keras's metrics.MeanAbsoluteError and
// MeanSquaredError): weighted means over samples of the per-sample error
// averaged over the last axis, the same per-sample values as the losses.
#pragma once

#include "kiln/metrics/metric.h"

namespace kiln::metrics {

class MeanAbsoluteError : public MeanMetricWrapper {
 public:
  explicit MeanAbsoluteError(std::string name = "mean_absolute_error") : MeanMetricWrapper(std::move(name)) {}
  static std::shared_ptr<MeanAbsoluteError> from_config(const Json& config);
  at::Tensor values(const at::Tensor& y_true, const at::Tensor& y_pred) const override;
  std::string class_name() const override { return "MeanAbsoluteError"; }
};

class MeanSquaredError : public MeanMetricWrapper {
 public:
  explicit MeanSquaredError(std::string name = "mean_squared_error") : MeanMetricWrapper(std::move(name)) {}
  static std::shared_ptr<MeanSquaredError> from_config(const Json& config);
  at::Tensor values(const at::Tensor& y_true, const at::Tensor& y_pred) const override;
  std::string class_name() const override { return "MeanSquaredError"; }
};

}  // namespace kiln::metrics
