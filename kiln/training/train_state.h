// TrainState: what Model::compile() sets up and fit()/evaluate() run on —
// the optimizer, the loss, the metrics (with a Mean "loss" tracker first),
// the compile arguments, and the train step as a pipeline of stages.
//
// The train step is a pipeline (docs/DESIGN.md, "The train step is a
// pipeline"), one std::function per stage:
//
//   forward            model(x, training) under the model's dtype policy
//                      (Layer::operator() casts inputs to the compute dtype)
//   compute_loss       compiled loss in float32 + model.regularization_loss()
//   scale_loss         optimizer.scale_loss(loss): identity, or times a
//                      LossScaleOptimizer's scale (mixed_float16 gets one in compile())
//   backward           gradients of the scaled loss w.r.t. trainable variables
//   reduce_gradients   cross-replica reduction seam (identity; a Distribution
//                      replaces it with an allreduce)
//   unscale_and_check  unscale / finite-check seam (identity; may set
//                      StepData::apply_update = false to skip a step)
//   apply_gradients    optimizer.apply_gradients(grads, variables)
//   update_metrics     loss tracker (weighted by batch size) and metrics
//
// A strategy replaces one stage without touching fit() (the gradient sync
// and the parameter-server strategy do so), e.g.:
//   auto& p = model->train_state().pipeline();
//   p.scale_loss = [scaler](StepData& s) { s.scaled_loss = s.loss * scaler->scale(); };
//
// The test step (evaluate, validation) runs forward (training=false, no grad),
// compute_loss and update_metrics of the same pipeline.
//
// Model::train_step / test_step's defaults run these steps; a model with
// custom training logic overrides them rather than editing the stages
// (docs/DESIGN.md, "Custom training logic: train_step").
//
// FitProgress is where fit() is (epoch, batch, the host RNG state at the
// start of the epoch); callbacks that checkpoint (BackupAndRestore) read it
// and may set `resume` in on_train_begin to make fit() continue from a saved
// point (see kiln/training/checkpoint.h).
//
// Thread safety: none; the training loop owns the state.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/models/fit_args.h"

namespace kiln {

namespace models {
class Model;
}

// One batch flowing through the step pipeline. Each stage reads what earlier
// stages wrote and fills its own fields.
struct StepData {
  models::Model* model = nullptr;
  Tensors x, y;
  at::Tensor sample_weight;  // undefined: all ones
  bool training = true;
  // forward
  Tensors y_pred;
  // forward: the outputs' masks (Layer::call_with_masks; undefined = none).
  // compute_loss and update_metrics weight masked entries 0, as Keras 3.
  Tensors y_pred_masks;
  // compute_loss: float32 scalar, compiled loss summed over outputs plus
  // regularization losses. Tracked by the "loss" metric.
  at::Tensor loss;
  // compute_loss: each output's unweighted loss (undefined where an output
  // has none), logged as "<output>_loss" when the model has several outputs.
  Tensors output_losses;
  // scale_loss: what backward differentiates.
  at::Tensor scaled_loss;
  // backward: grads[i] belongs to variables[i] (undefined if unused).
  std::vector<VariablePtr> variables;
  Tensors grads;
  // unscale_and_check may veto the update (non-finite gradients).
  bool apply_update = true;
  int64_t batch_size() const { return x.empty() || x[0].dim() == 0 ? 1 : x[0].size(0); }
  // Data-parallel: rows of the global batch this replica's batch is a share
  // of (-1: not sharded). The gradient sync weights by batch_size() / this.
  int64_t global_batch_size = -1;
};

class TrainState;

struct StepPipeline {
  using Stage = std::function<void(TrainState&, StepData&)>;
  Stage forward;
  Stage compute_loss;
  Stage scale_loss;
  Stage backward;
  Stage reduce_gradients;
  Stage unscale_and_check;
  Stage apply_gradients;
  Stage update_metrics;

  // The stages described above.
  static StepPipeline standard();
};

// A point to continue training from (set by a checkpointing callback during
// on_train_begin; consumed by fit()).
struct ResumePoint {
  int epoch = 0;      // the epoch to run next (0-based)
  int64_t batch = 0;  // batches of that epoch already done; 0: epoch boundary
  // kiln's host RNG (textual std::mt19937_64 state) at the save point and at
  // the start of `epoch` (before its shuffle), and LibTorch's CPU generator
  // state at the save point.
  std::string host_rng;
  std::string host_rng_epoch_start;
  at::Tensor torch_rng;
  // LibTorch's generator of the GPU fit() computes on (dropout and other
  // random layers draw from it there); undefined when fit() is on the CPU.
  at::Tensor cuda_rng;
  // Metric accumulators at the save point, in TrainState::all_metrics()
  // order (mid-epoch only), so the epoch's logs match an uninterrupted run.
  std::vector<Tensors> metric_variables;
  // Model::stop_training at the save point (an EarlyStopping that stopped
  // at this epoch's end: the resumed run ends without another epoch).
  bool stop_training = false;
  // Every callback's state (CallbackList::get_states), given back by fit()
  // after on_train_begin.
  Json callback_states = Json::object();
  std::map<std::string, at::Tensor> callback_tensors;
};

namespace callbacks {
class CallbackList;
}

struct FitProgress {
  bool in_fit = false;
  int epoch = 0;                 // current epoch (0-based)
  int64_t batch = 0;             // batches finished in the current epoch
  int64_t steps_per_epoch = -1;  // -1: unknown until the first epoch ends
  std::string host_rng_epoch_start;
  std::optional<ResumePoint> resume;
  // The running fit()'s callbacks (borrowed; null outside fit()), for
  // checkpoint writers to collect every callback's state.
  callbacks::CallbackList* callbacks = nullptr;
  // Sharded optimizer state (ZeRO): set by data-parallel fit() while the
  // optimizer holds only this replica's slots; see
  // TrainState::with_full_optimizer_state.
  std::function<void(const std::function<void()>&)> with_full_optimizer_state;
  // How Model::train_step's default runs the pipeline inside fit() (the
  // captured graph with jit_compile, the cached variables); null outside fit().
  std::function<void(StepData&)> run_train_step;
};

class TrainState {
 public:
  // Validates `args` (an optimizer is required). Metrics track output 0
  // until bind_outputs() says how many outputs the model has.
  explicit TrainState(const CompileArgs& args);

