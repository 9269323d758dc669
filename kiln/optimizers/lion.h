// Keras 3's Lion (Chen et al., 2023; PyTorch has none):
//   var -= lr * sign(beta_1 * m + (1 - beta_1) * g)
//   m = beta_2 * m + (1 - beta_2) * g
#pragma once

#include "kiln/optimizers/optimizer.h"
#include "kiln/optimizers/optimizer_options.h"

namespace kiln::optimizers {

struct LionOptions {
  LearningRate learning_rate = 0.001;
  double beta_1 = 0.9;  // in (0, 1]
  double beta_2 = 0.99;
  OptimizerOptions base;
};

class Lion : public Optimizer {
 public:
  // Keys: learning_rate (0.001), beta_1 (0.9, in (0, 1]), beta_2 (0.99), and
  // the base optimizer's. Default name "lion".
  explicit Lion(const LionOptions& options);
  explicit Lion(const Json& config = Json::object());
  std::string class_name() const override { return "Lion"; }
  Json get_config() const override;

 protected:
  void update_step(const at::Tensor& grad, at::Tensor& var, std::vector<at::Tensor>& slots, double lr,
                   int64_t step) override;
  std::vector<std::string> slot_names() const override { return {"momentum"}; }

 private:
  LionOptions options_;
};

}  // namespace kiln::optimizers
