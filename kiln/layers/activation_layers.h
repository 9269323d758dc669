// Activation layers with their own config (Keras 3's names, keys and
// defaults): ReLU, LeakyReLU, PReLU and Softmax.
//
//   ReLU(max_value=null, negative_slope=0, threshold=0):
//     y = min(x, max_value)              for x > threshold (and x >= 0 kept)
//     y = -negative_slope * (threshold - x)  for x <= threshold
//     computed as Keras's relu: x * (x > threshold), clipped to
//     [0, max_value], minus negative_slope * relu(threshold - x). All three
//     values must be non-negative.
//   LeakyReLU(negative_slope=0.3): x for x >= 0, negative_slope * x
//     otherwise (Keras 3's default 0.3; the legacy key `alpha` is read as
//     negative_slope).
//   PReLU(alpha_initializer="zeros", alpha_regularizer=null,
//     alpha_constraint=null, shared_axes=null): a learned slope `alpha` of
//     the input's shape without the batch axis; `shared_axes` (1-based
//     axes, an int or a list) share one slope along those axes (size 1).
//   Softmax(axis=-1): exp(x) / sum(exp(x)) along `axis` (an int or a list
//     of ints).
//
//   auto act = std::make_shared<PReLU>(PReLUOptions{.shared_axes = std::vector<int64_t>{1, 2}});
//   y = (*act)(images);   // one slope per channel
#pragma once

#include <optional>
#include <variant>

#include "kiln/layers/layer.h"
#include "kiln/layers/layer_holder.h"
#include "kiln/layers/layer_options.h"
#include "kiln/layers/regularizers.h"

namespace kiln {

namespace layers {

struct ReLUOptions {
  std::optional<double> max_value;  // unset: no cap; >= 0
  double negative_slope = 0.0;      // >= 0
  double threshold = 0.0;           // >= 0
  LayerOptions base;
};

struct LeakyReLUOptions {
  double negative_slope = 0.3;  // >= 0
  LayerOptions base;
};

struct PReLUOptions {
  InitializerArg alpha_initializer = "zeros";
  RegularizerPtr alpha_regularizer;  // null: none
  // 1-based axes sharing one slope; unset: none. get_config() writes it in the form given.
  std::optional<std::variant<int64_t, std::vector<int64_t>>> shared_axes;
  LayerOptions base;
};

struct SoftmaxOptions {
  // One axis or several; get_config() writes it in the form given.
  std::variant<int64_t, std::vector<int64_t>> axis = int64_t{-1};
  LayerOptions base;
};

class ReLUImpl : public SimpleLayer {
 public:
  explicit ReLUImpl(const ReLUOptions& options);
  explicit ReLUImpl(const Json& config = Json::object());
  std::string class_name() const override { return "ReLU"; }
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;

 private:
  ReLUImpl(const ReLUOptions& options, const Json& base_config);
  static ReLUOptions options_from_config(const Json& config);
  ReLUOptions options_;  // checked: the layer's config
};
KILN_LAYER_HOLDER(ReLU, ReLUOptions);

class LeakyReLUImpl : public SimpleLayer {
 public:
  explicit LeakyReLUImpl(const LeakyReLUOptions& options);
  explicit LeakyReLUImpl(const Json& config = Json::object());
  explicit LeakyReLUImpl(double negative_slope, const Json& extra = Json::object());
  std::string class_name() const override { return "LeakyReLU"; }
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;
  double negative_slope() const { return options_.negative_slope; }

 private:
  LeakyReLUImpl(const LeakyReLUOptions& options, const Json& base_config);
  static LeakyReLUOptions options_from_config(const Json& config);
  LeakyReLUOptions options_;  // checked: the layer's config
};
KILN_LAYER_HOLDER(LeakyReLU, LeakyReLUOptions);

class PReLUImpl : public SimpleLayer {
 public:
  explicit PReLUImpl(const PReLUOptions& options);
  explicit PReLUImpl(const Json& config = Json::object());
  std::string class_name() const override { return "PReLU"; }
  void build(const std::vector<Shape>& input_shapes) override;
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;
  const VariablePtr& alpha() const { return alpha_; }

 private:
  PReLUImpl(const PReLUOptions& options, const Json& base_config);
  static PReLUOptions options_from_config(const Json& config);
  PReLUOptions options_;              // checked: the layer's config
  std::vector<int64_t> shared_axes_;  // options_.shared_axes as a list (1-based)
  VariablePtr alpha_;
};
KILN_LAYER_HOLDER(PReLU, PReLUOptions);

class SoftmaxImpl : public SimpleLayer {
 public:
  explicit SoftmaxImpl(const SoftmaxOptions& options);
  explicit SoftmaxImpl(const Json& config = Json::object());
  std::string class_name() const override { return "Softmax"; }
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;

 private:
  SoftmaxImpl(const SoftmaxOptions& options, const Json& base_config);
  static SoftmaxOptions options_from_config(const Json& config);
  SoftmaxOptions options_;     // checked: the layer's config
  std::vector<int64_t> axes_;  // options_.axis as a list
};
KILN_LAYER_HOLDER(Softmax, SoftmaxOptions);

}  // namespace layers

}  // namespace kiln

#define KILN_LEGACY_LAYERS_ACTIVATION_LAYERS_H
#include "kiln/layers/legacy_names.h"
