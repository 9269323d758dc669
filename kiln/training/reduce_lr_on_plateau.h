// ReduceLROnPlateau: multiply the learning rate by `factor` when a monitored
// quantity has not improved for `patience` epochs (Keras's callback, same
// defaults). After a reduction, `cooldown` epochs pass before counting
// again; the rate never goes below min_lr. Adds "learning_rate" to the
// epoch logs (seen by History, CSVLogger, TensorBoard). Needs a constant
// learning rate: with a schedule (ExponentialDecay, CosineDecay, ...) fit()
// refuses it before the first step, as `kiln train` does when it reads the spec.
//
//   std::make_shared<ReduceLROnPlateau>(ReduceLROnPlateauOptions{.factor = 0.5, .patience = 2});
#pragma once

#include <string>

#include "kiln/layers/layer_holder.h"
#include "kiln/training/callback.h"

namespace kiln {

class Optimizer;

namespace callbacks {

struct ReduceLROnPlateauOptions {
  std::string monitor = "val_loss";
  double factor = 0.1;  // in (0, 1)
  int patience = 10;
  int verbose = 0;
  std::string mode = "auto";
  double min_delta = 1e-4;
  int cooldown = 0;
  double min_lr = 0.0;
};

class ReduceLROnPlateauImpl : public Callback {
 public:
  explicit ReduceLROnPlateauImpl(ReduceLROnPlateauOptions options = {});

  // ValueError if `optimizer`'s learning rate is a schedule, which this
  // callback cannot set (Keras fails there at the first reduction, mid-run).
  static void check_optimizer(const Optimizer& optimizer);

  void on_train_begin(const Logs& logs) override;  // check_optimizer first
  void on_epoch_end(int epoch, Logs& logs) override;

  // best, wait, cooldown_counter (the rate itself is the optimizer's state).
  Json get_state() const override;
  void set_state(const Json& state) override;
  std::string state_name() const override { return "ReduceLROnPlateau"; }

  double best() const { return best_; }
  int wait() const { return wait_; }

 private:
  bool improves(double value, double best) const;

  ReduceLROnPlateauOptions o_;
  bool maximize_ = false;
  double best_ = 0;
  int wait_ = 0;
  int cooldown_counter_ = 0;
  bool warned_ = false;
};
KILN_LAYER_HOLDER(ReduceLROnPlateau, ReduceLROnPlateauOptions);

}  // namespace callbacks

}  // namespace kiln

#define KILN_LEGACY_CALLBACKS_REDUCE_LR_ON_PLATEAU_H
#include "kiln/training/legacy_names.h"
