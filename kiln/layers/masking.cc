#include "kiln/layers/masking.h"

#include "kiln/layers/config_fields.h"

namespace kiln {
namespace {
const FieldTable<MaskingOptions>& masking_fields() {
  static const FieldTable<MaskingOptions> t = {field("mask_value", &MaskingOptions::mask_value)};
  return t;
}
}  // namespace

MaskingOptions Masking::options_from_config(const Json& config) {
  return read_fields(config, "Masking", masking_fields());
}

Masking::Masking(const MaskingOptions& o) : Masking(o, layer_base_config(o.base)) {}

Masking::Masking(const Json& config) : Masking(options_from_config(config), config) {}

Masking::Masking(const MaskingOptions& o, const Json& base_config) : SimpleLayer(base_config), options_(o) {
  check_fields("Masking", options_, masking_fields());
}

at::Tensor Masking::call1(const at::Tensor& x, bool training) {
  if (x.dim() < 1) throw ShapeError("Masking '" + name() + "' needs inputs of rank >= 1");
  const at::Tensor keep = (x != options_.mask_value).any(-1, /*keepdim=*/true);
  return x * keep.to(x.scalar_type());
}

Tensors Masking::compute_mask(const Tensors& inputs, const Tensors& masks) {
  return {(inputs.at(0) != options_.mask_value).any(-1)};
}

std::vector<Shape> Masking::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  return input_shapes;
}

Json Masking::get_config() const {
  Json j = base_config();
  write_fields(j, options_, masking_fields());
  return j;
}

KILN_REGISTER_LAYER(Masking);

}  // namespace kiln
