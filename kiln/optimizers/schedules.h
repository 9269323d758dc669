// Learning-rate schedules (Keras's keras.optimizers.schedules), evaluated at
// the optimizer's iteration count (0 on the first step).
//
//   auto lr = std::make_shared<optimizers::CosineDecay>(1e-3, 10000);
//   auto opt = std::make_shared<optimizers::Adam>(Json{{"learning_rate", lr->to_json()}});
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kiln/optimizers/optimizer.h"

namespace kiln::optimizers {

// initial_learning_rate * decay_rate ^ (step / decay_steps), the exponent
// floored when staircase. decay_steps must be > 0.
struct ExponentialDecayOptions {
  double initial_learning_rate = 0.0;  // required
  int64_t decay_steps = 0;             // required, > 0
  double decay_rate = 0.0;             // required
  bool staircase = false;
  std::string name = "ExponentialDecay";
};

class ExponentialDecay : public LearningRateSchedule {
 public:
  explicit ExponentialDecay(const ExponentialDecayOptions& options);
  static std::shared_ptr<ExponentialDecay> from_config(const Json& config);
  double operator()(int64_t step) const override;
  std::string class_name() const override { return "ExponentialDecay"; }
  Json get_config() const override;

 private:
  ExponentialDecayOptions options_;
};

// Keras 3's CosineDecay with optional linear warmup. Without warmup_target:
//   s = min(step, decay_steps); lr = initial * ((1 - alpha) * c + alpha),
//   c = 0.5 * (1 + cos(pi * s / decay_steps)).
// With warmup_target: for step < warmup_steps the rate rises linearly from
// initial_learning_rate to warmup_target; afterwards it decays from
// warmup_target as above over step - warmup_steps (capped at decay_steps).
struct CosineDecayOptions {
  double initial_learning_rate = 0.0;  // required
  int64_t decay_steps = 0;             // required, > 0
  double alpha = 0.0;
  std::optional<double> warmup_target;
  int64_t warmup_steps = 0;  // >= 0
  std::string name = "CosineDecay";
};

class CosineDecay : public LearningRateSchedule {
 public:
  explicit CosineDecay(const CosineDecayOptions& options);
  CosineDecay(double initial_learning_rate, int64_t decay_steps, double alpha = 0.0,
              std::optional<double> warmup_target = std::nullopt, int64_t warmup_steps = 0,
              std::string name = "CosineDecay");
  static std::shared_ptr<CosineDecay> from_config(const Json& config);
  double operator()(int64_t step) const override;
  std::string class_name() const override { return "CosineDecay"; }
  Json get_config() const override;

 private:
  CosineDecayOptions options_;
};

// values[0] while step <= boundaries[0], values[i] while
// boundaries[i-1] < step <= boundaries[i], values.back() after the last
// boundary. Needs values.size() == boundaries.size() + 1 and increasing
// boundaries.
struct PiecewiseConstantDecayOptions {
  std::vector<int64_t> boundaries;  // required
  std::vector<double> values;       // required
  std::string name = "PiecewiseConstant";
};

class PiecewiseConstantDecay : public LearningRateSchedule {
 public:
  explicit PiecewiseConstantDecay(PiecewiseConstantDecayOptions options);
  PiecewiseConstantDecay(std::vector<int64_t> boundaries, std::vector<double> values,
                         std::string name = "PiecewiseConstant");
  static std::shared_ptr<PiecewiseConstantDecay> from_config(const Json& config);
  double operator()(int64_t step) const override;
  std::string class_name() const override { return "PiecewiseConstantDecay"; }
  Json get_config() const override;

 private:
  PiecewiseConstantDecayOptions options_;
};

// Keras's PolynomialDecay:
//   s = min(step, decay_steps);  d = decay_steps
//   cycle: s = step, d = decay_steps * ceil(step / decay_steps) (1 at step 0)
//   lr = (initial - end_learning_rate) * (1 - s / d)^power + end_learning_rate
// Defaults: end_learning_rate 1e-4, power 1, cycle false; decay_steps > 0.
struct PolynomialDecayOptions {
  double initial_learning_rate = 0.0;  // required
  int64_t decay_steps = 0;             // required, > 0
  double end_learning_rate = 0.0001;
  double power = 1.0;
  bool cycle = false;
  std::string name = "PolynomialDecay";
};

class PolynomialDecay : public LearningRateSchedule {
 public:
  explicit PolynomialDecay(const PolynomialDecayOptions& options);
  static std::shared_ptr<PolynomialDecay> from_config(const Json& config);
  double operator()(int64_t step) const override;
  std::string class_name() const override { return "PolynomialDecay"; }
  Json get_config() const override;

 private:
  PolynomialDecayOptions options_;
};

// Keras's InverseTimeDecay:
//   lr = initial / (1 + decay_rate * step / decay_steps), the quotient
//   step / decay_steps floored when staircase. decay_steps > 0 (may be
//   fractional, as in Keras's own example).
struct InverseTimeDecayOptions {
  double initial_learning_rate = 0.0;  // required
  double decay_steps = 0.0;            // required, > 0
  double decay_rate = 0.0;             // required
  bool staircase = false;
  std::string name = "InverseTimeDecay";
};

class InverseTimeDecay : public LearningRateSchedule {
 public:
  explicit InverseTimeDecay(const InverseTimeDecayOptions& options);
  static std::shared_ptr<InverseTimeDecay> from_config(const Json& config);
  double operator()(int64_t step) const override;
  std::string class_name() const override { return "InverseTimeDecay"; }
  Json get_config() const override;

 private:
  InverseTimeDecayOptions options_;
};

// Keras's CosineDecayRestarts (SGDR, Loshchilov & Hutter): with
// f = step / first_decay_steps, the i-th period (i = 0, 1, ...) lasts
// t_mul^i first periods and starts at m_mul^i times the rate:
//   t_mul == 1: i = floor(f), f -= i
//   else:       i = floor(log(1 - f (1 - t_mul)) / log(t_mul)),
//               f = (f - (1 - t_mul^i) / (1 - t_mul)) / t_mul^i
//   lr = initial * ((1 - alpha) * 0.5 * m_mul^i * (1 + cos(pi f)) + alpha)
// Defaults: t_mul 2, m_mul 1, alpha 0, name "SGDRDecay"; first_decay_steps > 0.
struct CosineDecayRestartsOptions {
  double initial_learning_rate = 0.0;  // required
  int64_t first_decay_steps = 0;       // required, > 0
  double t_mul = 2.0;                  // > 0
  double m_mul = 1.0;
  double alpha = 0.0;
  std::string name = "SGDRDecay";
};

class CosineDecayRestarts : public LearningRateSchedule {
 public:
  explicit CosineDecayRestarts(const CosineDecayRestartsOptions& options);
  CosineDecayRestarts(double initial_learning_rate, int64_t first_decay_steps, double t_mul = 2.0, double m_mul = 1.0,
                      double alpha = 0.0, std::string name = "SGDRDecay");
  static std::shared_ptr<CosineDecayRestarts> from_config(const Json& config);
  double operator()(int64_t step) const override;
  std::string class_name() const override { return "CosineDecayRestarts"; }
  Json get_config() const override;

 private:
  CosineDecayRestartsOptions options_;
};

}  // namespace kiln::optimizers
