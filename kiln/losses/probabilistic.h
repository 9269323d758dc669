// Keras's probabilistic losses beyond crossentropy, each reduced over the
// last axis (per-sample values, as Keras's loss functions):
//   KLDivergence:  t = clip(y_true, eps, 1), p = clip(y_pred, eps, 1);
//                  sum(t * log(t / p))
//   Poisson:       mean(y_pred - y_true * log(y_pred + eps))
//   LogCosh:       mean(log(cosh(y_pred - y_true))), computed as
//                  x + softplus(-2x) - log 2 (no overflow for large |x|)
//   CosineSimilarity: -sum(l2_normalize(y_true) * l2_normalize(y_pred)) over
//                  `axis` (-1); l2_normalize(x) = x / sqrt(max(sum(x^2), eps))
//   BinaryFocalCrossentropy (Lin et al., 2018): with targets smoothed by
//                  label_smoothing and p = sigmoid(y_pred) when from_logits,
//                  bce = binary crossentropy of clip(p, eps, 1 - eps),
//                  p_t = t p + (1 - t)(1 - p), loss = (1 - p_t)^gamma * bce,
//                  times t alpha + (1 - t)(1 - alpha) with
//                  apply_class_balancing; averaged over `axis`.
// eps is Keras's backend epsilon, 1e-7.
#pragma once

#include "kiln/losses/loss.h"

namespace kiln::losses {

class KLDivergence : public Loss {
 public:
  explicit KLDivergence(std::string reduction = "sum_over_batch_size", std::string name = "kl_divergence");
  static std::shared_ptr<KLDivergence> from_config(const Json& config);  // keys: name, reduction
  at::Tensor call(const at::Tensor& y_true, const at::Tensor& y_pred) const override;
  std::string class_name() const override { return "KLDivergence"; }
};

class Poisson : public Loss {
 public:
  explicit Poisson(std::string reduction = "sum_over_batch_size", std::string name = "poisson");
  static std::shared_ptr<Poisson> from_config(const Json& config);  // keys: name, reduction
  at::Tensor call(const at::Tensor& y_true, const at::Tensor& y_pred) const override;
  std::string class_name() const override { return "Poisson"; }
};

class LogCosh : public Loss {
 public:
  explicit LogCosh(std::string reduction = "sum_over_batch_size", std::string name = "log_cosh");
  static std::shared_ptr<LogCosh> from_config(const Json& config);  // keys: name, reduction
  at::Tensor call(const at::Tensor& y_true, const at::Tensor& y_pred) const override;
  std::string class_name() const override { return "LogCosh"; }
};

struct CosineSimilarityOptions {
  int64_t axis = -1;
  std::string reduction = "sum_over_batch_size";
  std::string name = "cosine_similarity";
};

class CosineSimilarity : public Loss {
 public:
  explicit CosineSimilarity(const CosineSimilarityOptions& options = {});
  static std::shared_ptr<CosineSimilarity> from_config(const Json& config);  // keys: axis, name, reduction
  at::Tensor call(const at::Tensor& y_true, const at::Tensor& y_pred) const override;
  std::string class_name() const override { return "CosineSimilarity"; }
  Json get_config() const override;

 private:
  CosineSimilarityOptions options_;
};

struct BinaryFocalCrossentropyOptions {
  bool apply_class_balancing = false;
  double alpha = 0.25;  // in [0, 1]
  double gamma = 2.0;   // >= 0
  bool from_logits = false;
  double label_smoothing = 0.0;  // in [0, 1]
  int64_t axis = -1;
  std::string reduction = "sum_over_batch_size";
  std::string name = "binary_focal_crossentropy";
};

class BinaryFocalCrossentropy : public Loss {
 public:
  explicit BinaryFocalCrossentropy(const BinaryFocalCrossentropyOptions& options = {});
  // Keras config keys: apply_class_balancing, alpha, gamma, from_logits,
  // label_smoothing, axis, name, reduction.
  static std::shared_ptr<BinaryFocalCrossentropy> from_config(const Json& config);
  at::Tensor call(const at::Tensor& y_true, const at::Tensor& y_pred) const override;
  std::string class_name() const override { return "BinaryFocalCrossentropy"; }
  Json get_config() const override;
  bool from_logits() const { return options_.from_logits; }

 private:
  BinaryFocalCrossentropyOptions options_;
};

}  // namespace kiln::losses
