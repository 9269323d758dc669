#include "kiln/training/model_checkpoint.h"

#include <iostream>

#include "kiln/core/io.h"
#include "kiln/models/model.h"
#include "kiln/saving/model_io.h"
#include "kiln/training/path_format.h"

namespace kiln {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

callbacks::ModelCheckpointImpl::ModelCheckpointImpl(std::string filepath, callbacks::ModelCheckpointOptions options)
    : filepath_(std::move(filepath)), o_(std::move(options)) {
  check_mode("ModelCheckpoint", o_.mode);
  if (filepath_.empty()) throw ValueError("ModelCheckpoint: `filepath` must not be empty");
  if (o_.save_weights_only && !ends_with(filepath_, ".safetensors"))
    throw ValueError(
        "ModelCheckpoint: when save_weights_only is true the filepath must end in `.safetensors`. Received: "
        "filepath=" +
        filepath_);
  if (!o_.save_weights_only && ends_with(filepath_, ".safetensors"))
    throw ValueError(
        "ModelCheckpoint: a full model is saved as a model directory; the filepath must not end in "
        "`.safetensors` (set save_weights_only=true to save weights). Received: filepath=" +
        filepath_);
  best_ = o_.initial_value_threshold;
}

void callbacks::ModelCheckpointImpl::on_train_begin(const Logs&) {
  maximize_ = monitor_is_max(o_.monitor, o_.mode, &model());
  counter_.reset();
}

void callbacks::ModelCheckpointImpl::on_epoch_begin(int epoch, const Logs&) { current_epoch_ = epoch; }

void callbacks::ModelCheckpointImpl::on_train_batch_end(int64_t batch, const Logs& logs) {
  if (o_.save_freq.per_epoch()) return;
  if (counter_.should_save(batch, o_.save_freq.batches())) save(current_epoch_, batch, logs);
}

void callbacks::ModelCheckpointImpl::on_epoch_end(int epoch, Logs& logs) {
  if (o_.save_freq.per_epoch()) save(epoch, std::nullopt, logs);
}

Json callbacks::ModelCheckpointImpl::get_state() const {
  auto [last_batch, since_save] = counter_.state();
  return Json{{"best", best_ ? state_double(*best_) : Json(nullptr)},
              {"current_epoch", current_epoch_},
              {"last_batch", last_batch},
              {"since_save", since_save}};
}

void callbacks::ModelCheckpointImpl::set_state(const Json& s) {
  best_.reset();
  if (!s.at("best").is_null()) best_ = state_double(s.at("best"));
  current_epoch_ = s.at("current_epoch").get<int>();
  counter_.set_state(s.at("last_batch").get<int64_t>(), s.at("since_save").get<int64_t>());
}

std::string callbacks::ModelCheckpointImpl::file_path(int epoch, std::optional<int64_t> batch, const Logs& logs) const {
  std::map<std::string, FormatValue> values;
  for (auto& [k, v] : logs) values[k] = v;
  values["epoch"] = (int64_t)epoch + 1;
  if (batch) values["batch"] = *batch + 1;
  return python_format(filepath_, values);
}

void callbacks::ModelCheckpointImpl::save(int epoch, std::optional<int64_t> batch, const Logs& logs) {
  // Data parallel: every replica decides (the logs are reduced, so they
  // agree) and the chief alone writes; a sharded optimizer state (ZeRO) is
  // gathered to it first, which needs every replica.
  const bool chief = is_chief();
  // ModelParallel: every process takes part in the save (it gathers the
  // split variables; the chief writes).
  const bool saves = chief || has_sharded_variables(model());
  const std::string path = file_path(epoch, batch, logs);
  if (o_.save_best_only) {
    auto it = logs.find(o_.monitor);
    if (it == logs.end()) {
      if (chief) warn("Can save best model only with " + o_.monitor + " available, skipping.");
      return;
    }
    const double current = it->second;
    const bool better = !best_ || (maximize_ ? current > *best_ : current < *best_);
    if (!better) {
      if (o_.verbose > 0 && chief)
        std::cout << "\nEpoch " << epoch + 1 << ": " << o_.monitor << " did not improve from " << *best_ << "\n";
      return;
    }
    if (o_.verbose > 0 && chief)
      std::cout << "\nEpoch " << epoch + 1 << ": " << o_.monitor << " improved to " << current << ", saving model to "
                << path << "\n";
    best_ = current;
  } else if (o_.verbose > 0 && chief) {
    std::cout << "\nEpoch " << epoch + 1 << ": saving model to " << path << "\n";
  }
  if (o_.save_weights_only) {
    if (saves) model().save_weights(path);
  } else {
    model().train_state().with_full_optimizer_state([&] {
      if (saves) model().save(path, /*include_optimizer=*/true);
    });
  }
  if (chief) saved_.push_back(path);
}

}  // namespace kiln
