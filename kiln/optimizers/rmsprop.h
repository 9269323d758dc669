// Keras 3's RMSprop (epsilon inside the square root, unlike PyTorch's):
//   v = rho * v + (1 - rho) * g^2
//   centered: a = rho * a + (1 - rho) * g;  d = v - a^2 + eps;  else d = v + eps
//   inc = lr * g / sqrt(d)
//   momentum > 0: m = momentum * m + inc; var -= m;  else var -= inc
#pragma once

#include "kiln/optimizers/optimizer.h"
#include "kiln/optimizers/optimizer_options.h"

namespace kiln::optimizers {

struct RMSpropOptions {
  LearningRate learning_rate = 0.001;
  double rho = 0.9;
  double momentum = 0.0;
  double epsilon = 1e-7;
  bool centered = false;
  OptimizerOptions base;
};

class RMSprop : public Optimizer {
 public:
  // Keys: learning_rate (0.001), rho (0.9), momentum (0.0), epsilon (1e-7),
  // centered (false), and the base optimizer's. Default name "rmsprop".
  explicit RMSprop(const RMSpropOptions& options);
  explicit RMSprop(const Json& config = Json::object());
  std::string class_name() const override { return "RMSprop"; }
  Json get_config() const override;

 protected:
  void update_step(const at::Tensor& grad, at::Tensor& var, std::vector<at::Tensor>& slots, double lr,
                   int64_t step) override;
  // "velocity", then "momentum" if momentum > 0, then "average_gradient" if
  // centered.
  std::vector<std::string> slot_names() const override;

 private:
  RMSpropOptions options_;
};

}  // namespace kiln::optimizers
