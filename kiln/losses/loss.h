// Losses with Keras's names, defaults and reductions.
//
//   auto loss = Loss::get("sparse_categorical_crossentropy");
//   at::Tensor l = (*loss)(y_true, y_pred);            // scalar, float32
//   at::Tensor l = (*loss)(y_true, y_pred, weights);   // per-sample weights
//
// call() returns per-sample losses: the loss function reduced over the last
// axis only (shape (batch,) for (batch, features) inputs, (batch, time) for
// sequences), as Keras's loss functions do. operator() applies sample weights
// and the reduction, as Keras 3's reduce_weighted_values:
//   "sum_over_batch_size" (default) and "mean": sum of weighted values divided
//        by their number of elements (Keras 3 treats the two alike);
//   "mean_with_sample_weight": sum of weighted values / sum of the weights
//        broadcast to the values' shape (a weighted mean);
//   "sum": sum of weighted values;  "none": the weighted values.
// Inputs are cast to float32 and the result is float32 whatever the model's
// compute dtype (mixed precision keeps losses in float32).
//
// Concrete losses live in kiln::losses (crossentropy.h, regression.h,
// hinge.h, probabilistic.h).
// Thread safety: losses are immutable after construction; calls are
// thread-safe.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/core/json.h"

namespace kiln {

class Loss {
 public:
  // ValueError if `reduction` is not one of the names above.
  explicit Loss(std::string name, std::string reduction = "sum_over_batch_size");
  virtual ~Loss() = default;

  // Scalar float32 (or the weighted values for reduction "none").
  // `sample_weight` broadcasts against the per-sample losses: shape (batch,),
  // (batch, 1), a scalar, or the full shape of call()'s result.
  at::Tensor operator()(const at::Tensor& y_true, const at::Tensor& y_pred,
                        const at::Tensor& sample_weight = at::Tensor()) const;
  // Per-sample losses (see above), float32.
  virtual at::Tensor call(const at::Tensor& y_true, const at::Tensor& y_pred) const = 0;

  const std::string& name() const { return name_; }
  const std::string& reduction() const { return reduction_; }
  virtual std::string class_name() const = 0;
  virtual Json get_config() const;  // name, reduction + own keys
  Json to_json() const;             // {"class_name": ..., "config": ...}

  // Keras names: "sparse_categorical_crossentropy", "categorical_crossentropy",
  // "binary_crossentropy", "mse"/"mean_squared_error", "mae"/
  // "mean_absolute_error", "huber"/"huber_loss", "kl_divergence"/"kld",
  // "hinge", "squared_hinge", "log_cosh"/"logcosh", "poisson",
  // "cosine_similarity", "binary_focal_crossentropy", or a class name
  // ("MeanSquaredError"). ValueError lists the known names.
  static std::shared_ptr<Loss> get(const std::string& name);
  // {"class_name", "config"} (Keras's serialized form; extra keys such as
  // "module" are ignored) or a JSON string holding a name for get().
  // ValueError for an unknown class or an invalid config.
  static std::shared_ptr<Loss> from_json(const Json& j);

  // Adds a loss class to from_json's vocabulary (custom losses). Returns true
  // so it can initialise a static.
  using Factory = std::function<std::shared_ptr<Loss>(const Json& config)>;
  static bool register_class(const std::string& class_name, Factory factory);
  static std::vector<std::string> known_names();  // names get() accepts

 protected:
  // Entries that count for the reduction (Keras's mask), or undefined when
  // all do. Sparse crossentropy's ignore_class uses it.
  virtual at::Tensor valid_mask(const at::Tensor& y_true, const at::Tensor& y_pred) const { return {}; }
  // ValueError naming any key of `config` not in `allowed` (besides name,
  // reduction, dtype).
  static void check_keys(const Json& config, const std::vector<std::string>& allowed, const std::string& owner);

 private:
  std::string name_;
  std::string reduction_;
};

using LossPtr = std::shared_ptr<Loss>;

namespace losses {

// The base class under its Keras module's name: losses::Loss.
using ::kiln::Loss;
using ::kiln::LossPtr;

// Keras's squeeze_or_expand_to_same_rank: when ranks differ by one and the
// longer has a trailing 1, squeeze it (or, with expand_rank_1 and a rank-1
// other, expand the rank-1 tensor instead).
void squeeze_or_expand_to_same_rank(at::Tensor& x1, at::Tensor& x2, bool expand_rank_1 = true);

// ShapeError naming both shapes unless `a` and `b` broadcast together.
void check_broadcastable(const at::Tensor& a, const at::Tensor& b, const std::string& what);

}  // namespace losses
}  // namespace kiln
