// Stateful metrics, as in Keras: update_state() accumulates over batches,
// result() reads, reset_state() clears (the trainer resets at each epoch).
//
//   auto acc = Metric::get("accuracy", loss.get());   // resolves to
//   acc->update_state(y_true, y_pred);                // sparse_categorical_accuracy
//   double a = acc->result();                         // for a sparse CE loss
//
// State lives in float64 tensors returned by variables(), so a distributed
// trainer can sum them across replicas (in place) before result(). They
// start on the host and follow the values of the first batch to their
// device: on a GPU a step adds to them there, without a host round trip,
// and result() reads them (once per progress update). Concrete metrics live in kiln::metrics (accuracy_metrics.h,
// confusion_metrics.h, regression_metrics.h, f_score.h, iou_metrics.h).
//
// Thread safety: not thread-safe; one training loop owns each metric.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/json.h"

namespace kiln {

class Loss;

class Metric {
 public:
  explicit Metric(std::string name) : name_(std::move(name)) {}
  virtual ~Metric() = default;

  virtual void update_state(const at::Tensor& y_true, const at::Tensor& y_pred,
                            const at::Tensor& sample_weight = at::Tensor()) = 0;
  virtual double result() const = 0;
  virtual void reset_state() = 0;
  // The accumulators (float64), for cross-replica reduction and checkpoints.
  virtual std::vector<at::Tensor> variables() const = 0;

  const std::string& name() const { return name_; }
  void set_name(const std::string& n) { name_ = n; }
  virtual std::string class_name() const = 0;
  virtual Json get_config() const { return Json{{"name", name_}}; }
  Json to_json() const { return Json{{"class_name", class_name()}, {"config", get_config()}}; }
  // Higher is better (accuracy, AUC) or lower (mae, loss): used by callbacks
  // and tuners to infer a direction.
  virtual bool higher_is_better() const { return false; }

  // Keras names: "accuracy"/"acc" (resolved against `loss` as Keras does:
  // sparse CE -> sparse_categorical_accuracy, CE -> categorical_accuracy,
  // BCE -> binary_accuracy; any other or no loss: decided from the shapes of
  // the first batch, as Keras 3 does), "binary_accuracy",
  // "categorical_accuracy", "sparse_categorical_accuracy",
  // "top_k_categorical_accuracy", "sparse_top_k_categorical_accuracy", "auc",
  // "precision", "recall", "mae"/"mean_absolute_error",
  // "mse"/"mean_squared_error", "root_mean_squared_error", "r2_score",
  // "f1_score", "fbeta_score", "mean_iou" (needs num_classes: use
  // from_json with a config), or a class name ("AUC"). The metric is named
  // as the string given (Keras 3), so "accuracy" logs as `accuracy` and
  // `val_accuracy`. ValueError lists the known names.
  static std::shared_ptr<Metric> get(const std::string& name, const Loss* loss = nullptr);
  // A name (as get()) or {"class_name", "config"}.
  static std::shared_ptr<Metric> from_json(const Json& j, const Loss* loss = nullptr);

  // Adds a metric class to from_json's vocabulary (custom metrics).
  using Factory = std::function<std::shared_ptr<Metric>(const Json& config)>;
  static bool register_class(const std::string& class_name, Factory factory);
  static std::vector<std::string> known_names();

 protected:
  // ValueError naming any key of `config` not in `allowed` (besides name and
  // dtype).
  static void check_keys(const Json& config, const std::vector<std::string>& allowed, const std::string& owner);
  // Moves each defined accumulator to `device` (where a batch's values are).
  static void follow_device(const at::Device& device, std::initializer_list<at::Tensor*> accumulators) {
    for (at::Tensor* t : accumulators)
      if (t->defined() && t->device() != device) *t = t->to(device);
  }

 private:
  std::string name_;
};

using MetricPtr = std::shared_ptr<Metric>;

// The running mean (weighted) of values: the trainer tracks "loss" with it.
// update_state(values, {}, weights) follows Keras's Mean: values are first
// averaged down to the weights' rank, then sum(values * w) / sum(w);
// without weights every sample (first axis) counts once.
class Mean : public Metric {
 public:
  explicit Mean(std::string name = "mean");
  void update_state(const at::Tensor& values, const at::Tensor& unused = at::Tensor(),
                    const at::Tensor& sample_weight = at::Tensor()) override;
  void update(double value, double weight = 1.0);
  // The same with a one-element tensor, added where it is: a GPU's loss
  // joins the running mean without a host read (the same bits as
  // update(value.item<double>(), weight)).
  void update(const at::Tensor& value, double weight = 1.0);
  double result() const override;
  void reset_state() override;
  std::vector<at::Tensor> variables() const override { return {total_, count_}; }
  std::string class_name() const override { return "Mean"; }

 private:
  at::Tensor total_, count_;
};

// Keras's MeanMetricWrapper: a Mean over per-sample values computed from
// (y_true, y_pred). Subclasses implement values().
class MeanMetricWrapper : public Mean {
 public:
  explicit MeanMetricWrapper(std::string name) : Mean(std::move(name)) {}
  void update_state(const at::Tensor& y_true, const at::Tensor& y_pred,
                    const at::Tensor& sample_weight = at::Tensor()) override;
  // Per-sample (or per-entry) values, e.g. 1/0 for hits and misses.
  virtual at::Tensor values(const at::Tensor& y_true, const at::Tensor& y_pred) const = 0;
};

// The base classes under their Keras module's name: metrics::Metric,
// metrics::Mean (keras.metrics.Mean).
namespace metrics {
using ::kiln::Mean;
using ::kiln::MeanMetricWrapper;
using ::kiln::Metric;
using ::kiln::MetricPtr;
}  // namespace metrics

}  // namespace kiln
