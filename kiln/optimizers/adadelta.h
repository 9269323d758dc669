// Keras 3's Adadelta (the same rule as PyTorch's; Keras's defaults differ:
// learning_rate 0.001, rho 0.95, epsilon 1e-7):
//   acc_g = rho * acc_g + (1 - rho) * g^2
//   delta = -sqrt(acc_d + eps) * g / sqrt(acc_g + eps)
//   acc_d = rho * acc_d + (1 - rho) * delta^2
//   var += lr * delta
#pragma once

#include "kiln/optimizers/optimizer.h"
#include "kiln/optimizers/optimizer_options.h"

namespace kiln::optimizers {

struct AdadeltaOptions {
  LearningRate learning_rate = 0.001;
  double rho = 0.95;
  double epsilon = 1e-7;
  OptimizerOptions base;
};

class Adadelta : public Optimizer {
 public:
  // Keys: learning_rate (0.001), rho (0.95), epsilon (1e-7), and the base
  // optimizer's. Default name "adadelta".
  explicit Adadelta(const AdadeltaOptions& options);
  explicit Adadelta(const Json& config = Json::object());
  std::string class_name() const override { return "Adadelta"; }
  Json get_config() const override;

 protected:
  void update_step(const at::Tensor& grad, at::Tensor& var, std::vector<at::Tensor>& slots, double lr,
                   int64_t step) override;
  std::vector<std::string> slot_names() const override { return {"accumulated_grad", "accumulated_delta_var"}; }

 private:
  AdadeltaOptions options_;
};

}  // namespace kiln::optimizers
