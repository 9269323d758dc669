// Masking: marks the time steps whose features all equal `mask_value` as
// padding (Keras's Masking). The output is the input with those steps zeroed
// and carries the mask any(x != mask_value, last axis), shape x.shape[:-1],
// which recurrent layers, losses and metrics honour (layer.h, masking).
//
//   auto m = std::make_shared<Masking>(MaskingOptions{.mask_value = 0.0});
//   Tensors masks;
//   at::Tensor y = m->call_with_masks({x}, {}, false, &masks)[0];  // masks[0]: (batch, time)
//
// Keys: mask_value (0.0).
#pragma once

#include "kiln/layers/layer.h"
#include "kiln/layers/layer_holder.h"
#include "kiln/layers/layer_options.h"

namespace kiln {

namespace layers {

struct MaskingOptions {
  double mask_value = 0.0;
  LayerOptions base;
};

class MaskingImpl : public SimpleLayer {
 public:
  explicit MaskingImpl(const MaskingOptions& options);
  explicit MaskingImpl(const Json& config);
  std::string class_name() const override { return "Masking"; }
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  bool supports_masking() const override { return true; }
  Tensors compute_mask(const Tensors& inputs, const Tensors& masks) override;
  Json get_config() const override;
  double mask_value() const { return options_.mask_value; }

 private:
  MaskingImpl(const MaskingOptions& options, const Json& base_config);
  static MaskingOptions options_from_config(const Json& config);
  MaskingOptions options_;  // checked: the layer's config
};
KILN_LAYER_HOLDER(Masking, MaskingOptions);

}  // namespace layers

}  // namespace kiln

#define KILN_LEGACY_LAYERS_MASKING_H
#include "kiln/layers/legacy_names.h"
