// TensorBoard: scalar curves TensorBoard can read (Keras's
// keras.callbacks.TensorBoard, scalars only).
//
//   std::make_shared<TensorBoard>("logs/run1");
//   // then: tensorboard --logdir logs
//
// Writes real event files (see tfevents.h) under log_dir/train and
// log_dir/validation, with Keras's tags: per epoch (step = epoch)
// "epoch_loss", "epoch_accuracy", ..., "epoch_learning_rate" in train/ and
// the val_ entries without their prefix ("epoch_loss") in validation/; after
// each validation "evaluation_<name>_vs_iterations" (step = optimizer
// iterations) in validation/. update_freq = N batches also writes
// "batch_<name>" every N batches (step = global batch). Files are flushed at
// each epoch end.
#pragma once

#include <memory>
#include <string>

#include "kiln/layers/layer_holder.h"
#include "kiln/training/callback.h"
#include "kiln/training/save_freq.h"
#include "kiln/training/tfevents.h"

namespace kiln {

namespace callbacks {

struct TensorBoardOptions {
  SaveFreq update_freq = SaveFreq();  // "epoch" or N batches
};

class TensorBoardImpl : public Callback {
 public:
  explicit TensorBoardImpl(std::string log_dir = "logs", TensorBoardOptions options = {});

  void on_train_begin(const Logs& logs) override;
  void on_train_batch_end(int64_t batch, const Logs& logs) override;
  void on_epoch_end(int epoch, Logs& logs) override;
  void on_test_end(const Logs& logs) override;
  void on_train_end(const Logs& logs) override;

  // The global batch counter (batch summaries' step).
  Json get_state() const override { return Json{{"global_batch", global_batch_}}; }
  void set_state(const Json& state) override { global_batch_ = state.at("global_batch").get<int64_t>(); }
  std::string state_name() const override { return "TensorBoard"; }

  const std::string& log_dir() const { return log_dir_; }

 private:
  EventFileWriter& train_writer();
  EventFileWriter& val_writer();

  std::string log_dir_;
  TensorBoardOptions o_;
  std::unique_ptr<EventFileWriter> train_, val_;
  int64_t global_batch_ = 0;
  bool in_fit_ = false;
};
KILN_LAYER_HOLDER(TensorBoard, void);

}  // namespace callbacks

}  // namespace kiln

#define KILN_LEGACY_CALLBACKS_TENSORBOARD_H
#include "kiln/training/legacy_names.h"
