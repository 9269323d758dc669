// Preprocessing layers that live inside the model, so a served model takes
// raw inputs: Rescaling and Normalization (Keras's names and semantics).
//
// Rescaling(scale, offset=0): y = x * scale + offset, with x cast to the
//   compute dtype first (uint8 images welcome). scale/offset are numbers or
//   lists that broadcast against the trailing axes.
//
// Normalization(axis=-1, mean=null, variance=null, invert=false):
//   y = (x - mean) / max(sqrt(variance), 1e-7)   (invert: y = mean + x * sqrt(variance))
//   `axis` lists the axes that keep their own statistics (int, list, or
//   null for one scalar mean/variance). Without mean/variance in the config
//   the layer holds non-trainable weights "mean", "variance" and "count"
//   (int64), filled by adapt(data), so they save and load with the model;
//   with mean/variance given it holds constants from the config and no
//   weights, as Keras does.
//
//   auto norm = std::make_shared<Normalization>();
//   norm->adapt(x_train);          // per-feature mean 0, variance 1 after
//   auto scale = std::make_shared<Rescaling>(RescalingOptions{.scale = 1.0 / 255});
#pragma once

#include <functional>

#include "kiln/layers/layer.h"
#include "kiln/layers/layer_holder.h"
#include "kiln/layers/layer_options.h"

namespace kiln {

namespace layers {

// Numbers or (nested) lists of numbers, kept in the form given: the config
// writes them back as they came.
struct RescalingOptions {
  Json scale;  // required
  Json offset = 0.0;
  LayerOptions base;
};

struct NormalizationOptions {
  Json axis = -1;  // an int, a list of ints, or null (one statistic for everything)
  bool invert = false;
  Json mean, variance;  // null, or both given (fixed statistics instead of adapt())
  LayerOptions base;
};

class RescalingImpl : public SimpleLayer {
 public:
  explicit RescalingImpl(const RescalingOptions& options);
  explicit RescalingImpl(const Json& config);
  explicit RescalingImpl(double scale, double offset = 0.0, const Json& extra = Json::object());
  // The config's keys as options; ValueError for an unknown key or a bad value.
  static RescalingOptions options_from_config(const Json& config);

  std::string class_name() const override { return "Rescaling"; }
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;

 private:
  RescalingImpl(const RescalingOptions& options, const Json& base_config);
  RescalingOptions options_;   // checked: the layer's config
  at::Tensor scale_, offset_;  // float64 constants, cast at call time
};
KILN_LAYER_HOLDER(Rescaling, RescalingOptions);

class NormalizationImpl : public SimpleLayer {
 public:
  explicit NormalizationImpl(const NormalizationOptions& options);
  explicit NormalizationImpl(const Json& config);
  NormalizationImpl() : NormalizationImpl(Json::object()) {}
  explicit NormalizationImpl(int64_t axis, const Json& extra = Json::object());
  // Fixed statistics for `axis` (mean/variance sized like the kept axes, or
  // one value each).
  NormalizationImpl(const std::vector<double>& mean, const std::vector<double>& variance, int64_t axis = -1,
                    const Json& extra = Json::object());
  static NormalizationOptions options_from_config(const Json& config);

  std::string class_name() const override { return "Normalization"; }
  void build(const std::vector<Shape>& input_shapes) override;
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;

  // Computes mean and (biased) variance of `data` (batch first) over every
  // axis but the kept ones and stores them in the weights. Builds the layer
  // if needed. ValueError if mean/variance were given in the config, or
  // ShapeError if `data` does not match the built shape.
  void adapt(const at::Tensor& data);
  // Streaming form: calls next_batch() until it returns an undefined tensor
  // and combines per-batch statistics exactly (same result as one tensor).
  // kiln::adapt(Normalization&, const Dataset&) in kiln/data/adapt.h feeds it
  // from a Dataset, as Keras's adapt(dataset) does.
  void adapt(const std::function<at::Tensor()>& next_batch);

  // Current statistics, shaped to broadcast against the input.
  at::Tensor mean() const;
  at::Tensor variance() const;

 private:
  // The constructors' common part (no delegating constructor: one taking
  // (options, config) would make Normalization({...}, {...}) ambiguous).
  void init();
  std::vector<int64_t> kept_axes(int64_t rank) const;  // resolved, sorted
  // ShapeError unless `x` matches the built shape (`what`: "the call", "adapt()").
  void check_shape(const at::Tensor& x, const char* what) const;
  NormalizationOptions options_;              // checked: the layer's config
  std::optional<std::vector<int64_t>> axes_;  // nullopt: axis=null
  std::vector<double> given_mean_, given_variance_;
  Shape broadcast_shape_;
  at::Tensor const_mean_, const_variance_;  // when given
  VariablePtr mean_, variance_, count_;     // when adapted
};
KILN_LAYER_HOLDER(Normalization, NormalizationOptions);

}  // namespace layers

}  // namespace kiln

#define KILN_LEGACY_LAYERS_PREPROCESSING_H
#include "kiln/layers/legacy_names.h"
