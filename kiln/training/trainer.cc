// Model's training entry points (declared in kiln/models/model.h, reached
// through kiln/models/model_trainer.h): compile, fit, evaluate, predict and
// the *_on_batch forms. The per-batch work is
// TrainState's step pipeline; this file is the loop around it: data, epochs,
// validation, callbacks and resuming from a checkpoint.
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>

#include "kiln/core/device.h"
#include "kiln/core/error.h"
#include "kiln/core/random.h"
#include "kiln/core/string_tensor.h"
#include "kiln/models/model.h"
#include "kiln/models/model_trainer.h"
#include "kiln/optimizers/loss_scale_optimizer.h"
#include "kiln/training/callback.h"
#include "kiln/training/checkpoint.h"
#include "kiln/training/data_adapter.h"
#include "kiln/training/fit_runner.h"
#include "kiln/training/gradient_sync.h"
#include "kiln/training/progbar.h"
#include "kiln/training/step_graph.h"
#include "kiln/training/train_state.h"

namespace kiln {
namespace {

int resolve_verbose(int verbose) {
  if (verbose < 0) return stdout_is_terminal() ? 1 : 2;
  return verbose;
}

// What the step pipeline runs on for one batch.
StepData step_data(models::Model& model, const Batch& data) {
  StepData s;
  s.model = &model;
  s.x = data.x;
  s.y = data.y;
  s.sample_weight = data.sample_weight;
  s.global_batch_size = data.global_rows;
  return s;
}

// A step's logs: what an overriding train_step/test_step returned, or (the
// defaults return {}) the compiled metrics' running results.
Logs step_logs(TrainState& ts, const Logs& returned) { return returned.empty() ? ts.results() : returned; }

// The loop evaluate() and fit()'s validation share.
Logs run_test_loop(models::Model& model, TrainState& ts, DataAdapter& data, int64_t steps, callbacks::Callback& cbs) {
  ts.reset_metrics();
  cbs.on_test_begin({});
  auto it = data.begin_epoch(0);
  Logs returned;
  for (int64_t b = 0; steps <= 0 || b < steps; ++b) {
    auto batch = it->next();
    if (!batch) break;
    cbs.on_test_batch_begin(b, {});
    returned = model.test_step(*batch);
    cbs.on_test_batch_end(b, step_logs(ts, returned));
  }
  Logs logs = step_logs(ts, returned);
  cbs.on_test_end(logs);
  return logs;
}

std::unique_ptr<DataAdapter> eval_adapter(models::Model& model, const Tensors& x, const Tensors& y,
                                          const at::Tensor& sw, const std::optional<data::Dataset>& ds,
                                          int64_t batch_size) {
  if (ds) {
    if (!x.empty() || !y.empty()) throw ValueError("pass either x/y tensors or a dataset, not both");
    auto probe = make_dataset_adapter(*ds, model.num_inputs(), 0);
    size_t n_out = build_with_probe(model, probe->sample_inputs(), true);
    return make_dataset_adapter(*ds, model.num_inputs(), n_out);
  }
  auto a = make_tensor_adapter(x, y, sw, batch_size, /*shuffle=*/false);
  build_with_probe(model, a->sample_inputs(), false);
  return a;
}

// Data parallel: rank 0's host and LibTorch RNG states to every replica (the
// same shuffles on all, so their shares of a global batch never overlap).
void broadcast_rng_states(Distribution& d) {
  share_random_state([&](std::vector<at::Tensor>& t) { d.broadcast(t); }, d.replica_id() == 0);
}

// Data parallel: every replica runs the fewest steps any replica can (their
// inputs may differ in length when not split from one global batch); -1
// (unknown) on any replica leaves it to the data, agreed batch by batch.
int64_t agree_on_steps(Distribution& d, int64_t steps) {
  std::vector<at::Tensor> all = {at::zeros({d.num_replicas()}, at::kLong)};
  all[0][d.replica_id()] = steps;
  d.all_reduce_sum(all);
  const int64_t lowest = all[0].min().item<int64_t>();
  return lowest < 0 ? -1 : lowest;
}

// A step that asked the device for more memory than it has: one line that
// names the batch size, where, and what to try (the GPU's own message says
// how much was asked and free).
[[noreturn]] void throw_out_of_memory(const std::exception& e, const Batch& data, int epoch, int64_t batch,
                                      const at::Device& device) {
  const auto* c = dynamic_cast<const c10::Error*>(&e);
  std::string why = c ? c->what_without_backtrace() : e.what();
  if (auto nl = why.find('\n'); nl != std::string::npos) why.resize(nl);
  const int64_t rows = data.x.empty() || data.x[0].dim() == 0 ? 0 : data.x[0].size(0);
  throw ResourceExhaustedError("fit: out of memory on " + device.str() + " in the step of epoch " +
                               std::to_string(epoch + 1) + ", batch " + std::to_string(batch) + " (batch size " +
                               std::to_string(rows) + "): " + why + ". Use a smaller batch_size (e.g. " +
                               std::to_string(std::max<int64_t>(1, rows / 2)) +
                               "); the last checkpoint (BackupAndRestore) is unchanged");
}

// Data parallel: rank 0's weights to every replica.
void broadcast_weights(models::Model& model, Distribution& d) {
  std::vector<at::Tensor> values;
  for (auto& v : model.weights()) values.push_back(v->value().detach());
  d.broadcast(values);
}

}  // namespace

// fit() does this before on_train_begin so checkpoint callbacks can restore
// into built variables, as Keras's symbolic build does.
size_t build_with_probe(models::Model& model, const Tensors& sample, bool force_probe) {
  if (model.built() && !force_probe) return 0;
  Tensors probe;
  for (auto& t : sample) probe.push_back(t.dim() > 0 && t.size(0) > 1 ? t.narrow(0, 0, 1) : t);
  probe = to_device(probe, model_device(model));
  at::NoGradGuard ng;
  return model(probe, false).size();
}

ValidationSplit split_validation(const Tensors& x, const Tensors& y, const at::Tensor& sw, double fraction) {
  const int64_t n = x[0].size(0);
  const int64_t split_at = (int64_t)std::ceil((double)n * (1.0 - fraction));
  if (split_at <= 0 || split_at >= n)
    throw ValueError("fit: validation_split=" + std::to_string(fraction) + " leaves " + std::to_string(split_at) +
                     " training and " + std::to_string(n - split_at) + " validation samples out of " +
                     std::to_string(n) + "; both must be non-empty");
  ValidationSplit out;
  out.x = slice_rows(x, 0, split_at);
  out.y = slice_rows(y, 0, split_at);
  out.val_x = slice_rows(x, split_at, n);
  out.val_y = slice_rows(y, split_at, n);
  if (sw.defined()) {
    out.sample_weight = sw.narrow(0, 0, split_at);
    out.val_sample_weight = sw.narrow(0, split_at, n - split_at);
  }
  return out;
}

Json fit_params_json(int verbose, int epochs, int64_t steps, bool do_validation) {
  Json p;
  p["verbose"] = verbose;
  p["epochs"] = epochs;
  p["steps"] = steps >= 0 ? Json(steps) : Json(nullptr);
  p["do_validation"] = do_validation;
  return p;
}

// --- compile -------------------------------------------------------------------

// Model's training members (kiln/models/model.h) forward here through the seam
// of kiln/models/model_trainer.h: this library registers Trainer when it loads.
namespace {

class Trainer final : public ModelTrainer {
 public:
  std::shared_ptr<TrainState> compile(models::Model& model, CompileArgs& args) override;
  History fit(models::Model& model, const FitArgs& args) override;
  std::map<std::string, double> evaluate(models::Model& model, const EvaluateArgs& args) override;
  Tensors predict(models::Model& model, const Tensors& x, const PredictArgs& args) override;
  Tensors predict(models::Model& model, const data::Dataset& ds, const PredictArgs& args) override;
  std::map<std::string, double> train_step(models::Model& model, const Batch& data) override;
  std::map<std::string, double> test_step(models::Model& model, const Batch& data) override;
  std::map<std::string, double> train_on_batch(models::Model& model, const Tensors& x, const Tensors& y,
                                               const at::Tensor& sample_weight) override;
  std::map<std::string, double> test_on_batch(models::Model& model, const Tensors& x, const Tensors& y,
                                              const at::Tensor& sample_weight) override;
  Tensors predict_on_batch(models::Model& model, const Tensors& x) override;
  void reset_metrics(models::Model& model) override;
};

[[maybe_unused]] const bool trainer_registered = register_model_trainer(std::make_unique<Trainer>());

}  // namespace

std::shared_ptr<TrainState> Trainer::compile(models::Model& model, CompileArgs& args) {
  // Keras: a mixed_float16 model trains with loss scaling; float16's range
  // loses small gradients otherwise.
  if (model.dtype_policy().source_name() == "mixed_float16" && args.optimizer &&
      !dynamic_cast<LossScaleOptimizer*>(args.optimizer.get()))
    args.optimizer = std::make_shared<LossScaleOptimizer>(args.optimizer);
  auto state = std::make_shared<TrainState>(args);
  try {
    state->bind_outputs(model.output_names());
  } catch (const ValueError&) {
    // A subclassed model counts its outputs when built: per-output losses
    // and metrics are bound (and checked) at its first step instead.
    if (model.built()) throw;
  }
  return state;
}

// --- fit -------------------------------------------------------------------------

History Trainer::fit(models::Model& model, const FitArgs& a) {
  warn_about_slow_precision(model);
  TrainState& ts = model.train_state();
  ts.loss();  // StateError without a loss
  if (a.epochs < 0) throw ValueError("fit: `epochs` must be >= 0. Received: epochs=" + std::to_string(a.epochs));
  if (a.initial_epoch < 0)
    throw ValueError("fit: `initial_epoch` must be >= 0. Received: initial_epoch=" + std::to_string(a.initial_epoch));
  if (a.validation_split < 0 || a.validation_split >= 1)
    throw ValueError("fit: `validation_split` must be in [0, 1). Received: validation_split=" +
                     std::to_string(a.validation_split));
  if (a.validation_freq < 1)
    throw ValueError("fit: `validation_freq` must be >= 1. Received: validation_freq=" +
                     std::to_string(a.validation_freq));
  // Parameter-server training and the like run fit() their own way.
  if (auto runner = std::dynamic_pointer_cast<FitRunner>(distribution())) return runner->run_fit(model, a);

  // --- data ---
  std::unique_ptr<DataAdapter> train, val;
  int64_t val_batch = a.batch_size;
  if (a.dataset) {
    if (!a.x.empty() || !a.y.empty()) throw ValueError("fit: pass either x/y tensors or a dataset, not both");
    if (a.validation_split > 0)
      throw ValueError("fit: validation_split is only supported for tensor inputs; pass validation_dataset instead");
    auto probe = make_dataset_adapter(*a.dataset, model.num_inputs(), 0);
    size_t n_out = build_with_probe(model, probe->sample_inputs(), true);
    train = make_dataset_adapter(*a.dataset, model.num_inputs(), n_out, a.class_weight);
  } else {
    if (a.x.empty()) throw ValueError("fit: no training data; pass x and y tensors or a dataset");
    if (a.y.empty()) throw ValueError("fit: no targets; pass y (one tensor per model output)");
    // Validates the lengths (ValueError naming both).
    make_tensor_adapter(a.x, a.y, a.sample_weight, a.batch_size, false);
    Tensors x = a.x, y = a.y;
    at::Tensor sw = a.sample_weight;
    if (a.validation_split > 0) {
      ValidationSplit v = split_validation(x, y, sw, a.validation_split);
      val = make_tensor_adapter(v.val_x, v.val_y, v.val_sample_weight, val_batch, false);
      x = std::move(v.x);
      y = std::move(v.y);
      sw = v.sample_weight;
    }
    train = make_tensor_adapter(x, y, sw, a.batch_size, a.shuffle, a.class_weight);
    build_with_probe(model, train->sample_inputs(), false);
  }
  if (a.validation_dataset) {
    if (val) throw ValueError("fit: pass either validation_split or validation data, not both");
    val = eval_adapter(model, {}, {}, at::Tensor(), a.validation_dataset, val_batch);
  } else if (!a.validation_x.empty()) {
    if (val) throw ValueError("fit: pass either validation_split or validation data, not both");
    if (a.validation_y.empty()) throw ValueError("fit: validation_x was given without validation_y");
    val = make_tensor_adapter(a.validation_x, a.validation_y, at::Tensor(), val_batch, false);
  }
  auto dist = distribution();
  const int replicas = dist ? dist->num_replicas() : 1;
  if (replicas > 1) {
    train = shard_batches(std::move(train));
    if (val) val = shard_batches(std::move(val));
    broadcast_rng_states(*dist);
  }
  const int64_t card = train->num_batches();
  if (card == kInfiniteCardinality && a.steps_per_epoch <= 0)
    throw ValueError("fit: the dataset is infinite; pass steps_per_epoch to say how many batches make an epoch");
  int64_t steps = a.steps_per_epoch > 0 ? a.steps_per_epoch : (card >= 0 ? card : -1);
  if (a.steps_per_epoch > 0 && card >= 0) steps = std::min(steps, card);
  if (replicas > 1) steps = agree_on_steps(*dist, steps);
  // On a GPU the next batch is copied while a step runs (identity on the CPU).
  const at::Device device = model_device(model);
  train = prefetch_to_device(std::move(train), device);
  if (val) val = prefetch_to_device(std::move(val), device);

  // --- callbacks ---
  const int verbose = resolve_verbose(a.verbose);
  callbacks::CallbackList cbs(a.callbacks, /*add_history=*/true, /*add_progbar=*/verbose != 0 && is_chief(), &model,
                              fit_params_json(verbose, a.epochs, steps, val != nullptr));
  std::vector<VariablePtr> variables = model.trainable_weights();
  // jit_compile: the step in a CUDA graph where it can be (step_graph.h).
  std::unique_ptr<CapturedTrainStep> captured;
  if (ts.compile_args().jit_compile) captured = std::make_unique<CapturedTrainStep>(ts, device);
  const int64_t per_execution = std::max<int64_t>(1, ts.compile_args().steps_per_execution);

  FitProgress& prog = ts.progress();
  prog = FitProgress();
  prog.in_fit = true;
  prog.steps_per_epoch = steps;
  model.stop_training = false;
  prog.callbacks = &cbs;
  // Model::train_step's default runs the pipeline fit()'s way: on the
  // captured graph (jit_compile) and with the trainable variables looked up
  // once.
  prog.run_train_step = [&](StepData& s) {
    s.variables = variables;
    if (captured)
      captured->run(s);
    else
      ts.train_step(s);
    if (variables.empty()) variables = s.variables;
  };
  struct ProgressReset {  // leave no stale in_fit after an exception
    FitProgress& p;
    ~ProgressReset() {
      p.in_fit = false;
      p.callbacks = nullptr;
      p.run_train_step = nullptr;
    }
  } progress_reset{prog};

  cbs.on_train_begin({});
  std::optional<ResumePoint> resume = std::move(prog.resume);
  prog.resume.reset();
  const int first_epoch = resume ? resume->epoch : a.initial_epoch;
  // The callbacks' state at the save point goes back after their
  // on_train_begin (which starts them fresh). Saved right after training was told to stop: at an epoch's end
  // (EarlyStopping) no epoch follows; mid-epoch (TerminateOnNaN) the epoch
  // ends without more batches, as it did.
  const bool stopped_at_boundary = resume && resume->stop_training && resume->batch == 0;
  const bool stopped_mid_epoch = resume && resume->stop_training && resume->batch > 0;
  if (resume) cbs.set_states({resume->callback_states, resume->callback_tensors});
  if (stopped_at_boundary) model.stop_training = true;
  // Data parallel: one set of weights (rank 0's, also after a restore), and
  // the gradient all-reduce hooked into the step for this fit().
  std::unique_ptr<ReplicaGradientSync> grad_sync;
  if (replicas > 1) {
    broadcast_weights(model, *dist);
    grad_sync = std::make_unique<ReplicaGradientSync>(ts, variables, dist);
  }

  Logs epoch_logs;
  for (int epoch = first_epoch; epoch < a.epochs && !stopped_at_boundary; ++epoch) {
    const bool mid_epoch = resume && resume->batch > 0;
    if (resume && !mid_epoch) {
      set_host_rng_state(resume->host_rng);
      set_torch_rng_state(resume->torch_rng);
      set_cuda_rng_state(device, resume->cuda_rng);
    }
    if (mid_epoch) set_host_rng_state(resume->host_rng_epoch_start);
    prog.epoch = epoch;
    prog.batch = 0;
    prog.host_rng_epoch_start = host_rng_state();
    auto it = train->begin_epoch(epoch);  // the shuffle is drawn here
    ts.reset_metrics();
    cbs.on_epoch_begin(epoch, {});
    int64_t b = 0;
    if (mid_epoch) {
      // Metrics of the batches already done, then the RNGs as they were.
      auto metrics = ts.all_metrics();
      for (size_t i = 0; i < resume->metric_variables.size() && i < metrics.size(); ++i) {
        auto vars = metrics[i]->variables();
        const Tensors& saved = resume->metric_variables[i];
        if (saved.size() != vars.size()) continue;
        at::NoGradGuard ng;
        // The checkpoint holds every replica's sums: the chief takes them.
        for (size_t j = 0; j < vars.size(); ++j)
          if (is_chief())
            vars[j].copy_(saved[j]);
          else
            vars[j].zero_();
      }
      it->skip(resume->batch);  // before the RNGs: skipping must not disturb them
      set_host_rng_state(resume->host_rng);
      set_torch_rng_state(resume->torch_rng);
      set_cuda_rng_state(device, resume->cuda_rng);
      b = resume->batch;
      prog.batch = b;
    }
    const bool skip_batches = mid_epoch && stopped_mid_epoch;
    if (skip_batches) model.stop_training = true;
    resume.reset();

    // Keras's steps_per_execution: the batch callbacks (and with them the
    // host's reads of the loss and metrics) once per `per_execution` steps.
    int64_t execution_begin = -1;
    Logs returned;  // the last train_step's own logs ({}: the compiled metrics)
    for (; !skip_batches && (steps < 0 || b < steps); ++b) {
      auto batch = it->next();
      if (!batch) break;
      if (execution_begin < 0) {
        execution_begin = b;
        cbs.on_train_batch_begin(b, {});
      }
      try {
        returned = model.train_step(*batch);
      } catch (const std::exception& e) {
        if (!is_out_of_memory(e) || dynamic_cast<const UserError*>(&e)) throw;
        throw_out_of_memory(e, *batch, epoch, b, device);
      }
      prog.batch = b + 1;
      if (b + 1 - execution_begin < per_execution && (steps < 0 || b + 1 < steps)) continue;
      execution_begin = -1;
      cbs.on_train_batch_end(b, step_logs(ts, returned));
      if (model.stop_training) break;
    }
    // The data ended inside an execution: it ends there.
    if (execution_begin >= 0) cbs.on_train_batch_end(b - 1, step_logs(ts, returned));
    if (steps < 0 && !skip_batches) {  // unknown cardinality: the first pass tells
      steps = b;
      prog.steps_per_epoch = b;
    }
    epoch_logs = step_logs(ts, returned);
    if (val && (epoch + 1) % a.validation_freq == 0) {
      Logs vl = run_test_loop(model, ts, *val, a.validation_steps, cbs);
      for (auto& [k, v] : vl) epoch_logs["val_" + k] = v;
    }
    cbs.on_epoch_end(epoch, epoch_logs);
    if (model.stop_training) break;
  }
  // As Keras: the optimizer's final say (use_ema swaps in the averages) comes
  // before on_train_end, so EarlyStopping's restore still wins.
  if (a.epochs > 0) {
    if (grad_sync)
      grad_sync->finalize_variable_values(model.trainable_weights());
    else
      ts.optimizer().finalize_variable_values(model.trainable_weights());
  }
  // Sharded optimizer state (ZeRO): whole again on the chief (what a save
  // after fit() writes); the other replicas keep their own slots.
  if (grad_sync) grad_sync->finish();
  cbs.on_train_end(epoch_logs);
  return cbs.history()->history();
}

// --- evaluate / predict ------------------------------------------------------------

std::map<std::string, double> Trainer::evaluate(models::Model& model, const EvaluateArgs& a) {
  warn_about_slow_precision(model);
  TrainState& ts = model.train_state();
  ts.loss();
  // Data parallel: each replica evaluates its share of every batch.
  auto data = shard_batches(eval_adapter(model, a.x, a.y, a.sample_weight, a.dataset, a.batch_size));
  data = prefetch_to_device(std::move(data), model_device(model));
  int64_t card = data->num_batches();
  if (card == kInfiniteCardinality && a.steps <= 0) throw ValueError("evaluate: the dataset is infinite; pass `steps`");
  int64_t steps = a.steps > 0 ? (card >= 0 ? std::min(a.steps, card) : a.steps) : (card >= 0 ? card : -1);
  const int verbose = resolve_verbose(a.verbose);
  callbacks::CallbackList cbs(a.callbacks, false, verbose != 0 && is_chief(), &model,
                              fit_params_json(verbose, 1, steps, false));
  return run_test_loop(model, ts, *data, a.steps, cbs);
}

namespace {

// One output's batches end to end. A string output (StringLookup(invert=true);
// kiln/core/string_tensor.h) has the row width of each batch's longest
// string: its batches are padded to the widest.
at::Tensor join_batches(const Tensors& batches) {
  bool widths_differ = false;
  for (const auto& b : batches)
    widths_differ |= b.scalar_type() == string_storage_dtype && b.dim() >= 2 && b.dim() == batches[0].dim() &&
                     b.size(-1) != batches[0].size(-1);
  return widths_differ ? strings::concat(batches, 0) : at::cat(batches, 0);
}

// Outputs come back on the host (Keras returns NumPy arrays), in one copy
// per output after the last batch.
Tensors predict_loop(models::Model& model, std::unique_ptr<DataAdapter> adapter, const PredictArgs& a) {
  if (a.steps < 0) throw ValueError("predict: `steps` must be >= 0. Received: steps=" + std::to_string(a.steps));
  const int v = resolve_verbose(a.verbose);
  std::unique_ptr<DataAdapter> on_device = prefetch_to_device(std::move(adapter), model_device(model));
  DataAdapter& data = *on_device;
  const int64_t card = data.num_batches();
  if (card == kInfiniteCardinality && a.steps == 0)
    throw ValueError("predict: the dataset is infinite; pass `steps` to say how many batches to predict");
  int64_t steps = card >= 0 ? card : -1;
  if (a.steps > 0) steps = steps >= 0 ? std::min(steps, a.steps) : a.steps;
  callbacks::CallbackList cbs(a.callbacks, false, v != 0 && is_chief(), &model, fit_params_json(v, 1, steps, false));
  cbs.on_predict_begin({});
  std::vector<Tensors> parts;
  auto it = data.begin_epoch(0);
  at::NoGradGuard ng;
  for (int64_t b = 0; a.steps == 0 || b < a.steps; ++b) {
    auto batch = it->next();
    if (!batch) break;
    cbs.on_predict_batch_begin(b, {});
    Tensors out = model.predict_step(batch->x);
    if (parts.empty()) parts.resize(out.size());
    if (out.size() != parts.size())
      throw Error("predict: the model returned a different number of outputs between batches");
    for (size_t i = 0; i < out.size(); ++i) parts[i].push_back(out[i].detach());
    cbs.on_predict_batch_end(b, {});
  }
  cbs.on_predict_end({});
  Tensors result;
  for (auto& p : parts) result.push_back(join_batches(p).to(at::kCPU));
  return result;
}

}  // namespace

Tensors Trainer::predict(models::Model& model, const Tensors& x, const PredictArgs& args) {
  warn_about_slow_precision(model);
  auto data = make_tensor_adapter(x, {}, at::Tensor(), args.batch_size, false);
  return predict_loop(model, std::move(data), args);
}

Tensors Trainer::predict(models::Model& model, const data::Dataset& ds, const PredictArgs& args) {
  warn_about_slow_precision(model);
  auto data = make_dataset_adapter(ds, model.num_inputs(), 0);
  return predict_loop(model, std::move(data), args);
}

// --- the default train/test steps ----------------------------------------------------

std::map<std::string, double> Trainer::train_step(models::Model& model, const Batch& data) {
  TrainState& ts = model.train_state();
  StepData s = step_data(model, data);
  if (ts.progress().run_train_step)
    ts.progress().run_train_step(s);
  else
    ts.train_step(s);
  return {};
}

std::map<std::string, double> Trainer::test_step(models::Model& model, const Batch& data) {
  TrainState& ts = model.train_state();
  StepData s = step_data(model, data);
  ts.test_step(s);
  return {};
}

// --- on_batch ------------------------------------------------------------------------

void Trainer::reset_metrics(models::Model& model) { model.train_state().reset_metrics(); }

namespace {

// train_on_batch / test_on_batch's one batch, on the model's device.
Batch on_batch_data(models::Model& model, const Tensors& x, const Tensors& y, const at::Tensor& sample_weight) {
  make_tensor_adapter(x, y, sample_weight, 1, false);  // validates lengths
  const at::Device device = model_device(model);
  Batch data;
  data.x = to_device(x, device);
  data.y = to_device(y, device);
  if (sample_weight.defined()) data.sample_weight = sample_weight.to(device, at::kFloat);
  return data;
}

}  // namespace

std::map<std::string, double> Trainer::train_on_batch(models::Model& model, const Tensors& x, const Tensors& y,
                                                      const at::Tensor& sample_weight) {
  TrainState& ts = model.train_state();
  Batch data = on_batch_data(model, x, y, sample_weight);
  ts.reset_metrics();  // this batch's values only (Keras 3)
  return step_logs(ts, model.train_step(data));
}

std::map<std::string, double> Trainer::test_on_batch(models::Model& model, const Tensors& x, const Tensors& y,
                                                     const at::Tensor& sample_weight) {
  TrainState& ts = model.train_state();
  Batch data = on_batch_data(model, x, y, sample_weight);
  ts.reset_metrics();
  return step_logs(ts, model.test_step(data));
}

Tensors Trainer::predict_on_batch(models::Model& model, const Tensors& x) {
  at::NoGradGuard ng;
  Tensors out = model.predict_step(to_device(x, model_device(model)));
  for (auto& t : out) t = t.detach().to(at::kCPU);
  return out;
}

}  // namespace kiln
