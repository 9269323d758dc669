// Keras 3's Ftrl (McMahan et al., 2013; PyTorch has none). With
// p = -learning_rate_power, l2 = l2_regularization_strength + beta / (2 lr):
//   g' = g + 2 * l2_shrinkage_regularization_strength * var
//   n' = n + g^2
//   z += g' - (n'^p - n^p) / lr * var
//   var = (clip(z, -l1, l1) - z) / (n'^p / lr + 2 * l2);  n = n'
// Accumulators n start at initial_accumulator_value, z at 0.
#pragma once

#include "kiln/optimizers/optimizer.h"
#include "kiln/optimizers/optimizer_options.h"

namespace kiln::optimizers {

struct FtrlOptions {
  LearningRate learning_rate = 0.001;
  double learning_rate_power = -0.5;                  // <= 0
  double initial_accumulator_value = 0.1;             // >= 0
  double l1_regularization_strength = 0.0;            // >= 0
  double l2_regularization_strength = 0.0;            // >= 0
  double l2_shrinkage_regularization_strength = 0.0;  // >= 0
  double beta = 0.0;                                  // >= 0
  OptimizerOptions base;
};

class Ftrl : public Optimizer {
 public:
  // Keys: learning_rate (0.001), learning_rate_power (-0.5, <= 0),
  // initial_accumulator_value (0.1), l1_regularization_strength (0),
  // l2_regularization_strength (0), l2_shrinkage_regularization_strength
  // (0), beta (0) (all >= 0), and the base optimizer's. Default name "ftrl".
  explicit Ftrl(const FtrlOptions& options);
  explicit Ftrl(const Json& config = Json::object());
  std::string class_name() const override { return "Ftrl"; }
  Json get_config() const override;

 protected:
  void update_step(const at::Tensor& grad, at::Tensor& var, std::vector<at::Tensor>& slots, double lr,
                   int64_t step) override;
  std::vector<std::string> slot_names() const override { return {"accumulator", "linear"}; }
  double slot_initial_value(size_t index) const override {
    return index == 0 ? options_.initial_accumulator_value : 0.0;
  }

 private:
  FtrlOptions options_;
};

}  // namespace kiln::optimizers
