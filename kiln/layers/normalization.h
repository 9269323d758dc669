// BatchNormalization and LayerNormalization with Keras's defaults.
//
// BatchNormalization(axis=-1, momentum=0.99, epsilon=1e-3):
//   training:  y = gamma * (x - mean_b) / sqrt(var_b + eps) + beta over the
//              batch statistics (all axes but `axis`; biased variance), and
//              moving = moving * momentum + batch * (1 - momentum).
//   inference: the same with moving_mean / moving_variance.
//   Weights, in Keras's order: gamma, beta (trainable, when scale/center),
//   moving_mean, moving_variance (never trainable). A frozen layer
//   (trainable=false) always runs in inference mode, as in Keras, so
//   fine-tuning does not disturb its statistics.
//   Keys: axis, momentum, epsilon, center, scale, beta_initializer ("zeros"),
//   gamma_initializer ("ones"), moving_mean_initializer ("zeros"),
//   moving_variance_initializer ("ones"), beta_regularizer,
//   gamma_regularizer, beta_constraint, gamma_constraint (null only),
//   synchronized: under data parallelism (kiln/distribute), training
//     statistics over every replica's batch (an all-reduce of sums, whose
//     backward all-reduces the gradients); one replica: as false.
//   Computed by LibTorch's fused batch norm (at::batch_norm: cuDNN on the
//   GPU, one statistics pass and one normalising pass on the CPU, one
//   backward kernel), with Keras's moving-statistics update applied by the
//   layer. The channel axis moves to dim 1 as a view: a channels_last
//   Conv2D/Conv3D output (rank 4/5, axis -1) is normalised in LibTorch's
//   channels_last memory format and comes back as NHWC without a copy.
//   The synchronized path, and training batches of a single row, compute
//   the statistics with separate ops.
//
// LayerNormalization(axis=-1, epsilon=1e-3): normalises each sample over
//   `axis` (an int or a list), then scales by gamma and shifts by beta (both
//   shaped like the normalised axes). rms_scaling=true divides by the root
//   mean square instead (no centring, no beta). Keys: axis, epsilon, center,
//   scale, rms_scaling, beta/gamma initializers, regularizers, constraints.
//
// Both compute their statistics in at least float32 (bfloat16/float16 inputs
// are promoted, as Keras does) and return the layer's compute dtype.
//
// Thread safety: BatchNormalization's training call writes the moving
// statistics; calls with training=false may run concurrently.
#pragma once

#include <variant>

#include "kiln/layers/layer.h"
#include "kiln/layers/layer_holder.h"
#include "kiln/layers/layer_options.h"
#include "kiln/layers/regularizers.h"

namespace kiln {

namespace layers {

struct BatchNormalizationOptions {
  int64_t axis = -1;
  double momentum = 0.99;  // in [0, 1]
  double epsilon = 1e-3;   // > 0
  bool center = true;
  bool scale = true;
  InitializerArg beta_initializer = "zeros";
  InitializerArg gamma_initializer = "ones";
  InitializerArg moving_mean_initializer = "zeros";
  InitializerArg moving_variance_initializer = "ones";
  RegularizerPtr beta_regularizer, gamma_regularizer;  // null: none
  bool synchronized = false;                           // statistics across data-parallel replicas
  LayerOptions base;
};

struct LayerNormalizationOptions {
  // One axis or several (distinct); get_config() writes it in the form given.
  std::variant<int64_t, std::vector<int64_t>> axis = int64_t{-1};
  double epsilon = 1e-3;  // > 0
  bool center = true;
  bool scale = true;
  bool rms_scaling = false;
  InitializerArg beta_initializer = "zeros";
  InitializerArg gamma_initializer = "ones";
  RegularizerPtr beta_regularizer, gamma_regularizer;  // null: none
  bool synchronized = false;                           // statistics across data-parallel replicas
  LayerOptions base;
};

class BatchNormalizationImpl : public SimpleLayer {
 public:
  explicit BatchNormalizationImpl(const BatchNormalizationOptions& options);
  explicit BatchNormalizationImpl(const Json& config);
  explicit BatchNormalizationImpl(int64_t axis = -1, double momentum = 0.99, double epsilon = 1e-3,
                                  const Json& extra = Json::object());

  std::string class_name() const override { return "BatchNormalization"; }
  void build(const std::vector<Shape>& input_shapes) override;
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;

  const VariablePtr& gamma() const { return gamma_; }
  const VariablePtr& beta() const { return beta_; }
  const VariablePtr& moving_mean() const { return moving_mean_; }
  const VariablePtr& moving_variance() const { return moving_variance_; }
  // The config's keys as options; ValueError for an unknown key or a bad value.
  static BatchNormalizationOptions options_from_config(const Json& config);

 private:
  BatchNormalizationImpl(const BatchNormalizationOptions& options, const Json& base_config);
  // LibTorch's fused batch norm (training with the batch statistics, or
  // inference with the moving ones).
  at::Tensor call_fused(const at::Tensor& x, bool update);
  // Training with the statistics written out: synchronized replicas (dist
  // non-null) and batches of fewer than two rows.
  at::Tensor call_by_formula(const at::Tensor& x, Distribution* dist);
  void update_moving_statistics(const at::Tensor& mean, const at::Tensor& var);

  BatchNormalizationOptions options_;  // checked: the layer's config
  int64_t resolved_axis_ = -1;
  VariablePtr gamma_, beta_, moving_mean_, moving_variance_;
};
KILN_LAYER_HOLDER(BatchNormalization, BatchNormalizationOptions);

class LayerNormalizationImpl : public SimpleLayer {
 public:
  explicit LayerNormalizationImpl(const LayerNormalizationOptions& options);
  explicit LayerNormalizationImpl(const Json& config);
  explicit LayerNormalizationImpl(int64_t axis = -1, double epsilon = 1e-3, const Json& extra = Json::object());

  std::string class_name() const override { return "LayerNormalization"; }
  bool supports_masking() const override { return true; }  // as Keras: masks pass through
  void build(const std::vector<Shape>& input_shapes) override;
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;

  const VariablePtr& gamma() const { return gamma_; }
  const VariablePtr& beta() const { return beta_; }
  // The config's keys as options; ValueError for an unknown key or a bad value.
  static LayerNormalizationOptions options_from_config(const Json& config);

 private:
  LayerNormalizationImpl(const LayerNormalizationOptions& options, const Json& base_config);

  LayerNormalizationOptions options_;  // checked: the layer's config
  std::vector<int64_t> axes_;          // options_.axis as a list (may be negative)
  std::vector<int64_t> resolved_;      // sorted, non-negative, set by build
  VariablePtr gamma_, beta_;
};
KILN_LAYER_HOLDER(LayerNormalization, LayerNormalizationOptions);

}  // namespace layers

}  // namespace kiln

#define KILN_LEGACY_LAYERS_NORMALIZATION_H
#include "kiln/layers/legacy_names.h"
