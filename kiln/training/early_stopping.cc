#include "kiln/training/early_stopping.h"

#include <cmath>
#include <iostream>

#include "kiln/models/model.h"

namespace kiln {

EarlyStopping::EarlyStopping(EarlyStoppingOptions options) : o_(std::move(options)) {
  check_mode("EarlyStopping", o_.mode);
  if (o_.patience < 0)
    throw ValueError("EarlyStopping: `patience` must be >= 0. Received: patience=" +
                     std::to_string(o_.patience));
  if (o_.monitor.empty())
    throw ValueError("EarlyStopping: `monitor` must name a log entry such as \"val_loss\"");
  o_.min_delta = std::fabs(o_.min_delta);
}

bool EarlyStopping::improves(double value, double reference) const {
  return maximize_ ? value - o_.min_delta > reference : value + o_.min_delta < reference;
}

void EarlyStopping::on_train_begin(const Logs&) {
  wait_ = 0;
  stopped_epoch_ = 0;
  best_.reset();
  best_weights_.clear();
  best_epoch_ = 0;
  resolved_ = false;
}

void EarlyStopping::on_epoch_end(int epoch, Logs& logs) {
  if (!resolved_) {
    maximize_ = monitor_is_max(o_.monitor, o_.mode, &model());
    resolved_ = true;
  }
  auto it = logs.find(o_.monitor);
  if (it == logs.end()) {
    if (!warned_) {
      std::string known;
      for (auto& [k, v] : logs) known += (known.empty() ? "" : ", ") + k;
      warn("EarlyStopping is conditioned on metric `" + o_.monitor +
           "` which is not available. Available metrics are: " + known);
      warned_ = true;
    }
    return;
  }
  if (epoch < o_.start_from_epoch) return;
  const double current = it->second;
  if (o_.restore_best_weights && best_weights_.empty()) {
    // Until something improves, the current weights are the best.
    best_weights_ = model().get_weights();
    best_epoch_ = epoch;
  }
  ++wait_;
  if (!best_ || improves(current, *best_)) {
    best_ = current;
    best_epoch_ = epoch;
    if (o_.restore_best_weights) best_weights_ = model().get_weights();
    if (!o_.baseline || improves(current, *o_.baseline)) wait_ = 0;
    return;
  }
  if (wait_ >= o_.patience && epoch > 0) {
    stopped_epoch_ = epoch;
    model().stop_training = true;
  }
}

void EarlyStopping::on_train_end(const Logs&) {
  if (stopped_epoch_ > 0 && o_.verbose > 0)
    std::cout << "Epoch " << stopped_epoch_ + 1 << ": early stopping\n";
  if (o_.restore_best_weights && !best_weights_.empty()) {
    if (o_.verbose > 0)
      std::cout << "Restoring model weights from the end of the best epoch: " << best_epoch_ + 1 << ".\n";
    model().set_weights(best_weights_);
  }
}

}  // namespace kiln
