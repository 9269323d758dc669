// Accuracy metrics (Keras's keras.metrics.*Accuracy): weighted means of
// per-sample hits, accumulated across batches.
//
//   metrics::SparseCategoricalAccuracy acc;
//   acc.update_state(labels, probs);   // labels (N,) or (N, 1); probs (N, C)
//   double a = acc.result();
#pragma once

#include "kiln/metrics/metric.h"

namespace kiln::metrics {

// Exact equality of y_true and y_pred (Keras's Accuracy class).
class Accuracy : public MeanMetricWrapper {
 public:
  explicit Accuracy(std::string name = "accuracy") : MeanMetricWrapper(std::move(name)) {}
  static std::shared_ptr<Accuracy> from_config(const Json& config);
  at::Tensor values(const at::Tensor& y_true, const at::Tensor& y_pred) const override;
  std::string class_name() const override { return "Accuracy"; }
  bool higher_is_better() const override { return true; }
};

// y_true == (y_pred > threshold), elementwise (averaged per sample).
class BinaryAccuracy : public MeanMetricWrapper {
 public:
  explicit BinaryAccuracy(std::string name = "binary_accuracy", double threshold = 0.5);
  static std::shared_ptr<BinaryAccuracy> from_config(const Json& config);
  at::Tensor values(const at::Tensor& y_true, const at::Tensor& y_pred) const override;
  std::string class_name() const override { return "BinaryAccuracy"; }
  Json get_config() const override;
  bool higher_is_better() const override { return true; }

  struct Options {  // the config's keys besides name
    double threshold = 0.5;
  };

 private:
  Options options_;
};

// argmax(y_true) == argmax(y_pred) for one-hot targets.
class CategoricalAccuracy : public MeanMetricWrapper {
 public:
  explicit CategoricalAccuracy(std::string name = "categorical_accuracy") : MeanMetricWrapper(std::move(name)) {}
  static std::shared_ptr<CategoricalAccuracy> from_config(const Json& config);
  at::Tensor values(const at::Tensor& y_true, const at::Tensor& y_pred) const override;
  std::string class_name() const override { return "CategoricalAccuracy"; }
  bool higher_is_better() const override { return true; }
};

// y_true == argmax(y_pred) for integer labels (N,) or (N, 1).
class SparseCategoricalAccuracy : public MeanMetricWrapper {
 public:
  explicit SparseCategoricalAccuracy(std::string name = "sparse_categorical_accuracy")
      : MeanMetricWrapper(std::move(name)) {}
  static std::shared_ptr<SparseCategoricalAccuracy> from_config(const Json& config);
  at::Tensor values(const at::Tensor& y_true, const at::Tensor& y_pred) const override;
  std::string class_name() const override { return "SparseCategoricalAccuracy"; }
  bool higher_is_better() const override { return true; }
};

// The config keys of the top-k accuracies besides name.
struct TopKOptions {
  int64_t k = 5;
};

// The true class's score is among the k largest (ties at the k-th score
// count as hits, as in tf.math.in_top_k). One-hot targets.
class TopKCategoricalAccuracy : public MeanMetricWrapper {
 public:
  explicit TopKCategoricalAccuracy(int64_t k = 5, std::string name = "top_k_categorical_accuracy");
  static std::shared_ptr<TopKCategoricalAccuracy> from_config(const Json& config);
  at::Tensor values(const at::Tensor& y_true, const at::Tensor& y_pred) const override;
  std::string class_name() const override { return "TopKCategoricalAccuracy"; }
  Json get_config() const override;
  bool higher_is_better() const override { return true; }
  int64_t k() const { return options_.k; }

 private:
  TopKOptions options_;
};

// As TopKCategoricalAccuracy for integer labels (N,) or (N, 1).
class SparseTopKCategoricalAccuracy : public MeanMetricWrapper {
 public:
  explicit SparseTopKCategoricalAccuracy(int64_t k = 5, std::string name = "sparse_top_k_categorical_accuracy");
  static std::shared_ptr<SparseTopKCategoricalAccuracy> from_config(const Json& config);
  at::Tensor values(const at::Tensor& y_true, const at::Tensor& y_pred) const override;
  std::string class_name() const override { return "SparseTopKCategoricalAccuracy"; }
  Json get_config() const override;
  bool higher_is_better() const override { return true; }
  int64_t k() const { return options_.k; }

 private:
  TopKOptions options_;
};

// "accuracy" without a crossentropy loss to resolve it: picks binary,
// sparse categorical or categorical accuracy from the first batch's shapes
// (Keras 3's rule: y_pred's last axis 1 -> binary; y_true of lower rank or
// with a trailing 1 -> sparse; else categorical) and keeps that choice.
class AutoAccuracy : public MeanMetricWrapper {
 public:
  explicit AutoAccuracy(std::string name = "accuracy") : MeanMetricWrapper(std::move(name)) {}
  static std::shared_ptr<AutoAccuracy> from_config(const Json& config);
  at::Tensor values(const at::Tensor& y_true, const at::Tensor& y_pred) const override;
  std::string class_name() const override { return "AutoAccuracy"; }
  bool higher_is_better() const override { return true; }
  // "binary_accuracy", "sparse_categorical_accuracy", "categorical_accuracy",
  // or "" before the first update.
  const std::string& resolved() const { return resolved_; }

 private:
  mutable std::string resolved_;
};

}  // namespace kiln::metrics
