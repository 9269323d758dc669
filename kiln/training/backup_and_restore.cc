#include "kiln/training/backup_and_restore.h"

#include "kiln/core/io.h"
#include "kiln/models/model.h"
#include "kiln/saving/model_io.h"
#include "kiln/training/checkpoint.h"
#include "kiln/training/data_adapter.h"
#include "kiln/training/train_state.h"

namespace kiln {

callbacks::BackupAndRestoreImpl::BackupAndRestoreImpl(std::string backup_dir,
                                                      callbacks::BackupAndRestoreOptions options)
    : dir_(std::move(backup_dir)), o_(options) {
  if (dir_.empty()) throw ValueError("BackupAndRestore: `backup_dir` must not be empty");
  if (o_.keep < 1) throw ValueError("BackupAndRestore: `keep` must be >= 1. Received: keep=" + std::to_string(o_.keep));
}

namespace {

// Every callback's state and stop_training, as they are now.
void add_callback_state(models::Model& model, ResumePoint& point) {
  point.stop_training = model.stop_training;
  if (callbacks::CallbackList* cbs = model.train_state().progress().callbacks) {
    callbacks::CallbackList::States st = cbs->get_states();
    point.callback_states = std::move(st.json);
    point.callback_tensors = std::move(st.tensors);
  }
}

}  // namespace

void callbacks::BackupAndRestoreImpl::on_train_begin(const Logs&) {
  counter_.reset();
  restored_ = false;
  auto point = restore_training_checkpoint(dir_, model());
  if (!point) return;
  restored_ = true;
  restored_epoch_ = point->epoch;
  restored_batch_ = point->batch;
  counter_.start_at(point->batch);  // count from the resumed batch, not from 0
  model().train_state().progress().resume = std::move(*point);
}

void callbacks::BackupAndRestoreImpl::on_train_batch_end(int64_t batch, const Logs&) {
  if (o_.save_freq.per_epoch() || !counter_.should_save(batch, o_.save_freq.batches())) return;
  TrainState& ts = model().train_state();
  const FitProgress& p = ts.progress();
  ResumePoint point;
  point.epoch = p.epoch;
  point.batch = p.batch;
  point.host_rng = host_rng_state();
  point.host_rng_epoch_start = p.host_rng_epoch_start;
  point.torch_rng = torch_rng_state();
  point.cuda_rng = cuda_rng_state(model_device(model()));
  for (Metric* m : ts.all_metrics()) {
    Tensors vars;
    for (auto& v : m->variables()) vars.push_back(v.detach().clone());
    // Data parallel: the checkpoint holds every replica's sums (a
    // collective; every replica saves at the same batch).
    if (auto d = distribution()) d->all_reduce_sum(vars);
    point.metric_variables.push_back(vars);
  }
  add_callback_state(model(), point);
  // Data parallel: the chief alone writes (a sharded optimizer state, ZeRO,
  // is gathered to it first: every replica calls). ModelParallel: every
  // process gathers the split variables, the chief writes.
  model().train_state().with_full_optimizer_state([&] {
    if (is_chief() || has_sharded_variables(model())) write_training_checkpoint(dir_, model(), point, o_.keep);
  });
}

void callbacks::BackupAndRestoreImpl::on_epoch_end(int epoch, Logs&) {
  if (!o_.save_freq.per_epoch()) return;
  ResumePoint point;
  point.epoch = epoch + 1;
  point.batch = 0;
  point.host_rng = host_rng_state();
  point.host_rng_epoch_start = point.host_rng;
  point.torch_rng = torch_rng_state();
  point.cuda_rng = cuda_rng_state(model_device(model()));
  add_callback_state(model(), point);
  // Data parallel: the chief alone writes (a sharded optimizer state, ZeRO,
  // is gathered to it first: every replica calls). ModelParallel: every
  // process gathers the split variables, the chief writes.
  model().train_state().with_full_optimizer_state([&] {
    if (is_chief() || has_sharded_variables(model())) write_training_checkpoint(dir_, model(), point, o_.keep);
  });
}

void callbacks::BackupAndRestoreImpl::on_train_end(const Logs&) {
  if (o_.delete_checkpoint && is_chief()) remove_all(dir_);
}

}  // namespace kiln
