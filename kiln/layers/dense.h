// Dense: y = activation(x @ kernel + bias) on the last axis (Keras's Dense).
//
//   auto d = std::make_shared<Dense>(DenseOptions{.units = 64, .activation = "relu"});
//   at::Tensor y = (*d)(at::randn({8, 784}));        // kernel (784, 64), bias (64)
//
// Options and config keys (Keras's names and defaults): units (required), activation
// ("linear"), use_bias (true), kernel_initializer ("glorot_uniform"),
// bias_initializer ("zeros"), kernel_regularizer, bias_regularizer,
// activity_regularizer (null), kernel_constraint, bias_constraint (null only).
// Inputs of any rank >= 2 are multiplied on their last axis. The activity
// regularizer's penalty joins regularization_loss() after training calls
// only, so concurrent inference calls write no layer state.
// The product runs through a KernelImpl (kernel_impl.h), the quantization seam.
#pragma once

#include "kiln/layers/activations.h"
#include "kiln/layers/kernel_impl.h"
#include "kiln/layers/layer.h"
#include "kiln/layers/layer_holder.h"
#include "kiln/layers/layer_options.h"
#include "kiln/layers/regularizers.h"

namespace kiln {

namespace layers {

struct DenseOptions {
  int64_t units = 0;  // required, > 0
  std::string activation = "linear";
  bool use_bias = true;
  InitializerArg kernel_initializer = "glorot_uniform";
  InitializerArg bias_initializer = "zeros";
  RegularizerPtr kernel_regularizer, bias_regularizer, activity_regularizer;  // null: none
  LayerOptions base;
};

class DenseImpl : public SimpleLayer {
 public:
  explicit DenseImpl(const DenseOptions& options);
  explicit DenseImpl(const Json& config);
  explicit DenseImpl(int64_t units, const std::string& activation = "linear", const Json& extra = Json::object());
  // The config's keys as options; ValueError for an unknown key or a bad value.
  static DenseOptions options_from_config(const Json& config);

  std::string class_name() const override { return "Dense"; }
  bool supports_masking() const override { return true; }  // as Keras: masks pass through
  void build(const std::vector<Shape>& input_shapes) override;
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;
  // "int8" (kernel stored as int8 with per-output-channel scales), "float8",
  // "int8_qat"; see kernel_impl.h.
  void quantize(const std::string& mode) override;
  bool supports_quantization(const std::string& mode) const override { return true; }
  KernelImpl* kernel_impl_ptr() override { return impl_.get(); }

  int64_t units() const { return options_.units; }
  const VariablePtr& kernel() const { return kernel_; }  // null once quantized to int8
  const VariablePtr& bias() const { return bias_; }      // null when use_bias=false
  const KernelImpl& kernel_impl() const { return *impl_; }

 private:
  DenseImpl(const DenseOptions& options, const Json& base_config);
  KernelSpec kernel_spec(int64_t input_dim) const;

  DenseOptions options_;   // checked: the layer's config
  int64_t input_dim_ = 0;  // set by build
  ActivationFn activation_;
  KernelImplPtr impl_;
  VariablePtr kernel_, bias_;
};
KILN_LAYER_HOLDER(Dense, DenseOptions);

}  // namespace layers

}  // namespace kiln

#define KILN_LEGACY_LAYERS_DENSE_H
#include "kiln/layers/legacy_names.h"
