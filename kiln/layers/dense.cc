#include "kiln/layers/dense.h"

#include "kiln/layers/activations.h"
#include "kiln/layers/config_fields.h"

namespace kiln {
namespace {
const FieldTable<layers::DenseOptions>& dense_fields() {
  static const FieldTable<layers::DenseOptions> t =
      FieldTable<layers::DenseOptions>{field("units", &layers::DenseOptions::units).positive().required()} +
      kernel_fields<layers::DenseOptions>(/*activity_last=*/true);
  return t;
}
}  // namespace

layers::DenseOptions layers::DenseImpl::options_from_config(const Json& config) {
  return read_fields(config, "Dense", dense_fields());
}

layers::DenseImpl::DenseImpl(const layers::DenseOptions& o) : layers::DenseImpl(o, layer_base_config(o.base)) {}

layers::DenseImpl::DenseImpl(const Json& config) : layers::DenseImpl(options_from_config(config), config) {}

layers::DenseImpl::DenseImpl(const layers::DenseOptions& o, const Json& base_config)
    : SimpleLayer(base_config), options_(o) {
  check_fields("Dense", options_, dense_fields());
  activation_ = get_activation(options_.activation);
  impl_ = float_matmul_impl();
}

layers::DenseImpl::DenseImpl(int64_t units, const std::string& activation, const Json& extra)
    : layers::DenseImpl(merged_config(extra, Json{{"units", units}, {"activation", activation}})) {}

void layers::DenseImpl::build(const std::vector<Shape>& input_shapes) {
  const Shape& s = input_shapes.at(0);
  if (s.size() < 2 || s.back() < 1)
    throw ShapeError("Dense '" + name() +
                     "' needs inputs of rank >= 2 with a known last dimension. Received: " + shape_to_string(s));
  input_dim_ = s.back();
  const KernelSpec spec = kernel_spec(input_dim_);
  const layers::DenseOptions& o = options_;
  if (policy_keeps_float_kernel())
    kernel_ = add_weight("kernel", {s.back(), o.units}, o.kernel_initializer.resolved(), true, o.kernel_regularizer);
  if (o.use_bias) bias_ = add_weight("bias", {o.units}, o.bias_initializer.resolved(), true, o.bias_regularizer);
  impl_ = build_kernel_impl(spec);
}

KernelSpec layers::DenseImpl::kernel_spec(int64_t input_dim) const {
  KernelSpec spec;
  spec.kernel_shape = {input_dim, options_.units};
  spec.kernel_reduced_axes = {0};
  spec.input_reduced_axes = {-1};
  return spec;
}

void layers::DenseImpl::quantize(const std::string& mode) {
  quantize_kernel(mode, kernel_spec(input_dim_), impl_, kernel_);
}

at::Tensor layers::DenseImpl::call1(const at::Tensor& x, bool training) {
  const Shape xs = impl_->logical_input_shape(Shape(x.sizes().begin(), x.sizes().end()));
  if (xs.size() < 2 || xs.back() != input_dim_)
    throw ShapeError("Dense '" + name() + "' expects inputs with last dimension " + std::to_string(input_dim_) +
                     ". Received: " + shape_to_string(Shape(x.sizes().begin(), x.sizes().end())));
  at::Tensor y =
      impl_->apply_with_bias(x, kernel_ ? value(kernel_) : at::Tensor(), bias_ ? value(bias_) : at::Tensor(), training);
  y = activation_(y);
  if (options_.activity_regularizer && training) add_loss((*options_.activity_regularizer)(y));
  return y;
}

std::vector<Shape> layers::DenseImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  Shape s = input_shapes.at(0);
  s.back() = options_.units;
  return {s};
}

Json layers::DenseImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, dense_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(Dense, layers::DenseImpl);

}  // namespace kiln
