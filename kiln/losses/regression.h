// Regression losses (Keras's MeanSquaredError, MeanAbsoluteError, Huber):
// elementwise errors averaged over the last axis. y_true of shape (N,)
// against y_pred (N, 1) is reconciled as Keras does.
#pragma once

#include "kiln/losses/loss.h"

namespace kiln::losses {

// Per-sample mean((y_pred - y_true)^2, axis=-1).
class MeanSquaredError : public Loss {
 public:
  explicit MeanSquaredError(std::string reduction = "sum_over_batch_size", std::string name = "mean_squared_error");
  static std::shared_ptr<MeanSquaredError> from_config(const Json& config);
  at::Tensor call(const at::Tensor& y_true, const at::Tensor& y_pred) const override;
  std::string class_name() const override { return "MeanSquaredError"; }
};

// Per-sample mean(|y_pred - y_true|, axis=-1).
class MeanAbsoluteError : public Loss {
 public:
  explicit MeanAbsoluteError(std::string reduction = "sum_over_batch_size", std::string name = "mean_absolute_error");
  static std::shared_ptr<MeanAbsoluteError> from_config(const Json& config);
  at::Tensor call(const at::Tensor& y_true, const at::Tensor& y_pred) const override;
  std::string class_name() const override { return "MeanAbsoluteError"; }
};

// Per-sample mean over the last axis of 0.5 * e^2 where |e| <= delta, else
// delta * |e| - 0.5 * delta^2 (e = y_pred - y_true). delta must be > 0.
struct HuberOptions {
  double delta = 1.0;  // > 0
  std::string reduction = "sum_over_batch_size";
  std::string name = "huber_loss";
};

class Huber : public Loss {
 public:
  explicit Huber(const HuberOptions& options = {});
  // Keras config keys: delta, name, reduction.
  static std::shared_ptr<Huber> from_config(const Json& config);
  at::Tensor call(const at::Tensor& y_true, const at::Tensor& y_pred) const override;
  std::string class_name() const override { return "Huber"; }
  Json get_config() const override;
  double delta() const { return options_.delta; }

 private:
  HuberOptions options_;
};

}  // namespace kiln::losses
