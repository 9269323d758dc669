// Keras's Hinge and SquaredHinge: y_true in {-1, 1}; when every entry of a
// batch's y_true is 0 or 1 it is first mapped to 2 y - 1 (Keras's
// convert_binary_labels_to_hinge). Averaged over the last axis:
//   hinge:         mean(max(1 - y_true * y_pred, 0))
//   squared_hinge: mean(max(1 - y_true * y_pred, 0)^2)
#pragma once

#include "kiln/losses/loss.h"

namespace kiln::losses {

class Hinge : public Loss {
 public:
  explicit Hinge(std::string reduction = "sum_over_batch_size", std::string name = "hinge");
  static std::shared_ptr<Hinge> from_config(const Json& config);  // keys: name, reduction
  at::Tensor call(const at::Tensor& y_true, const at::Tensor& y_pred) const override;
  std::string class_name() const override { return "Hinge"; }
};

class SquaredHinge : public Loss {
 public:
  explicit SquaredHinge(std::string reduction = "sum_over_batch_size", std::string name = "squared_hinge");
  static std::shared_ptr<SquaredHinge> from_config(const Json& config);  // keys: name, reduction
  at::Tensor call(const at::Tensor& y_true, const at::Tensor& y_pred) const override;
  std::string class_name() const override { return "SquaredHinge"; }
};

}  // namespace kiln::losses
