#include "kiln/training/learning_rate_scheduler.h"

#include <cmath>
#include <iostream>

#include "kiln/core/error.h"
#include "kiln/models/model.h"
#include "kiln/training/train_state.h"

namespace kiln {

callbacks::LearningRateSchedulerImpl::LearningRateSchedulerImpl(Schedule schedule, int verbose)
    : schedule_(std::move(schedule)), verbose_(verbose) {
  if (!schedule_) throw ValueError("LearningRateScheduler: `schedule` must be a function (epoch, lr) -> lr");
}

void callbacks::LearningRateSchedulerImpl::on_train_begin(const Logs&) { epoch_ = -1; }

void callbacks::LearningRateSchedulerImpl::on_epoch_begin(int epoch, const Logs&) {
  Optimizer& opt = model().train_state().optimizer();
  // A run resumed inside `epoch` already holds the scheduled rate: start
  // from the rate the epoch began with.
  const double before = epoch == epoch_ ? lr_before_ : opt.learning_rate();
  const double lr = schedule_(epoch, before);
  if (!std::isfinite(lr) || lr < 0)
    throw ValueError("LearningRateScheduler: the schedule returned learning rate " + std::to_string(lr) +
                     " for epoch " + std::to_string(epoch) + "; it must be a finite number >= 0");
  opt.set_learning_rate(lr);
  epoch_ = epoch;
  lr_before_ = before;
  if (verbose_ > 0)
    std::cout << "\nEpoch " << epoch + 1 << ": LearningRateScheduler setting learning rate to " << lr << ".\n";
}

void callbacks::LearningRateSchedulerImpl::on_epoch_end(int, Logs& logs) {
  logs["learning_rate"] = model().train_state().optimizer().learning_rate();
}

Json callbacks::LearningRateSchedulerImpl::get_state() const {
  return Json{{"epoch", epoch_}, {"lr_before", state_double(lr_before_)}};
}

void callbacks::LearningRateSchedulerImpl::set_state(const Json& s) {
  epoch_ = s.at("epoch").get<int>();
  lr_before_ = state_double(s.at("lr_before"));
}

}  // namespace kiln
