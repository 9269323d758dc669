// Metrics over confusion-matrix counts (Keras's Precision, Recall, AUC).
// Counts are weighted sums kept in float64 (variables()).
//
// Labels: any non-zero y_true is positive (Keras casts labels to bool).
// Sample weights of shape (N,) or (N, 1) apply to every entry of a sample.
#pragma once

#include <optional>
#include <vector>

#include "kiln/metrics/metric.h"

namespace kiln::metrics {

// Precision's and Recall's config keys besides name (top_k: only null).
struct ThresholdOptions {
  double threshold = 0.5;  // Keras's `thresholds`: one, in [0, 1]
  std::optional<int64_t> class_id;
};

// tp / (tp + fp) with predictions > threshold counted as positive; 0 when
// nothing was predicted positive. class_id restricts to one column of y_pred.
class Precision : public Metric {
 public:
  explicit Precision(double threshold = 0.5, std::optional<int64_t> class_id = std::nullopt,
                     std::string name = "precision");
  // Keras keys: thresholds (a number or a one-element list), class_id,
  // top_k (only null), name.
  static std::shared_ptr<Precision> from_config(const Json& config);
  void update_state(const at::Tensor& y_true, const at::Tensor& y_pred,
                    const at::Tensor& sample_weight = at::Tensor()) override;
  double result() const override;
  void reset_state() override;
  std::vector<at::Tensor> variables() const override { return {true_positives_, false_positives_}; }
  std::string class_name() const override { return "Precision"; }
  Json get_config() const override;
  bool higher_is_better() const override { return true; }

 private:
  ThresholdOptions options_;
  at::Tensor true_positives_, false_positives_;
};

// tp / (tp + fn); otherwise as Precision.
class Recall : public Metric {
 public:
  explicit Recall(double threshold = 0.5, std::optional<int64_t> class_id = std::nullopt, std::string name = "recall");
  static std::shared_ptr<Recall> from_config(const Json& config);
  void update_state(const at::Tensor& y_true, const at::Tensor& y_pred,
                    const at::Tensor& sample_weight = at::Tensor()) override;
  double result() const override;
  void reset_state() override;
  std::vector<at::Tensor> variables() const override { return {true_positives_, false_negatives_}; }
  std::string class_name() const override { return "Recall"; }
  Json get_config() const override;
  bool higher_is_better() const override { return true; }

 private:
  ThresholdOptions options_;
  at::Tensor true_positives_, false_negatives_;
};

// Area under the ROC or PR curve, approximated as Keras does: confusion
// counts at `num_thresholds` thresholds (-1e-7, 1/(n-1), ..., (n-2)/(n-1),
// 1+1e-7; a prediction is positive when strictly above a threshold), then a
// Riemann sum. summation_method "interpolation" (default) uses trapezoids
// for ROC and Davis & Goadrich's interpolation for PR; "minoring" and
// "majoring" take the lower / upper rectangle. Predictions are clipped to
// [0, 1] (after a sigmoid when from_logits). All entries of y_pred are
// pooled (multi_label=false). `thresholds`, when given, replace the evenly
// spaced ones (values in [0, 1]; the end points are added).
class AUC : public Metric {
 public:
  struct Options {
    int64_t num_thresholds = 200;
    std::string curve = "ROC";                       // "ROC" | "PR"
    std::string summation_method = "interpolation";  // | "minoring" | "majoring"
    std::vector<double> thresholds;                  // empty: evenly spaced
    bool from_logits = false;
    std::string name = "auc";
  };
  AUC() : AUC(Options()) {}
  explicit AUC(Options options);
  // Keras keys: num_thresholds, curve, summation_method, thresholds,
  // multi_label (only false), num_labels, label_weights (only null),
  // from_logits, name.
  static std::shared_ptr<AUC> from_config(const Json& config);
  void update_state(const at::Tensor& y_true, const at::Tensor& y_pred,
                    const at::Tensor& sample_weight = at::Tensor()) override;
  double result() const override;
  void reset_state() override;
  // true_positives, false_positives, true_negatives, false_negatives, each of
  // shape (num_thresholds,).
  std::vector<at::Tensor> variables() const override { return {tp_, fp_, tn_, fn_}; }
  std::string class_name() const override { return "AUC"; }
  Json get_config() const override;
  bool higher_is_better() const override { return true; }
  const std::vector<double>& thresholds() const { return thresholds_; }  // with end points

 private:
  double interpolate_pr_auc() const;

  Options options_;
  bool evenly_;                     // thresholds spaced evenly: bucketed update
  std::vector<double> thresholds_;  // num_thresholds values
  at::Tensor tp_, fp_, tn_, fn_;
};

}  // namespace kiln::metrics
