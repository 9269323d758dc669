// Ensembles of classifiers: averaging, weights learned on validation data,
// and greedy ensemble selection, over any Predictors (kiln models,
// gradient-boosted trees, other ensembles).
//
//   Ensemble ens;
//   ens.add("mlp_a", std::make_shared<ModelPredictor>(a));
//   ens.add("trees", gbt);
//   ens.fit_weights(x_val, y_val);                 // Nelder-Mead (NLopt) on validation log loss
//   // or ens.select_greedy(x_val, y_val, 50);     // Caruana et al. 2004, with replacement
//   at::Tensor p = ens.predict_proba(x_test);
//   std::cout << ens.report({x_val, y_val}, {x_test, y_test});
//   ens.save("models/ensemble/1");  auto again = load_predictor("models/ensemble/1");
//
// Members output class probabilities; a member whose outputs are not
// probabilities (logits) is passed through a softmax: detected on the
// validation data when weights are fitted (any negative value or rows not
// summing to 1 within the rounding of the output's dtype: 1e-3 for
// float32, 3e-2 for bfloat16), or set explicitly with add(..., apply_softmax).
//
// Weighted averaging minimizes the validation log loss over weights on the
// simplex (w = softmax(theta), NLopt's Nelder-Mead): log loss is smooth in
// the weights and rewards calibrated mixtures, where accuracy is piecewise
// constant and gives a derivative-free search nothing to follow.
//
// Saved as one model directory: model.json (class_name "Ensemble",
// members with kinds and weights, signatures) and members/<i>/ (each a
// model directory of its own); predicts like a model after load_predictor.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "kiln/ensemble/predictor.h"

namespace kiln::ensemble {

struct Member {
  std::string name;
  PredictorPtr predictor;
  std::optional<bool> apply_softmax;  // nullopt: detect from validation outputs
};

struct MemberScores {
  std::string name;
  double weight = 0;
  double val_accuracy = 0, val_log_loss = 0;
  double test_accuracy = 0, test_log_loss = 0;
};

class Ensemble : public Predictor {
 public:
  void add(const std::string& name, PredictorPtr p, std::optional<bool> apply_softmax = std::nullopt);
  const std::vector<Member>& members() const { return members_; }
  const std::vector<double>& weights() const { return weights_; }
  // Explicit weights (normalized to sum 1; ValueError if negative or all 0).
  void set_weights(const std::vector<double>& w);

  // Equal weights.
  void average();
  // Nelder-Mead on validation log loss; returns the loss reached.
  double fit_weights(const at::Tensor& x_val, const at::Tensor& y_val, int max_evals = 2000);
  // Caruana's greedy selection with replacement, starting from the best
  // single member, `rounds` additions, each the member that most lowers the
  // validation log loss of the running average (ties: fewer members).
  // Weights = selection counts / total. Returns the loss reached.
  double select_greedy(const at::Tensor& x_val, const at::Tensor& y_val, int rounds = 50);

  at::Tensor predict_proba(const at::Tensor& x, int64_t batch_size = 256);
  Tensors predict(const Tensors& x, int64_t batch_size = 256) override;
  Json signatures() override;
  std::string kind() const override { return "ensemble"; }
  void save_to(const std::string& dir) override;
  void save(const std::string& dir) { save_to(dir); }
  static std::shared_ptr<Ensemble> load(const std::string& dir);

  // Each member's and the ensemble's accuracy and log loss on validation and
  // test data; the last row is the ensemble ("ensemble").
  std::vector<MemberScores> evaluate(const at::Tensor& x_val, const at::Tensor& y_val, const at::Tensor& x_test,
                                     const at::Tensor& y_test, int64_t batch_size = 256);
  static std::string format_report(const std::vector<MemberScores>& rows);

  // Log loss and accuracy of probabilities `p` (N, C) for labels y (N,).
  static double log_loss(const at::Tensor& p, const at::Tensor& y);
  static double accuracy(const at::Tensor& p, const at::Tensor& y);

 private:
  // Member i's probabilities for x (softmax applied when needed).
  at::Tensor member_proba(size_t i, const at::Tensor& x, int64_t batch_size);
  std::vector<at::Tensor> member_probas(const at::Tensor& x, int64_t batch_size);
  // `dtypes`: each member's output dtype before widening (its rounding sets
  // how close to 1 a row of probabilities sums).
  void detect_softmax(const std::vector<at::Tensor>& raw, const std::vector<at::ScalarType>& dtypes);

  std::vector<Member> members_;
  std::vector<double> weights_;
};

}  // namespace kiln::ensemble
