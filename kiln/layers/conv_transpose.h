// Convolutions beyond Conv1D/Conv2D, with Keras 3's layouts, keys and
// defaults: Conv2DTranspose, DepthwiseConv2D and SeparableConv2D.
// Inputs are channels_last ((N, H, W, C)) unless data_format is
// "channels_first". Kernels are stored as Keras stores them, so weights move
// between kiln and Keras unchanged:
//   Conv2DTranspose  kernel            (kh, kw, filters, in_channels)
//   DepthwiseConv2D  depthwise_kernel  (kh, kw, in_channels, depth_multiplier)
//   SeparableConv2D  depthwise_kernel  (kh, kw, in_channels, depth_multiplier)
//                    pointwise_kernel  (1, 1, in_channels * depth_multiplier, filters)
// plus `bias` when use_bias (the default).
//
// Conv2DTranspose(filters, kernel_size, strides=1, padding="valid",
//   output_padding=null, data_format, dilation_rate=1, activation, use_bias,
//   kernel_initializer="glorot_uniform", bias_initializer="zeros",
//   *_regularizer, *_constraint (null only)). Output length per axis (Keras's
//   deconv_output_length, k the dilated kernel size):
//     output_padding null: valid n*s + max(k - s, 0); same n*s
//     otherwise: (n - 1)*s + k - 2*pad + output_padding, pad = k//2 for same
//   The result is TensorFlow's conv2d_transpose, i.e. the exact adjoint of
//   Conv2D with the same padding (TensorFlow's "same": the odd padding
//   element after). PyTorch's conv_transpose2d(padding, output_padding)
//   crops from the start instead, so for odd "same" paddings (e.g. k=3,
//   s=2) Keras's own torch backend is shifted by one pixel from this and
//   from Keras on TensorFlow/JAX; kiln follows TensorFlow and its Conv2D.
//
// DepthwiseConv2D(kernel_size, strides=1, padding="valid",
//   depth_multiplier=1, data_format, dilation_rate=1, activation, use_bias,
//   depthwise_initializer="glorot_uniform", bias_initializer="zeros",
//   depthwise_regularizer, bias_regularizer, activity_regularizer, ...):
//   each input channel c convolved with its own depth_multiplier filters;
//   output channel c * depth_multiplier + m (TensorFlow's order).
// SeparableConv2D(filters, kernel_size, ..., depth_multiplier=1,
//   pointwise_initializer="glorot_uniform", pointwise_regularizer, ...):
//   the depthwise convolution (with strides, padding and dilation) followed
//   by a 1x1 convolution to `filters` channels.
// As in Keras, strides > 1 cannot be combined with dilation_rate > 1.
//
//   auto up = std::make_shared<Conv2DTranspose>(Json{{"filters", 8}, {"kernel_size", 3},
//                                                   {"strides", 2}, {"padding", "same"}});
//   y = (*up)(at::randn({1, 7, 7, 16}));   // (1, 14, 14, 8)
#pragma once

#include "kiln/layers/activations.h"
#include "kiln/layers/conv.h"
#include "kiln/layers/kernel_impl.h"
#include "kiln/layers/layer.h"
#include "kiln/layers/layer_holder.h"
#include "kiln/layers/layer_options.h"
#include "kiln/layers/regularizers.h"

