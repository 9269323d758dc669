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
#include "kiln/layers/layer_options.h"
#include "kiln/layers/regularizers.h"

namespace kiln {

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

class ReLU : public SimpleLayer {
 public:
  explicit ReLU(const ReLUOptions& options);
  explicit ReLU(const Json& config = Json::object());
  std::string class_name() const override { return "ReLU"; }
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;

 private:
  ReLU(const ReLUOptions& options, const Json& base_config);
  static ReLUOptions options_from_config(const Json& config);
  ReLUOptions options_;  // checked: the layer's config
};

class LeakyReLU : public SimpleLayer {
 public:
  explicit LeakyReLU(const LeakyReLUOptions& options);
  explicit LeakyReLU(const Json& config = Json::object());
  explicit LeakyReLU(double negative_slope, const Json& extra = Json::object());
  std::string class_name() const override { return "LeakyReLU"; }
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;
  double negative_slope() const { return options_.negative_slope; }

 private:
  LeakyReLU(const LeakyReLUOptions& options, const Json& base_config);
  static LeakyReLUOptions options_from_config(const Json& config);
  LeakyReLUOptions options_;  // checked: the layer's config
};

class PReLU : public SimpleLayer {
 public:
  explicit PReLU(const PReLUOptions& options);
  explicit PReLU(const Json& config = Json::object());
  std::string class_name() const override { return "PReLU"; }
  void build(const std::vector<Shape>& input_shapes) override;
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;
  const VariablePtr& alpha() const { return alpha_; }

 private:
  PReLU(const PReLUOptions& options, const Json& base_config);
  static PReLUOptions options_from_config(const Json& config);
  PReLUOptions options_;              // checked: the layer's config
  std::vector<int64_t> shared_axes_;  // options_.shared_axes as a list (1-based)
  VariablePtr alpha_;
};

class Softmax : public SimpleLayer {
 public:
  explicit Softmax(const SoftmaxOptions& options);
  explicit Softmax(const Json& config = Json::object());
  std::string class_name() const override { return "Softmax"; }
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;

 private:
  Softmax(const SoftmaxOptions& options, const Json& base_config);
  static SoftmaxOptions options_from_config(const Json& config);
  SoftmaxOptions options_;     // checked: the layer's config
  std::vector<int64_t> axes_;  // options_.axis as a list
};

}  // namespace kiln
