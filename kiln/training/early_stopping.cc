#include "kiln/training/early_stopping.h"

#include <cmath>
#include <cstdio>
#include <iostream>

#include "kiln/core/variable.h"
#include "kiln/models/model.h"

namespace kiln {

callbacks::EarlyStoppingImpl::EarlyStoppingImpl(callbacks::EarlyStoppingOptions options) : o_(std::move(options)) {
  check_mode("EarlyStopping", o_.mode);
  if (o_.patience < 0)
    throw ValueError("EarlyStopping: `patience` must be >= 0. Received: patience=" + std::to_string(o_.patience));
  if (o_.monitor.empty()) throw ValueError("EarlyStopping: `monitor` must name a log entry such as \"val_loss\"");
  o_.min_delta = std::fabs(o_.min_delta);
}

bool callbacks::EarlyStoppingImpl::improves(double value, double reference) const {
  return maximize_ ? value - o_.min_delta > reference : value + o_.min_delta < reference;
}

void callbacks::EarlyStoppingImpl::on_train_begin(const Logs&) {
  wait_ = 0;
  stopped_epoch_ = 0;
  best_.reset();
  best_weights_.clear();
  best_epoch_ = 0;
  resolved_ = false;
}

void callbacks::EarlyStoppingImpl::on_epoch_end(int epoch, Logs& logs) {
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

Json callbacks::EarlyStoppingImpl::get_state() const {
  return Json{{"wait", wait_},
              {"stopped_epoch", stopped_epoch_},
              {"best_epoch", best_epoch_},
              {"best", best_ ? state_double(*best_) : Json(nullptr)},
              {"warned", warned_}};
}

void callbacks::EarlyStoppingImpl::set_state(const Json& s) {
  wait_ = s.at("wait").get<int>();
  stopped_epoch_ = s.at("stopped_epoch").get<int>();
  best_epoch_ = s.at("best_epoch").get<int>();
  best_.reset();
  if (!s.at("best").is_null()) best_ = state_double(s.at("best"));
  warned_ = s.value("warned", false);
}

namespace {
std::string weight_key(size_t i) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "best_weights/%06zu", i);  // sorts in order
  return buf;
}
}  // namespace

std::map<std::string, at::Tensor> callbacks::EarlyStoppingImpl::get_state_tensors() const {
  std::map<std::string, at::Tensor> out;
  for (size_t i = 0; i < best_weights_.size(); ++i) out[weight_key(i)] = best_weights_[i];
  return out;
}

void callbacks::EarlyStoppingImpl::set_state_tensors(const std::map<std::string, at::Tensor>& tensors) {
  best_weights_.clear();
  for (size_t i = 0;; ++i) {
    auto it = tensors.find(weight_key(i));
    if (it == tensors.end()) break;
    best_weights_.push_back(it->second.clone());
  }
}

void callbacks::EarlyStoppingImpl::on_train_end(const Logs&) {
  // Data parallel: every rank stops and restores alike; the chief alone prints.
  const bool print = o_.verbose > 0 && is_chief();
  if (stopped_epoch_ > 0 && print) std::cout << "Epoch " << stopped_epoch_ + 1 << ": early stopping\n";
  if (o_.restore_best_weights && !best_weights_.empty()) {
    if (print) std::cout << "Restoring model weights from the end of the best epoch: " << best_epoch_ + 1 << ".\n";
    model().set_weights(best_weights_);
  }
}

}  // namespace kiln