namespace kiln {

namespace layers {

// A size list holds one value for both spatial axes or one per axis.
struct Conv2DTransposeOptions {
  int64_t filters = 0;               // required, > 0
  std::vector<int64_t> kernel_size;  // required
  std::vector<int64_t> strides = {1};
  std::string padding = "valid";  // "valid" or "same"
  // Unset: inferred; each value >= 0 and < its stride.
  std::optional<std::vector<int64_t>> output_padding;
  std::string data_format = "channels_last";
  std::vector<int64_t> dilation_rate = {1};
  std::string activation = "linear";
  bool use_bias = true;
  InitializerArg kernel_initializer = "glorot_uniform";
  InitializerArg bias_initializer = "zeros";
  RegularizerPtr kernel_regularizer, bias_regularizer, activity_regularizer;  // null: none
  LayerOptions base;
};

// DepthwiseConv2D and SeparableConv2D options; filters and the pointwise_*
// options are SeparableConv2D's only.
struct DepthwiseConv2DOptions {
  int64_t filters = 0;               // SeparableConv2D: required, > 0
  std::vector<int64_t> kernel_size;  // required
  std::vector<int64_t> strides = {1};
  std::string padding = "valid";  // "valid" or "same"
  std::string data_format = "channels_last";
  std::vector<int64_t> dilation_rate = {1};
  int64_t depth_multiplier = 1;
  std::string activation = "linear";
  bool use_bias = true;
  InitializerArg depthwise_initializer = "glorot_uniform";
  InitializerArg pointwise_initializer = "glorot_uniform";
  InitializerArg bias_initializer = "zeros";
  RegularizerPtr depthwise_regularizer, pointwise_regularizer, bias_regularizer,
      activity_regularizer;  // null: none
  LayerOptions base;
};
using SeparableConv2DOptions = DepthwiseConv2DOptions;

class Conv2DTransposeImpl : public SimpleLayer {
 public:
  explicit Conv2DTransposeImpl(const Conv2DTransposeOptions& options);
  explicit Conv2DTransposeImpl(const Json& config);
  // The config's keys as options; ValueError for an unknown key or a bad value.
  static Conv2DTransposeOptions options_from_config(const Json& config);
  std::string class_name() const override { return "Conv2DTranspose"; }
  void build(const std::vector<Shape>& input_shapes) override;
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;
  const VariablePtr& kernel() const { return kernel_; }
  const VariablePtr& bias() const { return bias_; }

 private:
  Conv2DTransposeImpl(const Conv2DTransposeOptions& options, const Json& base_config);
  // Output length along spatial axis i for an input length n (-1 stays -1).
  int64_t output_length(int i, int64_t n) const;
  Conv2DTransposeOptions options_;  // checked: the layer's config
  ConvGeometry geom_;               // from options_
  ActivationFn activation_;
  VariablePtr kernel_, bias_;
};
KILN_LAYER_HOLDER(Conv2DTranspose, Conv2DTransposeOptions);

// DepthwiseConv2D and, with a pointwise step, SeparableConv2D.
class DepthwiseConv2DImpl : public SimpleLayer {
 public:
  explicit DepthwiseConv2DImpl(const DepthwiseConv2DOptions& options);
  explicit DepthwiseConv2DImpl(const Json& config);
  std::string class_name() const override { return "DepthwiseConv2D"; }
  void build(const std::vector<Shape>& input_shapes) override;
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;
  const VariablePtr& depthwise_kernel() const { return depthwise_; }
  const VariablePtr& pointwise_kernel() const { return pointwise_; }
  const VariablePtr& bias() const { return bias_; }

 protected:
  DepthwiseConv2DImpl(const DepthwiseConv2DOptions& options, const Json& base_config, bool separable);
  // The config's keys as options; ValueError for an unknown key or a bad value.
  static DepthwiseConv2DOptions options_from_config(const Json& config, bool separable);

 private:
  bool separable_;
  std::string owner_;
  DepthwiseConv2DOptions options_;  // checked: the layer's config
  ConvGeometry geom_;               // the depthwise step, from options_ (groups set by build)
  ActivationFn activation_;
  KernelImplPtr depthwise_impl_, pointwise_impl_;
  int64_t in_channels_ = 0;
  VariablePtr depthwise_, pointwise_, bias_;
};
KILN_LAYER_HOLDER(DepthwiseConv2D, DepthwiseConv2DOptions);

class SeparableConv2DImpl : public DepthwiseConv2DImpl {
 public:
  explicit SeparableConv2DImpl(const SeparableConv2DOptions& options);
  explicit SeparableConv2DImpl(const Json& config);
  std::string class_name() const override { return "SeparableConv2D"; }
};
KILN_LAYER_HOLDER(SeparableConv2D, SeparableConv2DOptions);

}  // namespace layers

}  // namespace kiln

#define KILN_LEGACY_LAYERS_CONV_TRANSPOSE_H
#include "kiln/layers/legacy_names.h"
