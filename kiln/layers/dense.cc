#include "kiln/layers/dense.h"

#include "kiln/layers/activations.h"
#include "kiln/layers/config_reader.h"

namespace kiln {

DenseOptions Dense::options_from_config(const Json& config) {
  ConfigReader r(config, "Dense");
  DenseOptions o;
  o.units = r.positive_int("units");
  read_kernel_options(r, o);
  r.finish();
  return o;
}

Dense::Dense(const DenseOptions& o) : Dense(o, layer_base_config(o.base)) {}

Dense::Dense(const Json& config) : Dense(options_from_config(config), config) {}

Dense::Dense(const DenseOptions& o, const Json& base_config) : SimpleLayer(base_config) {
  units_ = option_check::positive("Dense", "units", o.units);
  activation_name_ = option_check::activation("Dense", "activation", o.activation);
  use_bias_ = o.use_bias;
  kernel_init_ = o.kernel_initializer.resolve("Dense", "kernel_initializer");
  bias_init_ = o.bias_initializer.resolve("Dense", "bias_initializer");
  kernel_reg_ = o.kernel_regularizer;
  bias_reg_ = o.bias_regularizer;
  activity_reg_ = o.activity_regularizer;
  activation_ = get_activation(activation_name_);
  impl_ = float_matmul_impl();
}

Dense::Dense(int64_t units, const std::string& activation, const Json& extra)
    : Dense(merged_config(extra, Json{{"units", units}, {"activation", activation}})) {}

void Dense::build(const std::vector<Shape>& input_shapes) {
  const Shape& s = input_shapes.at(0);
  if (s.size() < 2 || s.back() < 1)
    throw ShapeError("Dense '" + name() +
                     "' needs inputs of rank >= 2 with a known last dimension. Received: " + shape_to_string(s));
  input_dim_ = s.back();
  const KernelSpec spec = kernel_spec(input_dim_);
  if (policy_keeps_float_kernel()) kernel_ = add_weight("kernel", {s.back(), units_}, kernel_init_, true, kernel_reg_);
  if (use_bias_) bias_ = add_weight("bias", {units_}, bias_init_, true, bias_reg_);
  impl_ = build_kernel_impl(spec);
}

KernelSpec Dense::kernel_spec(int64_t input_dim) const {
  KernelSpec spec;
  spec.kernel_shape = {input_dim, units_};
  spec.kernel_reduced_axes = {0};
  spec.input_reduced_axes = {-1};
  return spec;
}

void Dense::quantize(const std::string& mode) { quantize_kernel(mode, kernel_spec(input_dim_), impl_, kernel_); }

at::Tensor Dense::call1(const at::Tensor& x, bool training) {
  const Shape xs = impl_->logical_input_shape(Shape(x.sizes().begin(), x.sizes().end()));
  if (xs.size() < 2 || xs.back() != input_dim_)
    throw ShapeError("Dense '" + name() + "' expects inputs with last dimension " + std::to_string(input_dim_) +
                     ". Received: " + shape_to_string(Shape(x.sizes().begin(), x.sizes().end())));
  at::Tensor y =
      impl_->apply_with_bias(x, kernel_ ? value(kernel_) : at::Tensor(), bias_ ? value(bias_) : at::Tensor(), training);
  y = activation_(y);
  if (activity_reg_ && training) add_loss((*activity_reg_)(y));
  return y;
}

std::vector<Shape> Dense::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  Shape s = input_shapes.at(0);
  s.back() = units_;
  return {s};
}

Json Dense::get_config() const {
  Json j = base_config();
  j["units"] = units_;
  j["activation"] = activation_name_;
  j["use_bias"] = use_bias_;
  j["kernel_initializer"] = kernel_init_->to_json();
  j["bias_initializer"] = bias_init_->to_json();
  j["kernel_regularizer"] = regularizer_json(kernel_reg_);
  j["bias_regularizer"] = regularizer_json(bias_reg_);
  j["kernel_constraint"] = nullptr;
  j["bias_constraint"] = nullptr;
  // Keras writes it only when set.
  if (activity_reg_) j["activity_regularizer"] = regularizer_json(activity_reg_);
  return j;
}

KILN_REGISTER_LAYER(Dense);

}  // namespace kiln
