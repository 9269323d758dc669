// Learning-rate schedules (Keras's keras.optimizers.schedules), evaluated at
// the optimizer's iteration count (0 on the first step).
//
//   auto lr = std::make_shared<optimizers::CosineDecay>(1e-3, 10000);
//   auto opt = std::make_shared<optimizers::Adam>(Json{{"learning_rate", lr->to_json()}});
#pragma once

#include <optional>
#include <vector>

#include "kiln/optimizers/optimizer.h"

namespace kiln::optimizers {

// initial_learning_rate * decay_rate ^ (step / decay_steps), the exponent
// floored when staircase. decay_steps must be > 0.
class ExponentialDecay : public LearningRateSchedule {
 public:
  ExponentialDecay(double initial_learning_rate, int64_t decay_steps, double decay_rate,
                   bool staircase = false, std::string name = "ExponentialDecay");
  static std::shared_ptr<ExponentialDecay> from_config(const Json& config);
  double operator()(int64_t step) const override;
  std::string class_name() const override { return "ExponentialDecay"; }
  Json get_config() const override;

 private:
  double initial_learning_rate_;
  int64_t decay_steps_;
  double decay_rate_;
  bool staircase_;
  std::string name_;
};

// Keras 3's CosineDecay with optional linear warmup. Without warmup_target:
//   s = min(step, decay_steps); lr = initial * ((1 - alpha) * c + alpha),
//   c = 0.5 * (1 + cos(pi * s / decay_steps)).
// With warmup_target: for step < warmup_steps the rate rises linearly from
// initial_learning_rate to warmup_target; afterwards it decays from
// warmup_target as above over step - warmup_steps (capped at decay_steps).
class CosineDecay : public LearningRateSchedule {
 public:
  CosineDecay(double initial_learning_rate, int64_t decay_steps, double alpha = 0.0,
              std::optional<double> warmup_target = std::nullopt, int64_t warmup_steps = 0,
              std::string name = "CosineDecay");
  static std::shared_ptr<CosineDecay> from_config(const Json& config);
  double operator()(int64_t step) const override;
  std::string class_name() const override { return "CosineDecay"; }
  Json get_config() const override;

 private:
  double initial_learning_rate_;
  int64_t decay_steps_;
  double alpha_;
  std::optional<double> warmup_target_;
  int64_t warmup_steps_;
  std::string name_;
};

// values[0] while step <= boundaries[0], values[i] while
// boundaries[i-1] < step <= boundaries[i], values.back() after the last
// boundary. Needs values.size() == boundaries.size() + 1 and increasing
// boundaries.
class PiecewiseConstantDecay : public LearningRateSchedule {
 public:
  PiecewiseConstantDecay(std::vector<int64_t> boundaries, std::vector<double> values,
                         std::string name = "PiecewiseConstant");
  static std::shared_ptr<PiecewiseConstantDecay> from_config(const Json& config);
  double operator()(int64_t step) const override;
  std::string class_name() const override { return "PiecewiseConstantDecay"; }
  Json get_config() const override;

 private:
  std::vector<int64_t> boundaries_;
  std::vector<double> values_;
  std::string name_;
};

}  // namespace kiln::optimizers
