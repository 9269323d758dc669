// Keras 3's SGD: with momentum m = momentum * m - lr * g, then
// var += m (or, with nesterov, var += momentum * m - lr * g); without
// momentum var -= lr * g.
//
//   optimizers::SGD sgd(Json{{"learning_rate", 0.1}, {"momentum", 0.9}, {"nesterov", true}});
#pragma once

#include "kiln/optimizers/optimizer.h"
#include "kiln/optimizers/optimizer_options.h"

namespace kiln::optimizers {

struct SGDOptions {
  LearningRate learning_rate = 0.01;
  double momentum = 0.0;  // in [0, 1]
  bool nesterov = false;
  OptimizerOptions base;
};

class SGD : public Optimizer {
 public:
  // Keys: learning_rate (0.01), momentum (0.0, in [0, 1]), nesterov (false),
  // and the base optimizer's. Default name "SGD".
  explicit SGD(const SGDOptions& options);
  explicit SGD(const Json& config = Json::object());
  std::string class_name() const override { return "SGD"; }
  Json get_config() const override;
  double momentum() const { return options_.momentum; }
  bool nesterov() const { return options_.nesterov; }

 protected:
  void update_step(const at::Tensor& grad, at::Tensor& var, std::vector<at::Tensor>& slots, double lr,
                   int64_t step) override;
  std::vector<std::string> slot_names() const override;

 private:
  SGDOptions options_;
};

}  // namespace kiln::optimizers
