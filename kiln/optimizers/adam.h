// Keras 3's Adam and AdamW (epsilon added to sqrt(v) without bias
// correction, unlike PyTorch's):
//   alpha = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)      (t = iterations + 1)
//   m += (g - m) * (1 - beta_1);  v += (g^2 - v) * (1 - beta_2)
//   amsgrad: v_hat = max(v_hat, v), used in place of v
//   var -= alpha * m / (sqrt(v) + epsilon)
// AdamW is Adam with decoupled weight decay on by default (0.004), applied
// by the base class before the step: var -= lr * weight_decay * var.
#pragma once

#include <optional>

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

  // LibTorch's fused Adam kernel (at::_fused_adam_: every variable in one
  // pass, one launch on a GPU, as torch.optim.Adam(fused=True)) instead of
  // one update per variable. On by default (nullopt) on every device: the
  // per-variable update makes about ten passes over memory, 45 ms against
  // 1.4 ms for 4 x Dense(1024) on 2 EPYC cores (docs/PERFORMANCE.md), and a
  // GPU step is launch-bound. Keras's epsilon (added to sqrt(v) before the
  // bias correction) becomes PyTorch's as epsilon / sqrt(1 - beta_2^t), so
  // both compute Keras's update, equal to float rounding. false keeps the
  // per-variable update (bit for bit what kiln computed before). Not part of
  // the config (Keras has no such key): a per-process choice.
  void set_fused(std::optional<bool> fused) { fused_ = fused; }
  // Whether the last update ran the fused kernel (it falls back to the
  // per-variable update when the variables differ in device or dtype).
  bool last_update_fused() const { return last_fused_; }

 protected:
  Adam(const AdamOptions& options, const std::string& class_name, const std::string& default_name);
  void update_step(const at::Tensor& grad, at::Tensor& var, std::vector<at::Tensor>& slots, double lr,
                   int64_t step) override;
  bool update_all(const std::vector<at::Tensor>& grads, std::vector<at::Tensor>& vars,
                  std::vector<std::vector<at::Tensor>*>& slots, double lr, int64_t step) override;
  // "momentum", "velocity", and "velocity_hat" with amsgrad.
  std::vector<std::string> slot_names() const override;

 private:
  AdamOptions options_;
  std::optional<bool> fused_;
  bool last_fused_ = false;
  at::Tensor step_;  // the fused kernel's step count, on the variables' device
};

class AdamW : public Adam {
 public:
  // As Adam, with weight_decay defaulting to 0.004 (ValueError if null).
  // Default name "adamw".
  explicit AdamW(const AdamWOptions& options);
  explicit AdamW(const Json& config = Json::object());
  std::string class_name() const override { return "AdamW"; }
  // As Adam's, except that a weight_decay of 0 is written as 0, not null:
  // AdamW refuses a null weight_decay, and its config must read back.
  Json get_config() const override;
};

}  // namespace kiln::optimizers
