#include "kiln/layers/masking.h"

#include "kiln/layers/config_fields.h"

namespace kiln {
namespace {
const FieldTable<layers::MaskingOptions>& masking_fields() {
  static const FieldTable<layers::MaskingOptions> t = {field("mask_value", &layers::MaskingOptions::mask_value)};
  return t;
}
}  // namespace

layers::MaskingOptions layers::MaskingImpl::options_from_config(const Json& config) {
  return read_fields(config, "Masking", masking_fields());
}

layers::MaskingImpl::MaskingImpl(const layers::MaskingOptions& o) : layers::MaskingImpl(o, layer_base_config(o.base)) {}

layers::MaskingImpl::MaskingImpl(const Json& config) : layers::MaskingImpl(options_from_config(config), config) {}

layers::MaskingImpl::MaskingImpl(const layers::MaskingOptions& o, const Json& base_config)
    : SimpleLayer(base_config), options_(o) {
  check_fields("Masking", options_, masking_fields());
}

at::Tensor layers::MaskingImpl::call1(const at::Tensor& x, bool training) {
  if (x.dim() < 1) throw ShapeError("Masking '" + name() + "' needs inputs of rank >= 1");
  const at::Tensor keep = (x != options_.mask_value).any(-1, /*keepdim=*/true);
  return x * keep.to(x.scalar_type());
}

Tensors layers::MaskingImpl::compute_mask(const Tensors& inputs, const Tensors& masks) {
  return {(inputs.at(0) != options_.mask_value).any(-1)};
}

std::vector<Shape> layers::MaskingImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  return input_shapes;
}

Json layers::MaskingImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, masking_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(Masking, layers::MaskingImpl);

}  // namespace kiln
