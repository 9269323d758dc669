// Optimizers with Keras 3's update rules, names and defaults.
//
//   auto opt = Optimizer::get("adam");                   // lr 0.001
//   auto opt = std::make_shared<optimizers::Adam>(Json{{"learning_rate", 1e-3}});
//   opt->apply_gradients(grads, model.trainable_weights());
//
// Common options (Keras's base optimizer): learning_rate (a number or a
// LearningRateSchedule), weight_decay (decoupled: var -= lr * wd * var before
// the update), clipnorm (per-variable), clipvalue, global_clipnorm (only one
// of the clip options may be set; ValueError otherwise). `iterations` counts
// applied steps and drives schedules: a step uses the learning rate of
// schedule(iterations) before the increment, as Keras.
//
// One apply_gradients, as Keras 3's apply(): drop undefined gradients ->
// clip -> weight decay -> update_step per variable -> EMA -> iterations += 1.
// Concrete optimizers (SGD, RMSprop, Adam, AdamW, Adagrad, Adadelta, Adamax,
// Nadam, Lion, Ftrl) are in kiln::optimizers, one header each (sgd.h,
// rmsprop.h, adam.h, adagrad.h, ...); schedules in schedules.h.
//
// gradient_accumulation_steps = N (>= 2, or null): each call adds the
// gradients to an accumulator; every N-th call applies (g + accumulated) / N
// (clipped, with weight decay) and clears it. As Keras, the raw call count
// drives schedules, while iterations() (and update_step's `step`) count
// applied updates: raw / N.
// use_ema (ema_momentum 0.99, ema_overwrite_frequency null): after every
// call, average = m * average + (1 - m) * var, with m = 0 while iterations()
// is 0; every ema_overwrite_frequency-th iteration the variables are set to
// their averages, and finalize_variable_values (called at the end of fit)
// sets them too.
//
// State (slots such as Adam's m and v) is created lazily on the first
// apply_gradients, keyed by variable path, so checkpoints can store and
// restore it by name (state_dict/load_state_dict).
//
// Thread safety: not thread-safe; the training loop owns it.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/json.h"
#include "kiln/core/variable.h"
#include "kiln/optimizers/optimizer_options.h"

namespace kiln {

class LearningRateSchedule {
 public:
  virtual ~LearningRateSchedule() = default;
  virtual double operator()(int64_t step) const = 0;
  virtual std::string class_name() const = 0;
  virtual Json get_config() const = 0;
  Json to_json() const { return Json{{"class_name", class_name()}, {"config", get_config()}}; }
  // {"class_name": "ExponentialDecay" | "CosineDecay" | "PiecewiseConstantDecay" |
  // "PolynomialDecay" | "InverseTimeDecay" | "CosineDecayRestarts", "config": {...}}
  // (see schedules.h). ValueError for an unknown class or a bad config.
  static std::shared_ptr<LearningRateSchedule> from_json(const Json& j);
};
class Optimizer {
 public:
  // The base options of class `class_name` (named in errors), checked;
  // an empty base.name becomes `default_name`.
  Optimizer(const std::string& class_name, OptimizerOptions base, const LearningRate& learning_rate,
            const std::string& default_name);
  virtual ~Optimizer() = default;

  // grads[i] is the gradient of vars[i]; undefined gradients are skipped
  // (ValueError if all are). ShapeError if a gradient's shape differs from
  // its variable's; ValueError if two variables share a path.
  void apply_gradients(const std::vector<at::Tensor>& grads, const std::vector<VariablePtr>& vars);

  // Applied updates: the call count, divided by gradient_accumulation_steps
  // when accumulating (Keras's `optimizer.iterations`).
  int64_t iterations() const {
    return base_.gradient_accumulation_steps > 1 ? iterations_ / base_.gradient_accumulation_steps : iterations_;
  }
  // Sets the raw call count (state_dict's "iterations").
  void set_iterations(int64_t it) { iterations_ = it; }
  bool use_ema() const { return base_.use_ema; }
  int64_t gradient_accumulation_steps() const { return base_.gradient_accumulation_steps; }  // 0 when off
  // Whether the next apply_gradients call updates the variables (false on
  // the calls that only accumulate). Data-parallel training synchronizes
  // only those that update.
  bool next_call_applies() const {
    return base_.gradient_accumulation_steps <= 1 || (iterations_ + 1) % base_.gradient_accumulation_steps == 0;
  }
  // The gradient accumulators by variable path (undefined until the first
  // accumulating call). Data-parallel training folds them into the
  // synchronized gradients of an applying call and zeroes them.
  std::map<std::string, at::Tensor>& gradient_accumulators() { return accumulators_; }
  // Keras's finalize_variable_values: with use_ema, each of `vars` that has a
  // moving average is overwritten with it; nothing otherwise. Model::fit calls
  // it after the last epoch, before on_train_end.
  void finalize_variable_values(const std::vector<VariablePtr>& vars);
  double learning_rate() const;  // at the current iteration
  // Replaces a constant learning rate (ReduceLROnPlateau). StateError if a
  // schedule is in use.
  void set_learning_rate(double lr);
  bool has_schedule() const { return schedule_ != nullptr; }
  SchedulePtr schedule() const { return schedule_; }
  double weight_decay() const { return base_.weight_decay.value_or(0.0); }
  // Variables whose path contains one of `var_names` get no weight decay
  // (Keras's exclude_from_weight_decay; e.g. {"bias", "gamma", "beta"}).
  void exclude_from_weight_decay(const std::vector<std::string>& var_names);

