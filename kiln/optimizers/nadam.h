// Keras 3's Nadam (PyTorch's NAdam with momentum_decay = 1, i.e. a momentum
// schedule of 0.96^t instead of 0.96^(0.004 t)):
//   u_t = beta_1 * (1 - 0.5 * 0.96^t),  u_{t+1} likewise,  P_t = u_1 ... u_t
//   m += (g - m) * (1 - beta_1);  v += (g^2 - v) * (1 - beta_2)
//   m_hat = u_{t+1} * m / (1 - P_t * u_{t+1}) + (1 - u_t) * g / (1 - P_t)
//   var -= lr * m_hat / (sqrt(v / (1 - beta_2^t)) + epsilon)
// t = iterations + 1. P_t is a function of t alone, so it is recomputed from
// the step rather than kept as state (checkpoints need nothing extra).
#pragma once

#include "kiln/optimizers/optimizer.h"
#include "kiln/optimizers/optimizer_options.h"

namespace kiln::optimizers {

struct NadamOptions {
  LearningRate learning_rate = 0.001;
  double beta_1 = 0.9;
  double beta_2 = 0.999;
  double epsilon = 1e-7;
  OptimizerOptions base;
};

class Nadam : public Optimizer {
 public:
  // Keys: learning_rate (0.001), beta_1 (0.9), beta_2 (0.999), epsilon
  // (1e-7), and the base optimizer's. Default name "nadam".
  explicit Nadam(const NadamOptions& options);
  explicit Nadam(const Json& config = Json::object());
  std::string class_name() const override { return "Nadam"; }
  Json get_config() const override;

 protected:
  void update_step(const at::Tensor& grad, at::Tensor& var, std::vector<at::Tensor>& slots, double lr,
                   int64_t step) override;
  std::vector<std::string> slot_names() const override { return {"momentum", "velocity"}; }

 private:
  double u(int64_t t) const;
  double u_product(int64_t t);  // u_1 * ... * u_t, cached for consecutive steps

  NadamOptions options_;
  int64_t cached_step_ = 0;
  double cached_product_ = 1.0;
};

}  // namespace kiln::optimizers
