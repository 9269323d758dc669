// ModelCheckpoint: save the model (or its weights) during training
// (Keras's keras.callbacks.ModelCheckpoint, same defaults and rules).
//
//   // a model directory per improving epoch: ckpt/model-03-0.41/
//   std::make_shared<ModelCheckpoint>("ckpt/model-{epoch:02d}-{val_loss:.2f}",
//       ModelCheckpointOptions{.save_best_only = true});
//   // weights only, every 100 batches
//   std::make_shared<ModelCheckpoint>("ckpt/w-{epoch}-{batch}.safetensors",
//       ModelCheckpointOptions{.save_weights_only = true, .save_freq = 100});
//
// `filepath` is formatted with python_format: {epoch} (1-based), {batch}
// (1-based, batch saves only) and any log entry ({val_loss:.2f}).
// save_weights_only writes Model::save_weights (the path must end in
// ".safetensors"); otherwise Model::save writes a model directory. Both are
// atomic: a crash leaves the previous file/directory intact.
// save_best_only saves only when `monitor` improves on the best value seen
// (mode auto/min/max as monitor_is_max; initial_value_threshold seeds the
// best). With save_freq = N batches the logs are the running averages at
// that batch.
#pragma once

#include <optional>
#include <string>

#include "kiln/layers/layer_holder.h"
#include "kiln/training/callback.h"
#include "kiln/training/save_freq.h"

namespace kiln {

namespace callbacks {

struct ModelCheckpointOptions {
  std::string monitor = "val_loss";
  int verbose = 0;
  bool save_best_only = false;
  bool save_weights_only = false;
  std::string mode = "auto";
  SaveFreq save_freq = SaveFreq();  // "epoch"
  std::optional<double> initial_value_threshold;
};

class ModelCheckpointImpl : public Callback {
 public:
  explicit ModelCheckpointImpl(std::string filepath, ModelCheckpointOptions options = {});

  void on_train_begin(const Logs& logs) override;
  void on_epoch_begin(int epoch, const Logs& logs) override;
  void on_train_batch_end(int64_t batch, const Logs& logs) override;
  void on_epoch_end(int epoch, Logs& logs) override;

  // best, the batch counter (save_freq = N) and the current epoch.
  Json get_state() const override;
  void set_state(const Json& state) override;
  std::string state_name() const override { return "ModelCheckpoint"; }

  // The path for these values (the formatted filepath).
  std::string file_path(int epoch, std::optional<int64_t> batch, const Logs& logs) const;
  std::optional<double> best() const { return best_; }
  // Paths written so far, in order.
  const std::vector<std::string>& saved() const { return saved_; }

 private:
  void save(int epoch, std::optional<int64_t> batch, const Logs& logs);

  std::string filepath_;
  ModelCheckpointOptions o_;
  bool maximize_ = false;
  std::optional<double> best_;
  int current_epoch_ = 0;
  BatchCounter counter_;
  std::vector<std::string> saved_;
};
KILN_LAYER_HOLDER(ModelCheckpoint, void);

}  // namespace callbacks

}  // namespace kiln

#define KILN_LEGACY_CALLBACKS_MODEL_CHECKPOINT_H
#include "kiln/training/legacy_names.h"
