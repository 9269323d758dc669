// Keras 3's FBetaScore and F1Score (F1Score is FBetaScore with beta 1).
// Inputs are (batch, classes): y_true one-hot or multi-label 0/1, y_pred
// scores. A prediction counts as positive where y_pred > threshold, or,
// with threshold null, where it equals the row's maximum (and is not 0).
// Per class (summed over classes first for average "micro"), weighted by
// sample_weight (shape (batch,)), it accumulates tp, fp, fn and the
// weighted count of true labels; result():
//   precision = tp / (tp + fp + eps), recall = tp / (tp + fn + eps)
//   f = (1 + beta^2) * precision * recall / (beta^2 * precision + recall + eps)
// then average: "micro" (one pooled score), "macro" (mean over classes),
// "weighted" (mean weighted by each class's true-label count), or null (per
// class). eps = 1e-7.
//
// With average null Keras's result() is the per-class vector:
// result_per_class() returns it; result(), the scalar training logs hold,
// is its unweighted mean. State is created on the first update (its size is
// the number of classes); variables() is empty until then.
#pragma once

#include <optional>

#include "kiln/metrics/metric.h"

namespace kiln::metrics {

// FBetaScore's and F1Score's config keys besides name (F1Score's beta is 1).
struct FBetaScoreOptions {
  std::optional<std::string> average;  // null, "micro", "macro" or "weighted"
  double beta = 1.0;                   // > 0
  std::optional<double> threshold;     // in (0, 1] or null
};

class FBetaScore : public Metric {
 public:
  // average: null, "micro", "macro" or "weighted"; beta > 0; threshold in
  // (0, 1] or null. ValueError names a bad value.
  explicit FBetaScore(std::optional<std::string> average = std::nullopt, double beta = 1.0,
                      std::optional<double> threshold = std::nullopt, std::string name = "fbeta_score");
  static std::shared_ptr<FBetaScore> from_config(const Json& config);  // average, beta, threshold, name

  void update_state(const at::Tensor& y_true, const at::Tensor& y_pred,
                    const at::Tensor& sample_weight = at::Tensor()) override;
  double result() const override;
  at::Tensor result_per_class() const;  // float64; (classes,) for average null, else a scalar
  void reset_state() override;
  std::vector<at::Tensor> variables() const override;
  std::string class_name() const override { return "FBetaScore"; }
  Json get_config() const override;
  bool higher_is_better() const override { return true; }

 protected:
  FBetaScoreOptions options_;

 private:
  at::Tensor tp_, fp_, fn_, weights_;  // float64 CPU; undefined until the first update
};

class F1Score : public FBetaScore {
 public:
  explicit F1Score(std::optional<std::string> average = std::nullopt, std::optional<double> threshold = std::nullopt,
                   std::string name = "f1_score");
  static std::shared_ptr<F1Score> from_config(const Json& config);  // average, threshold, name
  std::string class_name() const override { return "F1Score"; }
  Json get_config() const override;  // without beta, as Keras
};

}  // namespace kiln::metrics
