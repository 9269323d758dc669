// BackupAndRestore: fault tolerance for fit() (Keras's
// keras.callbacks.BackupAndRestore, extended to resume mid-epoch exactly).
//
//   set_random_seed(42);
//   auto model = make_model();  model->compile(...);
//   model->fit({.x = {x}, .y = {y}, .epochs = 10,
//               .callbacks = {std::make_shared<BackupAndRestore>("backup",
//                   BackupAndRestoreOptions{.save_freq = 50})}});
//
// Run the same program again after a crash (even kill -9 at any moment)
// and fit() continues from the last checkpoint, ending with weights
// bit-identical to a run that was never interrupted. A checkpoint
// (checkpoint.h) holds the weights, the optimizer state, the metric
// accumulators, the epoch and batch-in-epoch, kiln's host RNG state (at
// the save point and at the epoch's start, to redraw the same shuffle) and
// LibTorch's CPU generator state; it is published atomically, so a crash
// while writing leaves the previous one in force.
//
// save_freq "epoch" saves after each epoch's on_epoch_end; N saves every N
// batches (mid-epoch resume skips the finished batches of the same
// shuffle). delete_checkpoint removes backup_dir when training ends
// normally (not when an exception interrupts it).
//
// Every callback's state (Callback::get_state: EarlyStopping's patience
// count and best weights, ReduceLROnPlateau's, ModelCheckpoint's best
// value, CSVLogger's file position, TensorBoard's step,
// LearningRateScheduler's epoch) and model.stop_training are part of each
// checkpoint (a LearningRateSchedule on the optimizer needs nothing more:
// it is a function of the optimizer's iterations, which are saved), so a
// run killed after a callback acted resumes as if never interrupted. This
// callback saves after every other callback's on_epoch_end /
// on_train_batch_end, whatever its place in the list.
//
// Determinism needs the same program: same seed, model, data, callbacks.
// The model is built by fit() before on_train_begin, so restoring works for
// models built lazily.
#pragma once

#include <string>

#include "kiln/layers/layer_holder.h"
#include "kiln/training/callback.h"
#include "kiln/training/save_freq.h"

namespace kiln {

namespace callbacks {

struct BackupAndRestoreOptions {
  SaveFreq save_freq = SaveFreq();  // "epoch" or N batches
  bool delete_checkpoint = true;
  int keep = 2;  // checkpoints kept (>= 1); older ones are the fallback if the newest is damaged
};

class BackupAndRestoreImpl : public Callback {
 public:
  explicit BackupAndRestoreImpl(std::string backup_dir, BackupAndRestoreOptions options = {});

  void on_train_begin(const Logs& logs) override;
  void on_train_batch_end(int64_t batch, const Logs& logs) override;
  void on_epoch_end(int epoch, Logs& logs) override;
  void on_train_end(const Logs& logs) override;
  bool is_checkpointer() const override { return true; }

  const std::string& backup_dir() const { return dir_; }
  const BackupAndRestoreOptions& options() const { return o_; }
  // Whether on_train_end removes backup_dir. A program that publishes the
  // trained model afterwards turns this off and removes the directory
  // itself once the model is safely published (kiln train does).
  void set_delete_checkpoint(bool on) { o_.delete_checkpoint = on; }
  // Whether the last on_train_begin found a checkpoint, and where it resumed.
  bool restored() const { return restored_; }
  int restored_epoch() const { return restored_epoch_; }
  int64_t restored_batch() const { return restored_batch_; }

 private:
  std::string dir_;
  BackupAndRestoreOptions o_;
  BatchCounter counter_;
  bool restored_ = false;
  int restored_epoch_ = 0;
  int64_t restored_batch_ = 0;
};
KILN_LAYER_HOLDER(BackupAndRestore, void);

}  // namespace callbacks

}  // namespace kiln

#define KILN_LEGACY_CALLBACKS_BACKUP_AND_RESTORE_H
#include "kiln/training/legacy_names.h"
