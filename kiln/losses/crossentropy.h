// Crossentropy losses (Keras's keras.losses.*Crossentropy).
//
// Probabilities (from_logits=false, Keras's default) are clipped to
// [1e-7, 1 - 1e-7] before the log, as Keras does; categorical outputs are
// first renormalised to sum to one along `axis`. With from_logits=true the
// numerically stable log-softmax / log-sigmoid forms are used.
//
//   losses::SparseCategoricalCrossentropy ce({.from_logits = true});
//   at::Tensor l = ce(labels, logits);   // labels int (N,) or (N, 1)
#pragma once

#include <optional>

#include "kiln/losses/loss.h"

namespace kiln::losses {

// Integer labels (any integer or float dtype holding integers), shape (N,)
// or (N, 1) (generally y_pred's shape without its last axis, optionally with
// a trailing 1). Labels outside [0, num_classes) raise ValueError, except
// `ignore_class`, whose entries contribute zero and do not count for the
// "sum_over_batch_size" divisor (Keras's masking).
struct SparseCategoricalCrossentropyOptions {
  bool from_logits = false;
  std::optional<int64_t> ignore_class;  // labels equal to it do not count
  std::string reduction = "sum_over_batch_size";
  std::string name = "sparse_categorical_crossentropy";
};

class SparseCategoricalCrossentropy : public Loss {
 public:
  explicit SparseCategoricalCrossentropy(const SparseCategoricalCrossentropyOptions& options = {});
  // Keras config keys: from_logits, ignore_class, name, reduction.
  static std::shared_ptr<SparseCategoricalCrossentropy> from_config(const Json& config);

  at::Tensor call(const at::Tensor& y_true, const at::Tensor& y_pred) const override;
  std::string class_name() const override { return "SparseCategoricalCrossentropy"; }
  Json get_config() const override;
  bool from_logits() const { return options_.from_logits; }

 protected:
  at::Tensor valid_mask(const at::Tensor& y_true, const at::Tensor& y_pred) const override;

 private:
  SparseCategoricalCrossentropyOptions options_;
};

// One-hot (or soft) targets with y_pred's shape. label_smoothing in [0, 1]
// replaces targets by t * (1 - s) + s / num_classes.
struct CategoricalCrossentropyOptions {
  bool from_logits = false;
  double label_smoothing = 0.0;  // in [0, 1]
  int64_t axis = -1;
  std::string reduction = "sum_over_batch_size";
  std::string name = "categorical_crossentropy";
};

class CategoricalCrossentropy : public Loss {
 public:
  explicit CategoricalCrossentropy(const CategoricalCrossentropyOptions& options = {});
  // Keras config keys: from_logits, label_smoothing, axis, name, reduction.
  static std::shared_ptr<CategoricalCrossentropy> from_config(const Json& config);

  at::Tensor call(const at::Tensor& y_true, const at::Tensor& y_pred) const override;
  std::string class_name() const override { return "CategoricalCrossentropy"; }
  Json get_config() const override;
  bool from_logits() const { return options_.from_logits; }

 private:
  CategoricalCrossentropyOptions options_;
};

// Targets in [0, 1] with y_pred's shape ((N,) and (N, 1) are reconciled);
// the elementwise losses are averaged over `axis`. label_smoothing replaces
// targets by t * (1 - s) + 0.5 * s.
struct BinaryCrossentropyOptions {
  bool from_logits = false;
  double label_smoothing = 0.0;  // in [0, 1]
  int64_t axis = -1;
  std::string reduction = "sum_over_batch_size";
  std::string name = "binary_crossentropy";
};

class BinaryCrossentropy : public Loss {
 public:
  explicit BinaryCrossentropy(const BinaryCrossentropyOptions& options = {});
  // Keras config keys: from_logits, label_smoothing, axis, name, reduction.
  static std::shared_ptr<BinaryCrossentropy> from_config(const Json& config);

  at::Tensor call(const at::Tensor& y_true, const at::Tensor& y_pred) const override;
  std::string class_name() const override { return "BinaryCrossentropy"; }
  Json get_config() const override;
  bool from_logits() const { return options_.from_logits; }

 private:
  BinaryCrossentropyOptions options_;
};

}  // namespace kiln::losses
