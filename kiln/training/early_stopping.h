// EarlyStopping: stop training when a monitored quantity stops improving
// (Keras's keras.callbacks.EarlyStopping, same defaults and rules).
//
//   auto es = std::make_shared<EarlyStopping>(EarlyStoppingOptions{
//       .monitor = "val_loss", .patience = 3, .restore_best_weights = true});
//
// After each epoch (from start_from_epoch on): an improvement is a value
// better than the best so far by more than min_delta; patience epochs
// without one set model.stop_training. With a baseline, `wait` only resets
// when the value also beats the baseline. restore_best_weights sets the
// weights of the best epoch back at the end of training (also when training
// ran to the last epoch, as Keras 3 does). mode "auto" infers the direction
// (see monitor_is_max). A missing monitor value warns and is skipped.
#pragma once

#include <optional>
#include <string>

#include "kiln/layers/layer_holder.h"
#include "kiln/training/callback.h"

namespace kiln {

namespace callbacks {

struct EarlyStoppingOptions {
  std::string monitor = "val_loss";
  double min_delta = 0.0;
  int patience = 0;
  int verbose = 0;
  std::string mode = "auto";  // "auto", "min", "max"
  std::optional<double> baseline;
  bool restore_best_weights = false;
  int start_from_epoch = 0;
};

class EarlyStoppingImpl : public Callback {
 public:
  explicit EarlyStoppingImpl(EarlyStoppingOptions options = {});

  void on_train_begin(const Logs& logs) override;
  void on_epoch_end(int epoch, Logs& logs) override;
  void on_train_end(const Logs& logs) override;

  // wait, best, best_epoch, stopped_epoch; best weights as tensors.
  Json get_state() const override;
  void set_state(const Json& state) override;
  std::map<std::string, at::Tensor> get_state_tensors() const override;
  void set_state_tensors(const std::map<std::string, at::Tensor>& tensors) override;
  std::string state_name() const override { return "EarlyStopping"; }

  int stopped_epoch() const { return stopped_epoch_; }  // 0 if it did not stop
  int best_epoch() const { return best_epoch_; }
  std::optional<double> best() const { return best_; }
  int wait() const { return wait_; }

 private:
  bool improves(double value, double reference) const;

  EarlyStoppingOptions o_;
  bool maximize_ = false;
  bool resolved_ = false;
  int wait_ = 0;
  int stopped_epoch_ = 0;
  int best_epoch_ = 0;
  std::optional<double> best_;
  Tensors best_weights_;
  bool warned_ = false;
};
KILN_LAYER_HOLDER(EarlyStopping, EarlyStoppingOptions);

}  // namespace callbacks

}  // namespace kiln

#define KILN_LEGACY_CALLBACKS_EARLY_STOPPING_H
#include "kiln/training/legacy_names.h"
