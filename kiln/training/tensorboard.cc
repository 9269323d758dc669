#include "kiln/training/tensorboard.h"

#include "kiln/core/io.h"
#include "kiln/models/model.h"
#include "kiln/training/train_state.h"

namespace kiln {

callbacks::TensorBoardImpl::TensorBoardImpl(std::string log_dir, callbacks::TensorBoardOptions options)
    : log_dir_(std::move(log_dir)), o_(options) {
  if (log_dir_.empty()) throw ValueError("TensorBoard: `log_dir` must not be empty");
}

EventFileWriter& callbacks::TensorBoardImpl::train_writer() {
  if (!train_) train_ = std::make_unique<EventFileWriter>(join_path(log_dir_, "train"));
  return *train_;
}

EventFileWriter& callbacks::TensorBoardImpl::val_writer() {
  if (!val_) val_ = std::make_unique<EventFileWriter>(join_path(log_dir_, "validation"));
  return *val_;
}

void callbacks::TensorBoardImpl::on_train_begin(const Logs&) {
  if (!is_chief()) return;  // data parallel: the chief alone writes
  in_fit_ = true;
  global_batch_ = 0;
  train_writer();
}

void callbacks::TensorBoardImpl::on_train_batch_end(int64_t, const Logs& logs) {
  if (!in_fit_) return;
  ++global_batch_;
  if (o_.update_freq.per_epoch() || global_batch_ % o_.update_freq.batches() != 0) return;
  for (auto& [k, v] : logs) train_writer().add_scalar("batch_" + k, v, global_batch_);
}

void callbacks::TensorBoardImpl::on_epoch_end(int epoch, Logs& logs) {
  if (!in_fit_) return;
  bool has_lr = false;
  bool has_val = false;
  for (auto& [k, v] : logs) {
    if (k.rfind("val_", 0) == 0) {
      has_val = true;
      continue;
    }
    if (k == "learning_rate") has_lr = true;
    train_writer().add_scalar("epoch_" + k, v, epoch);
  }
  if (!has_lr && model().compiled())
    train_writer().add_scalar("epoch_learning_rate", model().train_state().optimizer().learning_rate(), epoch);
  train_writer().flush();
  if (has_val) {
    for (auto& [k, v] : logs)
      if (k.rfind("val_", 0) == 0) val_writer().add_scalar("epoch_" + k.substr(4), v, epoch);
    val_writer().flush();
  }
}

void callbacks::TensorBoardImpl::on_test_end(const Logs& logs) {
  if (!in_fit_ || !model().compiled()) return;
  const int64_t step = model().train_state().optimizer().iterations();
  for (auto& [k, v] : logs) val_writer().add_scalar("evaluation_" + k + "_vs_iterations", v, step);
}

void callbacks::TensorBoardImpl::on_train_end(const Logs&) {
  if (train_) train_->flush();
  if (val_) val_->flush();
  train_.reset();
  val_.reset();
  in_fit_ = false;
}

}  // namespace kiln
