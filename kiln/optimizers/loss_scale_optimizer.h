// LossScaleOptimizer: loss scaling for float16 training (Keras's
// keras.optimizers.LossScaleOptimizer), wrapping any optimizer.
//
//   auto opt = std::make_shared<LossScaleOptimizer>(Optimizer::get("adam"));
//   model->compile(CompileArgs{.optimizer = opt, ...});
//   // mixed_float16 models get one automatically in compile().
//
// The trainer multiplies the loss by scale() before backward
// (scale_loss()); apply_gradients divides the gradients by it, and:
//   - all finite: the wrapped optimizer's update runs; after
//     `dynamic_growth_steps` finite steps in a row the scale doubles;
//   - any inf/NaN: the step is skipped (no update, iterations unchanged)
//     and the scale halves (never below 1).
// dynamic=false keeps `initial_scale` fixed (a skipped step still skips).
// Keras's defaults: initial_scale 2^15, dynamic_growth_steps 2000.
//
// Under data parallelism every replica all-reduces its "non-finite" flag
// before deciding, so all replicas skip or apply the same steps and keep
// the same scale. The scale and the step counter are optimizer state
// ("loss_scale/dynamic_scale", "loss_scale/step_counter"): checkpoints and
// saved models keep them.
//
// The wrapped optimizer supplies the update rule (its slots, learning rate,
// clipping, EMA, accumulation); this object owns that state, so read
// iterations() and the learning rate here. Thread safety: none (as
// Optimizer).
#pragma once

#include "kiln/optimizers/optimizer.h"

namespace kiln {

struct LossScaleOptions {
  double initial_scale = 32768.0;  // 2^15
  int64_t dynamic_growth_steps = 2000;
  bool dynamic = true;
};

class LossScaleOptimizer : public Optimizer {
 public:
  explicit LossScaleOptimizer(OptimizerPtr inner, const LossScaleOptions& options = {}, const std::string& name = "");
  // {"inner_optimizer": {...}, "initial_scale", "dynamic_growth_steps", "dynamic", "name"}.
  static std::shared_ptr<LossScaleOptimizer> from_config(const Json& config);

  std::string class_name() const override { return "LossScaleOptimizer"; }
  Json get_config() const override;
  at::Tensor scale_loss(const at::Tensor& loss) const override;
  std::map<std::string, at::Tensor> state_dict() const override;
  void load_state_dict(const std::map<std::string, at::Tensor>& state) override;

  double scale() const { return scale_; }
  int64_t step_counter() const { return step_counter_; }
  const LossScaleOptions& options() const { return options_; }
  const OptimizerPtr& inner_optimizer() const { return inner_; }
  // Steps skipped for non-finite gradients since construction (not saved).
  int64_t skipped_steps() const { return skipped_; }

 protected:
  bool prepare_gradients(std::vector<at::Tensor>& grads) override;
  void update_step(const at::Tensor& grad, at::Tensor& var, std::vector<at::Tensor>& slots, double lr,
                   int64_t step) override;
  std::vector<std::string> slot_names() const override;
  double slot_initial_value(size_t index) const override;

 private:
  // The inner optimizer's base options, named `name` (or "loss_scale_optimizer").
  static OptimizerOptions inner_base(const OptimizerPtr& inner, const std::string& name);
  static LearningRate inner_learning_rate(const OptimizerPtr& inner);

  OptimizerPtr inner_;
  LossScaleOptions options_;
  double scale_;
  int64_t step_counter_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace kiln
