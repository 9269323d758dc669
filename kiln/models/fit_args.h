// Arguments and results of Model::compile/fit/evaluate/predict, with
// Keras's names and defaults.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/core/json.h"
#include "kiln/data/dataset.h"
#include "kiln/losses/loss.h"
#include "kiln/metrics/metric.h"
#include "kiln/optimizers/optimizer.h"

namespace kiln {

class Callback;  // kiln/training/callbacks.h
using CallbackPtr = std::shared_ptr<Callback>;
using Tensors = std::vector<at::Tensor>;

struct CompileArgs {
  OptimizerPtr optimizer;  // required
  LossPtr loss;            // required for fit/evaluate
  // Metrics. With several outputs, a flat list applies to every output
  // (each gets its own copy, named "<output>_<metric>", as Keras does);
  // output_metrics (Keras's nested list, one list per output, in output
  // order) picks them per output instead. Use one or the other.
  std::vector<MetricPtr> metrics;
  std::vector<std::vector<MetricPtr>> output_metrics;
  // Keras names: compile("adam", "sparse_categorical_crossentropy", {"accuracy"}).
  static CompileArgs from_names(const std::string& optimizer, const std::string& loss,
                                const std::vector<std::string>& metrics = {});
  // {"optimizer": name|{class_name,config}, "loss": ..., "metrics": [...]}
  // ("metrics": [[...], [...]] is the per-output form).
  static CompileArgs from_json(const Json& j);
  Json to_json() const;
};

// fit() input: tensors (x, y) or a Dataset whose elements are
// (inputs..., targets..., [sample_weight]) batches.
struct FitArgs {
  Tensors x;                       // one tensor per model input
  Tensors y;                       // one tensor per model output
  at::Tensor sample_weight;        // optional, shape (N,)
  std::optional<Dataset> dataset;  // instead of x/y (already batched)
  int64_t batch_size = 32;
  int epochs = 1;
  // 0 silent, 1 progress bar, 2 one line per epoch; -1 "auto": 1 on a
  // terminal, 2 otherwise.
  int verbose = -1;
  std::vector<CallbackPtr> callbacks;
  double validation_split = 0.0;  // last fraction of x/y, before shuffling
  Tensors validation_x, validation_y;
  std::optional<Dataset> validation_dataset;
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
  std::optional<Dataset> dataset;
  int64_t batch_size = 32;
  int verbose = 0;
  int64_t steps = 0;
  std::vector<CallbackPtr> callbacks;
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