  const std::string& name() const { return base_.name; }
  virtual std::string class_name() const = 0;
  // Keras keys, learning_rate possibly a schedule: the base keys
  // (optimizer_fields()); a subclass adds its own.
  virtual Json get_config() const;
  Json to_json() const { return Json{{"class_name", class_name()}, {"config", get_config()}}; }

  // Slots by "<variable path>/<slot name>" (e.g. "dense/kernel/momentum"),
  // "<path>/average" with use_ema, "<path>/gradient_accumulator" when
  // accumulating, plus "iterations" (int64 scalar, the raw call count) and,
  // when constant, "learning_rate" (float64 scalar), for checkpoints. The
  // tensors are copies.
  // LossScaleOptimizer adds "loss_scale/dynamic_scale" and
  // "loss_scale/step_counter".
  virtual std::map<std::string, at::Tensor> state_dict() const;
  // Replaces all slots (and iterations / learning_rate when present).
  // ValueError for a slot name this optimizer does not use or a variable
  // with only some of its slots.
  virtual void load_state_dict(const std::map<std::string, at::Tensor>& state);

  // Sharded optimizer state (ZeRO; data-parallel fit() with zero_stage >= 1
  // sets it): only the variables whose path `owns` accepts are updated
  // (clipping, weight decay, update_step, EMA) and hold slots and moving
  // averages; the others' gradients are ignored, because another replica
  // owns them and sends their new values. Gradient accumulation is
  // unchanged (every variable). global_clipnorm sums the owned squared norms
  // across replicas (distribution()), so every replica must call
  // apply_gradients at the same steps; a replica may then own nothing or
  // get no gradient at all. Setting a filter drops the slots and averages
  // of the variables it does not own, and so does load_state_dict while one
  // is set; null (the default): every variable.
  void set_ownership(std::function<bool(const std::string& path)> owns);
  bool sharded() const { return owns_ != nullptr; }
  bool owns(const std::string& path) const { return !owns_ || owns_(path); }

  // The loss backward() differentiates (Keras's optimizer.scale_loss): the
  // loss itself, or times the loss scale (LossScaleOptimizer).
  virtual at::Tensor scale_loss(const at::Tensor& loss) const { return loss; }

  // "sgd", "rmsprop", "adam", "adamw", "adagrad", "adadelta", "adamax",
  // "nadam", "lion", "ftrl" or a class name ("Adam"); ValueError
  // lists the known names.
  static std::shared_ptr<Optimizer> get(const std::string& name);
  // {"class_name", "config"} (Keras's serialized form) or a name.
  static std::shared_ptr<Optimizer> from_json(const Json& j);
  using Factory = std::function<std::shared_ptr<Optimizer>(const Json& config)>;
  static bool register_class(const std::string& class_name, Factory factory);
  static std::vector<std::string> known_names();

 protected:
  friend class LossScaleOptimizer;
  // Called by apply_gradients with the gradients given (undefined ones
  // dropped), before anything else: may rewrite them (unscale) and return
  // false to skip this update altogether (iterations do not advance).
  virtual bool prepare_gradients(std::vector<at::Tensor>& grads) { return true; }
  // One variable's update (called under NoGradGuard, after clipping and
  // weight decay). `grad` has the variable's dtype and device. `slots` holds
  // this variable's slots, created by slot_names() on first use with zeros
  // like the variable. `step` is iterations() + 1 (Keras's local_step).
  virtual void update_step(const at::Tensor& grad, at::Tensor& var, std::vector<at::Tensor>& slots, double lr,
                           int64_t step) = 0;
  // Every variable's update at once (a fused, multi-tensor kernel: one
  // launch for all variables, as torch.optim.Adam(fused=True)), called
  // before update_step with the same arguments for all variables; returns
  // false to fall back to update_step per variable (the default).
  virtual bool update_all(const std::vector<at::Tensor>& grads, std::vector<at::Tensor>& vars,
                          std::vector<std::vector<at::Tensor>*>& slots, double lr, int64_t step) {
    return false;
  }
  virtual std::vector<std::string> slot_names() const { return {}; }
  // Initial value of slot `index` (Adagrad's and Ftrl's accumulators).
  virtual double slot_initial_value(size_t /*index*/) const { return 0.0; }

 private:
  std::vector<at::Tensor> clip(std::vector<at::Tensor> grads) const;
  // clip -> weight decay -> update_step for each variable (one applied update).
  void update_variables(std::vector<at::Tensor> grads, const std::vector<Variable*>& vars);

  OptimizerOptions base_;  // name resolved
  double lr_ = 0.001;      // the live learning rate, unless schedule_
  SchedulePtr schedule_;
  int64_t iterations_ = 0;
  std::map<std::string, std::vector<at::Tensor>> slots_;  // by variable path
  std::vector<std::string> exclude_from_wd_;
  std::map<std::string, at::Tensor> averages_;      // by variable path (use_ema)
  std::map<std::string, at::Tensor> accumulators_;  // by variable path
  std::function<bool(const std::string&)> owns_;    // null: every variable (see set_ownership)
  void drop_unowned();
};

using OptimizerPtr = std::shared_ptr<Optimizer>;

// The base classes under their Keras module's name: optimizers::Optimizer,
// optimizers::schedules' LearningRateSchedule.
namespace optimizers {
using ::kiln::LearningRateSchedule;
using ::kiln::Optimizer;
using ::kiln::OptimizerPtr;
}  // namespace optimizers

}  // namespace kiln
