// GroupNormalization (Keras 3): channels split into `groups` contiguous
// groups; each sample is normalised by the mean and (biased) variance of
// each group over the group's channels and every other non-batch axis,
// then scaled by gamma and shifted by beta (per channel).
//
// Config keys and defaults: groups (32; -1 means one group per channel),
// axis (-1, the channel axis), epsilon (1e-3), center (true), scale (true),
// beta_initializer ("zeros"), gamma_initializer ("ones"), beta_regularizer,
// gamma_regularizer, beta_constraint, gamma_constraint (null only). The
// channel count must be a multiple of `groups`. As in Keras, statistics are
// computed in float32 at least (bfloat16 inputs are upcast), the output is
// in the compute dtype. Equals PyTorch's group_norm for channels_first.
//
//   auto gn = std::make_shared<GroupNormalization>(Json{{"groups", 4}});
//   y = (*gn)(at::randn({2, 8, 8, 16}));
#pragma once

#include "kiln/layers/layer.h"
#include "kiln/layers/layer_holder.h"
#include "kiln/layers/layer_options.h"
#include "kiln/layers/regularizers.h"

namespace kiln {

namespace layers {

struct GroupNormalizationOptions {
  int64_t groups = 32;    // > 0, or -1 (one group per channel: instance normalization)
  int64_t axis = -1;      // the channel axis
  double epsilon = 1e-3;  // >= 0
  bool center = true;
  bool scale = true;
  InitializerArg beta_initializer = "zeros";
  InitializerArg gamma_initializer = "ones";
  RegularizerPtr beta_regularizer, gamma_regularizer;  // null: none
  LayerOptions base;
};

class GroupNormalizationImpl : public SimpleLayer {
 public:
  explicit GroupNormalizationImpl(const GroupNormalizationOptions& options);
  explicit GroupNormalizationImpl(const Json& config = Json::object());
  // The config's keys as options; ValueError for an unknown key or a bad value.
  static GroupNormalizationOptions options_from_config(const Json& config);
  std::string class_name() const override { return "GroupNormalization"; }
  void build(const std::vector<Shape>& input_shapes) override;
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;
  const VariablePtr& gamma() const { return gamma_; }
  const VariablePtr& beta() const { return beta_; }

 private:
  GroupNormalizationImpl(const GroupNormalizationOptions& options, const Json& base_config);

  GroupNormalizationOptions options_;                      // checked: the layer's config
  int64_t groups_ = 0, resolved_axis_ = 0, channels_ = 0;  // set by build
  VariablePtr gamma_, beta_;
};
KILN_LAYER_HOLDER(GroupNormalization, GroupNormalizationOptions);

}  // namespace layers

}  // namespace kiln

#define KILN_LEGACY_LAYERS_GROUP_NORM_H
#include "kiln/layers/legacy_names.h"
