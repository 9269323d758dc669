// Arguments and results of Model::compile/fit/evaluate/predict and the
// train/test steps, with
// Keras's names and defaults.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/json.h"
#include "kiln/data/dataset.h"
#include "kiln/losses/loss.h"
#include "kiln/metrics/metric.h"
#include "kiln/optimizers/optimizer.h"

namespace kiln {

namespace callbacks {
class Callback;
}  // namespace callbacks
using CallbackPtr = std::shared_ptr<callbacks::Callback>;
using Tensors = std::vector<at::Tensor>;

struct CompileArgs {
  OptimizerPtr optimizer;  // required
  // Required for fit/evaluate: one loss for every output, or (several
  // outputs) one per output: `output_losses` in output order (Keras's list)
  // or `named_losses` by output name (Keras's dict; an output without an
  // entry adds nothing to the total). Give one of the three.
  LossPtr loss;
  std::vector<LossPtr> output_losses;
  std::vector<std::pair<std::string, LossPtr>> named_losses;
  // Keras's loss_weights: the total loss is sum_i w_i * loss_i (default 1),
  // in output order or by output name.
  std::vector<double> loss_weights;
  std::vector<std::pair<std::string, double>> named_loss_weights;
  // Metrics. With several outputs, a flat list applies to every output
  // (each gets its own copy, named "<output>_<metric>", as Keras does);
  // output_metrics (Keras's nested list, one list per output, in output
  // order) picks them per output instead. Use one or the other.
  std::vector<MetricPtr> metrics;
  std::vector<std::vector<MetricPtr>> output_metrics;
  // Keras's dict form: metrics by output name.
  std::vector<std::pair<std::string, std::vector<MetricPtr>>> named_metrics;
  // Keras's steps_per_execution: fit() runs this many steps between host
  // round trips. The batch-level callbacks are called once per execution
  // (on_train_batch_begin with its first step, on_train_batch_end with its
  // last, as Keras 3 does), so the loss and metrics are read from the
  // device once per execution, not after every step. The weights are the
  // same as with 1.
  int64_t steps_per_execution = 1;
  // Keras's jit_compile: on a GPU, fit() captures the train step's forward
  // pass, loss, backward pass and metric updates in a CUDA graph and replays
  // it for every batch of the same shapes (one launch instead of one per
  // operation); the optimizer's update runs after it as usual. Where it
  // cannot capture it runs the step eagerly and says why once
  // (kiln/training/step_graph.h). "auto" in a compile config is false.
  bool jit_compile = false;
  // Keras names: compile("adam", "sparse_categorical_crossentropy", {"accuracy"}).
  static CompileArgs from_names(const std::string& optimizer, const std::string& loss,
                                const std::vector<std::string>& metrics = {});
  // Keras 3's compile config (model.get_compile_config()): {"optimizer":
  // name|{class_name,config}, "loss": name|object|[...]|{output: ...},
  // "loss_weights": [...]|{...}, "metrics": [...]|[[...], ...]|{output:
  // ...}, "weighted_metrics", "run_eagerly", "steps_per_execution",
  // "jit_compile", "auto_scale_loss"}. What kiln cannot honour is refused
  // with the reason (ValueError); unknown keys are errors.
  static CompileArgs from_json(const Json& j);
  // The same form, objects serialized as Keras writes them
  // ({"module", "class_name", "config", "registered_name"}).
  Json to_json() const;
};

// fit() input: tensors (x, y) or a Dataset whose elements are
// (inputs..., targets..., [sample_weight]) batches.
struct FitArgs {
  Tensors x;                             // one tensor per model input
  Tensors y;                             // one tensor per model output
  at::Tensor sample_weight;              // optional, shape (N,)
  std::optional<data::Dataset> dataset;  // instead of x/y (already batched)
  int64_t batch_size = 32;
  int epochs = 1;
  // 0 silent, 1 progress bar, 2 one line per epoch; -1 "auto": 1 on a
  // terminal, 2 otherwise.
  int verbose = -1;
  std::vector<CallbackPtr> callbacks;
  double validation_split = 0.0;  // last fraction of x/y, before shuffling
  Tensors validation_x, validation_y;
  std::optional<data::Dataset> validation_dataset;
  bool shuffle = true;
  int initial_epoch = 0;
  std::map<int64_t, double> class_weight;
  int64_t steps_per_epoch = 0;  // 0: one full pass
  int64_t validation_steps = 0;
  int validation_freq = 1;
};

struct EvaluateArgs {
  Tensors x, y;
  at::Tensor sample_weight;
  std::optional<data::Dataset> dataset;
  int64_t batch_size = 32;
  int verbose = 0;
  int64_t steps = 0;
  std::vector<CallbackPtr> callbacks;
};

// Keras's predict() options: model->predict(x, {.batch_size = 64}).
struct PredictArgs {
  int64_t batch_size = 32;  // rows per batch (tensor input; a Dataset is already batched)
  // 0 silent, 1 progress bar, 2 one line; -1 "auto": 1 on a terminal, 2 otherwise.
  int verbose = 0;
  int64_t steps = 0;  // 0: every batch of the data; else at most this many
  std::vector<CallbackPtr> callbacks;
};

// One batch as fit()/evaluate() hand it to Model::train_step/test_step:
// Keras's data = (x, y, sample_weight).
struct Batch {
  Tensors x, y;
  at::Tensor sample_weight;  // undefined: unweighted
  int64_t global_rows = -1;  // sharded: rows of the whole global batch
};

// Keras's History: per-epoch values of "loss", each metric and "val_*".
struct History {
  std::map<std::string, std::vector<double>> history;
  std::vector<int> epoch;
  Json params;  // {"verbose", "epochs", "steps"}
  // The last value of a key; NotFoundError if absent.
  double last(const std::string& key) const;
};

}  // namespace kiln
