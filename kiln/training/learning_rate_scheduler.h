// LearningRateScheduler: sets the learning rate at the start of each epoch
// from a function of the epoch (0-based) and the current rate (Keras's
// keras.callbacks.LearningRateScheduler).
//
//   // keep 1e-3 for 10 epochs, then decay by e^-0.1 per epoch
//   auto sched = std::make_shared<LearningRateScheduler>([](int epoch, double lr) {
//     return epoch < 10 ? lr : lr * std::exp(-0.1);
//   });
//
// Adds "learning_rate" to the epoch logs. Needs a constant learning rate on
// the optimizer (StateError with a LearningRateSchedule); ValueError if the
// function returns a negative or non-finite rate. verbose > 0 prints the
// rate it sets. Under BackupAndRestore a run resumed in the middle of an
// epoch applies the function to the rate the epoch began with, not to the
// already scheduled one (the callback's state: the epoch and that rate).
#pragma once

#include <functional>

#include "kiln/layers/layer_holder.h"
#include "kiln/training/callback.h"

namespace kiln {

namespace callbacks {

class LearningRateSchedulerImpl : public Callback {
 public:
  using Schedule = std::function<double(int epoch, double lr)>;
  explicit LearningRateSchedulerImpl(Schedule schedule, int verbose = 0);

  void on_train_begin(const Logs& logs) override;
  void on_epoch_begin(int epoch, const Logs& logs) override;
  void on_epoch_end(int epoch, Logs& logs) override;

  Json get_state() const override;
  void set_state(const Json& state) override;
  std::string state_name() const override { return "LearningRateScheduler"; }

 private:
  Schedule schedule_;
  int verbose_;
  int epoch_ = -1;          // the epoch whose rate was last set
  double lr_before_ = 0.0;  // the rate before that epoch's schedule call
};
KILN_LAYER_HOLDER(LearningRateScheduler, void);

}  // namespace callbacks

}  // namespace kiln

#define KILN_LEGACY_CALLBACKS_LEARNING_RATE_SCHEDULER_H
#include "kiln/training/legacy_names.h"
