#include "kiln/training/reduce_lr_on_plateau.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>

#include "kiln/models/model.h"
#include "kiln/optimizers/optimizer.h"
#include "kiln/training/train_state.h"

namespace kiln {

callbacks::ReduceLROnPlateauImpl::ReduceLROnPlateauImpl(callbacks::ReduceLROnPlateauOptions options)
    : o_(std::move(options)) {
  check_mode("ReduceLROnPlateau", o_.mode);
  if (!(o_.factor < 1.0) || !(o_.factor > 0.0))
    throw ValueError("ReduceLROnPlateau does not support a factor outside (0, 1). Received: factor=" +
                     std::to_string(o_.factor));
  if (o_.patience < 0 || o_.cooldown < 0 || o_.min_lr < 0)
    throw ValueError("ReduceLROnPlateau: patience, cooldown and min_lr must be >= 0. Received: patience=" +
                     std::to_string(o_.patience) + ", cooldown=" + std::to_string(o_.cooldown) +
                     ", min_lr=" + std::to_string(o_.min_lr));
}

bool callbacks::ReduceLROnPlateauImpl::improves(double value, double best) const {
  return maximize_ ? value > best + o_.min_delta : value < best - o_.min_delta;
}

void callbacks::ReduceLROnPlateauImpl::check_optimizer(const Optimizer& optimizer) {
  if (optimizer.has_schedule())
    throw ValueError("ReduceLROnPlateau cannot change the learning rate of the optimizer " + optimizer.name() +
                     ": its learning_rate is the schedule " + optimizer.schedule()->class_name() +
                     ". Use a constant learning_rate with ReduceLROnPlateau, or drop the callback");
}

void callbacks::ReduceLROnPlateauImpl::on_train_begin(const Logs&) {
  check_optimizer(model().train_state().optimizer());  // before the first step, not at the first plateau
  // Keras's rule here: "acc" in the name means maximise (unless a compiled
  // metric says otherwise).
  maximize_ = monitor_is_max(o_.monitor, o_.mode, &model());
  best_ = maximize_ ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
  wait_ = 0;
  cooldown_counter_ = 0;
}

Json callbacks::ReduceLROnPlateauImpl::get_state() const {
  return Json{
      {"best", state_double(best_)}, {"wait", wait_}, {"cooldown_counter", cooldown_counter_}, {"warned", warned_}};
}

void callbacks::ReduceLROnPlateauImpl::set_state(const Json& s) {
  best_ = state_double(s.at("best"));
  wait_ = s.at("wait").get<int>();
  cooldown_counter_ = s.at("cooldown_counter").get<int>();
  warned_ = s.value("warned", false);
}

void callbacks::ReduceLROnPlateauImpl::on_epoch_end(int epoch, Logs& logs) {
  Optimizer& opt = model().train_state().optimizer();
  logs["learning_rate"] = opt.learning_rate();
  auto it = logs.find(o_.monitor);
  if (it == logs.end()) {
    if (!warned_) {
      std::string known;
      for (auto& [k, v] : logs) known += (known.empty() ? "" : ", ") + k;
      warn("ReduceLROnPlateau is conditioned on metric `" + o_.monitor +
           "` which is not available. Available metrics are: " + known);
      warned_ = true;
    }
    return;
  }
  const double current = it->second;
  if (cooldown_counter_ > 0) {
    --cooldown_counter_;
    wait_ = 0;
  }
  if (improves(current, best_)) {
    best_ = current;
    wait_ = 0;
  } else if (cooldown_counter_ == 0) {
    ++wait_;
    if (wait_ >= o_.patience) {
      const double old_lr = opt.learning_rate();
      if (old_lr > (double)(float)o_.min_lr) {
        const double new_lr = std::max(old_lr * o_.factor, o_.min_lr);
        opt.set_learning_rate(new_lr);
        if (o_.verbose > 0)
          std::cout << "\nEpoch " << epoch + 1 << ": ReduceLROnPlateau reducing learning rate to " << new_lr << ".\n";
        cooldown_counter_ = o_.cooldown;
        wait_ = 0;
      }
    }
  }
}

}  // namespace kiln
