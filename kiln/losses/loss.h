// Losses with Keras's names, defaults and reductions.
//
//   auto loss = Loss::get("sparse_categorical_crossentropy");
//   at::Tensor l = (*loss)(y_true, y_pred);            // scalar, float32
//   at::Tensor l = (*loss)(y_true, y_pred, weights);   // per-sample weights
//
// call() returns per-sample losses (shape (batch,), mean over the last axis
// where Keras averages, e.g. MSE); operator() applies sample weights and the
// reduction: "sum_over_batch_size" (Keras's default: sum / batch size),
// "sum", "mean" (sum / sum of weights... Keras 3: mean of weighted values),
// or "none". Losses are always computed in float32 (mixed precision).
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>

#include "kiln/core/json.h"

namespace kiln {

class Loss {
 public:
  explicit Loss(std::string name, std::string reduction = "sum_over_batch_size");
  virtual ~Loss() = default;

  at::Tensor operator()(const at::Tensor& y_true, const at::Tensor& y_pred,
                        const at::Tensor& sample_weight = at::Tensor()) const;
  // Per-sample losses, shape (batch,), float32.
  virtual at::Tensor call(const at::Tensor& y_true, const at::Tensor& y_pred) const = 0;

  const std::string& name() const { return name_; }
  const std::string& reduction() const { return reduction_; }
  virtual std::string class_name() const = 0;
  virtual Json get_config() const;  // name, reduction + own keys
  Json to_json() const;             // {"class_name": ..., "config": ...}

  // Keras names: "sparse_categorical_crossentropy", "categorical_crossentropy",
  // "binary_crossentropy", "mse"/"mean_squared_error", "mae"/
  // "mean_absolute_error", "huber"; or {"class_name", "config"}.
  // ValueError lists the known names.
  static std::shared_ptr<Loss> get(const std::string& name);
  static std::shared_ptr<Loss> from_json(const Json& j);

 private:
  std::string name_;
  std::string reduction_;
};

using LossPtr = std::shared_ptr<Loss>;

}  // namespace kiln
