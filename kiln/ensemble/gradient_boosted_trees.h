// Gradient-boosted trees through XGBoost's C API (Debian libxgboost-dev), as
// an ensemble member: trees are diverse from networks, which is what makes
// ensembles work. Inputs are flattened to (N, features) float32; the model
// predicts class probabilities (multi:softprob) for classification.
//
//   GradientBoostedTrees gbt({.num_class = 10, .max_depth = 6, .rounds = 100});
//   gbt.fit(x_train, y_train, x_val, y_val);     // early stopping on val when asked
//   at::Tensor p = gbt.predict_proba(x_test);    // (N, 10)
//   gbt.save_to(dir);  auto again = GradientBoostedTrees::load(dir);
//
// Saved as a model directory: model.json (class_name "GradientBoostedTrees",
// its options, signatures) and xgboost.json (XGBoost's own JSON format).
// Thread safety: predict from one thread at a time.
#pragma once

#include "kiln/ensemble/predictor.h"

namespace kiln::ensemble {

struct GradientBoostedTreesOptions {
  int num_class = 2;
  int max_depth = 6;
  double eta = 0.3;  // learning rate
  int rounds = 100;
  double subsample = 1.0;
  double colsample_bytree = 1.0;
  int nthread = 0;                // 0: kiln's intra-op thread count
  int early_stopping_rounds = 0;  // > 0: stop when validation mlogloss stalls (needs validation data)
  uint64_t seed = 0;
  Json to_json() const;
  static GradientBoostedTreesOptions from_json(const Json& j);
};

class GradientBoostedTrees : public Predictor {
 public:
  explicit GradientBoostedTrees(GradientBoostedTreesOptions options = {});
  ~GradientBoostedTrees() override;
  GradientBoostedTrees(const GradientBoostedTrees&) = delete;
  GradientBoostedTrees& operator=(const GradientBoostedTrees&) = delete;

  // x: (N, ...) any numeric dtype; y: (N,) integer class ids in [0, num_class).
  void fit(const at::Tensor& x, const at::Tensor& y, const at::Tensor& x_val = {}, const at::Tensor& y_val = {});
  at::Tensor predict_proba(const at::Tensor& x);
  int best_iteration() const { return best_iteration_; }

  Tensors predict(const Tensors& x, int64_t batch_size = 256) override;
  Json signatures() override;
  std::string kind() const override { return "xgboost"; }
  void save_to(const std::string& dir) override;
  static std::shared_ptr<GradientBoostedTrees> load(const std::string& dir);

 private:
  GradientBoostedTreesOptions o_;
  void* booster_ = nullptr;  // BoosterHandle
  int64_t features_ = 0;
  Shape input_shape_;  // without the batch dim
  int best_iteration_ = -1;
};

}  // namespace kiln::ensemble
