// Keras 3's Adamax (epsilon added to the infinity norm, where PyTorch adds
// it to |g| inside the max):
//   m += (g - m) * (1 - beta_1);  u = max(beta_2 * u, |g|)
//   var -= lr * m / ((1 - beta_1^t) * (u + epsilon))      (t = iterations + 1)
#pragma once

#include "kiln/optimizers/optimizer.h"
#include "kiln/optimizers/optimizer_options.h"

namespace kiln::optimizers {

struct AdamaxOptions {
  LearningRate learning_rate = 0.001;
  double beta_1 = 0.9;
  double beta_2 = 0.999;
  double epsilon = 1e-7;
  OptimizerOptions base;
};

class Adamax : public Optimizer {
 public:
  // Keys: learning_rate (0.001), beta_1 (0.9), beta_2 (0.999), epsilon
  // (1e-7), and the base optimizer's. Default name "adamax".
  explicit Adamax(const AdamaxOptions& options);
  explicit Adamax(const Json& config = Json::object());
  std::string class_name() const override { return "Adamax"; }
  Json get_config() const override;

 protected:
  void update_step(const at::Tensor& grad, at::Tensor& var, std::vector<at::Tensor>& slots, double lr,
                   int64_t step) override;
  std::vector<std::string> slot_names() const override { return {"momentum", "norm"}; }

 private:
  AdamaxOptions options_;
};

}  // namespace kiln::optimizers
