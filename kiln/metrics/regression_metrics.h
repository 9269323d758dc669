// Regression metrics (Keras's metrics.MeanAbsoluteError and
// MeanSquaredError): weighted means over samples of the per-sample error
// averaged over the last axis, the same per-sample values as the losses.
// RootMeanSquaredError and R2Score are described at their classes.
#pragma once

#include <optional>

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

// Keras's RootMeanSquaredError: sqrt of the weighted mean (over samples) of
// (y_pred - y_true)^2 averaged over the non-batch axes.
class RootMeanSquaredError : public Mean {
 public:
  explicit RootMeanSquaredError(std::string name = "root_mean_squared_error") : Mean(std::move(name)) {}
  static std::shared_ptr<RootMeanSquaredError> from_config(const Json& config);
  void update_state(const at::Tensor& y_true, const at::Tensor& y_pred,
                    const at::Tensor& sample_weight = at::Tensor()) override;
  double result() const override;
  std::string class_name() const override { return "RootMeanSquaredError"; }
};

// Keras 3's R2Score (coefficient of determination) on (batch, outputs)
// inputs ((N,) against (N, 1) is reconciled). Per output it accumulates,
// with weights w (shape (batch,) or (batch, outputs)): sum(w y), sum(w y^2),
// sum(w (y - y_pred)^2), sum(w), and the number of entries seen; then
//   total = sum(w y^2) - sum(w y)^2 / sum(w);  r2 = 1 - sse / total
// (an infinite r2, from a constant y_true, becomes 0). class_aggregation:
// "uniform_average" (mean over outputs, default), "variance_weighted_average"
// (weighted by total) or null (per output: result_per_class(); result() is
// then their mean). num_regressors p > 0 gives the adjusted score
// 1 - (1 - r2)(n - 1)/(n - p - 1), n the entry count, unless p >= n - 1
// (then the plain score, as Keras, which warns).
class R2Score : public Metric {
 public:
  explicit R2Score(std::optional<std::string> class_aggregation = std::string("uniform_average"),
                   int64_t num_regressors = 0, std::string name = "r2_score");
  static std::shared_ptr<R2Score> from_config(const Json& config);  // class_aggregation, num_regressors, name
  void update_state(const at::Tensor& y_true, const at::Tensor& y_pred,
                    const at::Tensor& sample_weight = at::Tensor()) override;
  double result() const override;
  at::Tensor result_per_class() const;  // float64; per output when class_aggregation is null
  void reset_state() override;
  std::vector<at::Tensor> variables() const override;
  std::string class_name() const override { return "R2Score"; }
  Json get_config() const override;
  bool higher_is_better() const override { return true; }

  struct Options {  // the config's keys besides name
    std::optional<std::string> class_aggregation = std::string("uniform_average");
    int64_t num_regressors = 0;
  };

 private:
  Options options_;
  at::Tensor sum_, squared_sum_, total_mse_, count_,
      num_samples_;  // float64, on the values' device; built on first update
};

}  // namespace kiln::metrics
