// Activation functions by Keras name, and the Activation layer.
//
//   ActivationFn f = get_activation("gelu");
//   at::Tensor y = f(x);
//   auto layer = std::make_shared<Activation>("softmax");
//   auto same = std::make_shared<Activation>(ActivationOptions{.activation = "softmax"});
//
// Known names (Keras's definitions and defaults): linear, relu, relu6, gelu
// (exact erf form, Keras's approximate=False), sigmoid, hard_sigmoid, tanh,
// softmax and log_softmax (last axis), silu and its alias swish, leaky_relu
// (negative_slope 0.2), elu (alpha 1), selu, softplus, softsign,
// exponential, mish. The functions are pure and thread-safe; they compute in
// the dtype of their input.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

#include "kiln/layers/layer.h"
#include "kiln/layers/layer_holder.h"
#include "kiln/layers/layer_options.h"

namespace kiln {

using ActivationFn = std::function<at::Tensor(const at::Tensor&)>;

// ValueError "unknown activation 'relux'; known activations: ..." if absent.
ActivationFn get_activation(const std::string& name);
bool is_activation(const std::string& name);
std::vector<std::string> activation_names();

namespace layers {

struct ActivationOptions {
  std::string activation;  // required: a known name
  LayerOptions base;
};

// Keras's Activation layer. Config: {"activation": "relu"}.
class ActivationImpl : public SimpleLayer {
 public:
  explicit ActivationImpl(const ActivationOptions& options);
  explicit ActivationImpl(const Json& config);
  explicit ActivationImpl(const std::string& activation, const Json& extra = Json::object());
  explicit ActivationImpl(const char* activation, const Json& extra = Json::object())
      : ActivationImpl(std::string(activation), extra) {}
  // The config's keys as options; ValueError for an unknown key or a bad value.
  static ActivationOptions options_from_config(const Json& config);

  std::string class_name() const override { return "Activation"; }
  bool supports_masking() const override { return true; }  // as Keras: masks pass through
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;
  const std::string& activation() const { return options_.activation; }

 private:
  ActivationImpl(const ActivationOptions& options, const Json& base_config);
  ActivationOptions options_;  // checked: the layer's config
  ActivationFn fn_;
};
KILN_LAYER_HOLDER(Activation, ActivationOptions);

}  // namespace layers

}  // namespace kiln

#define KILN_LEGACY_LAYERS_ACTIVATIONS_H
#include "kiln/layers/legacy_names.h"
