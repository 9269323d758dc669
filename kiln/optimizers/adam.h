// Keras 3's Adam and AdamW (epsilon added to sqrt(v) without bias
// correction, unlike PyTorch's):
//   alpha = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)      (t = iterations + 1)
//   m += (g - m) * (1 - beta_1);  v += (g^2 - v) * (1 - beta_2)
//   amsgrad: v_hat = max(v_hat, v), used in place of v
//   var -= alpha * m / (sqrt(v) + epsilon)
// AdamW is Adam with decoupled weight decay on by default (0.004), applied
// by the base class before the step: var -= lr * weight_decay * var.
#pragma once

#include "kiln/optimizers/optimizer.h"
#include "kiln/optimizers/optimizer_options.h"

namespace kiln::optimizers {

struct AdamOptions {
  LearningRate learning_rate = 0.001;
  double beta_1 = 0.9;    // in [0, 1)
  double beta_2 = 0.999;  // in [0, 1)
  double epsilon = 1e-7;
  bool amsgrad = false;
  OptimizerOptions base;
};
// AdamW: as Adam; base.weight_decay unset means 0.004.
using AdamWOptions = AdamOptions;

class Adam : public Optimizer {
 public:
  // Keys: learning_rate (0.001), beta_1 (0.9), beta_2 (0.999), epsilon
  // (1e-7), amsgrad (false), and the base optimizer's. Default name "adam".
  explicit Adam(const AdamOptions& options);
  explicit Adam(const Json& config = Json::object());
  std::string class_name() const override { return "Adam"; }
  Json get_config() const override;

 protected:
  Adam(const Json& config, const std::string& default_name);
  void update_step(const at::Tensor& grad, at::Tensor& var, std::vector<at::Tensor>& slots, double lr,
                   int64_t step) override;
  // "momentum", "velocity", and "velocity_hat" with amsgrad.
  std::vector<std::string> slot_names() const override;

 private:
  double beta_1_, beta_2_, epsilon_;
  bool amsgrad_;
};

class AdamW : public Adam {
 public:
  // As Adam, with weight_decay defaulting to 0.004 (ValueError if null).
  // Default name "adamw".
  explicit AdamW(const AdamWOptions& options);
  explicit AdamW(const Json& config = Json::object());
  std::string class_name() const override { return "AdamW"; }
};

}  // namespace kiln::optimizers
