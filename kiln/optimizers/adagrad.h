// Keras 3's Adagrad (epsilon inside the square root, unlike PyTorch's, and
// accumulators starting at 0.1):
//   acc += g^2;  var -= lr * g / sqrt(acc + epsilon)
#pragma once

#include "kiln/optimizers/optimizer.h"
#include "kiln/optimizers/optimizer_options.h"

namespace kiln::optimizers {

struct AdagradOptions {
  LearningRate learning_rate = 0.001;
  double initial_accumulator_value = 0.1;  // >= 0
  double epsilon = 1e-7;
  OptimizerOptions base;
};

class Adagrad : public Optimizer {
 public:
  // Keys: learning_rate (0.001), initial_accumulator_value (0.1, >= 0),
  // epsilon (1e-7), and the base optimizer's. Default name "adagrad".
  explicit Adagrad(const AdagradOptions& options);
  explicit Adagrad(const Json& config = Json::object());
  std::string class_name() const override { return "Adagrad"; }
  Json get_config() const override;

 protected:
  void update_step(const at::Tensor& grad, at::Tensor& var, std::vector<at::Tensor>& slots, double lr,
                   int64_t step) override;
  std::vector<std::string> slot_names() const override { return {"accumulator"}; }
  double slot_initial_value(size_t) const override { return options_.initial_accumulator_value; }

 private:
  AdagradOptions options_;
};

}  // namespace kiln::optimizers
