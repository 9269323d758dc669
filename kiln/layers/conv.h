// Convolutions with Keras's layout and semantics: Conv1D and Conv2D.
//
//   auto c = std::make_shared<Conv2D>(
//       Conv2DOptions{.filters = 32, .kernel_size = {3}, .padding = "same", .activation = "relu"});
//   at::Tensor y = (*c)(at::randn({8, 28, 28, 1}));   // (8, 28, 28, 32)
//
// Inputs are channels_last by default ((N, W, C) / (N, H, W, C));
// data_format "channels_first" takes (N, C, ...). The kernel is stored as
// Keras stores it, (k..., in_channels / groups, filters), so weights move
// between kiln and Keras unchanged; the float implementation permutes it for
// LibTorch's convolution at call time.
//
// Config keys (Keras's names and defaults): filters (required), kernel_size
// (required; int or list), strides (1), padding ("valid", "same"; Conv1D also
// "causal"), data_format ("channels_last"), dilation_rate (1), groups (1),
// activation ("linear"), use_bias (true), kernel_initializer
// ("glorot_uniform"), bias_initializer ("zeros"), kernel_regularizer,
// bias_regularizer, activity_regularizer, kernel_constraint, bias_constraint
// (null only); activity penalties are recorded in training calls only. As in Keras, strides > 1 cannot be
// combined with dilation_rate > 1. "same" padding follows TensorFlow: output length ceil(n / stride), the odd
// padding element after.
#pragma once

#include "kiln/layers/activations.h"
#include "kiln/layers/kernel_impl.h"
#include "kiln/layers/layer.h"
#include "kiln/layers/layer_holder.h"
#include "kiln/layers/layer_options.h"
#include "kiln/layers/regularizers.h"

namespace kiln {

namespace layers {

// Conv1D/Conv2D options (Keras's names and defaults). A size list holds one
// value for every spatial axis or one per axis.
struct ConvOptions {
  int64_t filters = 0;               // required, > 0
  std::vector<int64_t> kernel_size;  // required
  std::vector<int64_t> strides = {1};
  std::string padding = "valid";  // "valid", "same" ("causal" for Conv1D)
  std::string data_format = "channels_last";
  std::vector<int64_t> dilation_rate = {1};
  int64_t groups = 1;  // divides filters
  std::string activation = "linear";
  bool use_bias = true;
  InitializerArg kernel_initializer = "glorot_uniform";
  InitializerArg bias_initializer = "zeros";
  RegularizerPtr kernel_regularizer, bias_regularizer, activity_regularizer;  // null: none
  LayerOptions base;
};
using Conv1DOptions = ConvOptions;
using Conv2DOptions = ConvOptions;

}  // namespace layers

struct ConvGeometry {
  std::vector<int64_t> kernel_size, strides, dilation_rate;  // one entry per spatial axis
  std::string padding = "valid";
  bool channels_last = true;
  int64_t groups = 1;
};

// The float convolution behind Conv1D/Conv2D: apply(x, kernel) with x in the
// layer's data_format and kernel (k..., in/groups, filters); returns the
// output in the same data_format, without bias.
KernelImplPtr float_conv_impl(const ConvGeometry& geometry);

namespace layers {

// Shared implementation of Conv1D and Conv2D (rank = number of spatial axes).
class Conv : public SimpleLayer {
 public:
  void build(const std::vector<Shape>& input_shapes) override;
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;

  int64_t filters() const { return options_.filters; }
  const ConvGeometry& geometry() const { return geom_; }
  const VariablePtr& kernel() const { return kernel_; }
  const VariablePtr& bias() const { return bias_; }
  const KernelImpl& kernel_impl() const { return *impl_; }

 protected:
  Conv(int rank, const std::string& owner, const ConvOptions& options, const Json& base_config);
  // The config's keys as options; ValueError for an unknown key or a bad value.
  static ConvOptions options_from_config(int rank, const std::string& owner, const Json& config);

 private:
  int rank_;
  std::string owner_;
  ConvOptions options_;  // checked: the layer's config
  ConvGeometry geom_;    // from options_
  ActivationFn activation_;
  KernelImplPtr impl_;
  VariablePtr kernel_, bias_;
};

class Conv1DImpl : public Conv {
 public:
  explicit Conv1DImpl(const ConvOptions& options);
  explicit Conv1DImpl(const Json& config);
  Conv1DImpl(int64_t filters, int64_t kernel_size, const std::string& activation = "linear",
             const Json& extra = Json::object());
  std::string class_name() const override { return "Conv1D"; }
};
KILN_LAYER_HOLDER(Conv1D, ConvOptions);

class Conv2DImpl : public Conv {
 public:
  explicit Conv2DImpl(const ConvOptions& options);
  explicit Conv2DImpl(const Json& config);
  Conv2DImpl(int64_t filters, int64_t kernel_size, const std::string& activation = "linear",
             const Json& extra = Json::object());
  Conv2DImpl(int64_t filters, const std::vector<int64_t>& kernel_size, const std::string& activation = "linear",
             const Json& extra = Json::object());
  std::string class_name() const override { return "Conv2D"; }
};
KILN_LAYER_HOLDER(Conv2D, ConvOptions);

}  // namespace layers

}  // namespace kiln

#define KILN_LEGACY_LAYERS_CONV_H
#include "kiln/layers/legacy_names.h"