  // Assigns the compiled metrics to the model's outputs (Model::compile
  // calls it with Model::output_names()): one output keeps the metrics'
  // own names; several give each output its own copies named
  // "<output>_<metric>" (flat list) or the per-output lists of
  // CompileArgs::output_metrics. ValueError if output_metrics has a
  // different number of lists than outputs, or names collide.
  void bind_outputs(const std::vector<std::string>& output_names);
  // How many outputs the metrics are bound to (the forward stage rebinds
  // when a model, e.g. a subclassed one, returns another number).
  size_t bound_outputs() const { return bound_outputs_; }

  const CompileArgs& compile_args() const { return args_; }
  Optimizer& optimizer() { return *args_.optimizer; }
  bool has_loss() const;
  // The compiled loss (with per-output losses: the first one). StateError if
  // compiled without a loss.
  Loss& loss();
  // Per output, after bind_outputs(): its loss (null where it has none) and
  // its weight in the total.
  const std::vector<LossPtr>& output_losses() const { return losses_; }
  const std::vector<double>& output_loss_weights() const { return loss_weights_; }
  // The "<output>_loss" tracker of an output; null with one output or no loss.
  Mean* output_loss_tracker(size_t output) {
    return output < output_loss_trackers_.size() ? output_loss_trackers_[output].get() : nullptr;
  }
  // The loss tracker ("loss"), the per-output loss trackers ("<output>_loss",
  // several outputs only), then the compiled metrics.
  std::vector<Metric*> all_metrics();
  Mean& loss_tracker() { return *loss_tracker_; }
  // "loss", then the compiled metrics' names, in order (the order Keras
  // prints and the order of logs).
  std::vector<std::string> metric_names() const;
  // Which output each compiled metric reads.
  const std::vector<size_t>& metric_outputs() const { return metric_outputs_; }
  // Higher-is-better for a metric name ("val_" stripped); nullopt if the
  // name is unknown. "loss" is lower-is-better.
  std::optional<bool> higher_is_better(const std::string& name) const;

  void reset_metrics();
  // Current (running) results of the loss tracker and every metric. Under
  // data parallelism they cover every replica's batches (a collective: all
  // replicas call it at the same points, as fit() and evaluate() do);
  // local_results() is this replica's alone.
  std::map<std::string, double> results() const;
  std::map<std::string, double> local_results() const;

  StepPipeline& pipeline() { return pipeline_; }
  FitProgress& progress() { return progress_; }
  // Runs `fn` on every replica; while it runs the chief's optimizer holds
  // the whole state even when fit() shards it across the replicas (ZeRO),
  // so a checkpoint the chief writes in `fn` is complete. With sharding it
  // is a collective: every replica calls it at the same point. Otherwise
  // it just calls `fn`.
  void with_full_optimizer_state(const std::function<void()>& fn) {
    if (progress_.with_full_optimizer_state)
      progress_.with_full_optimizer_state(fn);
    else
      fn();
  }

  // Runs the train pipeline on one batch; `s.variables` may be pre-filled
  // (fit() caches them), otherwise the model's trainable weights are used.
  void train_step(StepData& s);
  // forward (training=false, no grad), compute_loss, update_metrics.
  void test_step(StepData& s);

 private:
  void bind_unprefixed();
  CompileArgs args_;
  std::shared_ptr<Mean> loss_tracker_;
  std::vector<MetricPtr> metrics_;      // compiled metrics, bound to outputs
  std::vector<size_t> metric_outputs_;  // metrics_[i] reads output metric_outputs_[i]
  std::vector<LossPtr> losses_;         // per output; null: no loss for it
  std::vector<double> loss_weights_;    // per output
  // "<output>_loss" per output with a loss, when the model has several.
  std::vector<std::shared_ptr<Mean>> output_loss_trackers_;
  size_t bound_outputs_ = 0;  // 0: not bound yet (the first step binds)
  StepPipeline pipeline_;
  FitProgress progress_;
};

}  // namespace kiln
