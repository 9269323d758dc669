#include "kiln/layers/masking.h"

#include "kiln/layers/config_reader.h"

namespace kiln {

Masking::Masking(const Json& config) : SimpleLayer(config) {
  ConfigReader r(config, "Masking");
  mask_value_ = r.number("mask_value", 0.0);
  r.finish();
}

at::Tensor Masking::call1(const at::Tensor& x, bool training) {
  if (x.dim() < 1) throw ShapeError("Masking '" + name() + "' needs inputs of rank >= 1");
  const at::Tensor keep = (x != mask_value_).any(-1, /*keepdim=*/true);
  return x * keep.to(x.scalar_type());
}

Tensors Masking::compute_mask(const Tensors& inputs, const Tensors& masks) {
  return {(inputs.at(0) != mask_value_).any(-1)};
}

std::vector<Shape> Masking::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  return input_shapes;
}

Json Masking::get_config() const {
  Json j = base_config();
  j["mask_value"] = mask_value_;
  return j;
}

KILN_REGISTER_LAYER(Masking);

}  // namespace kiln
