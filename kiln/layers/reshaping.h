// Layers that only move data: Flatten and Reshape (Keras's names and
// semantics; the batch axis is never touched).
//
//   Flatten(): (N, 4, 4, 8) -> (N, 128). data_format "channels_first"
//     flattens in channels-last order, as Keras does, so weights trained on
//     either layout agree.
//   Reshape(Shape{4, -1}): (N, 12) -> (N, 4, 3). target_shape excludes the
//     batch axis; one entry may be -1 (inferred).
//
//   auto r = std::make_shared<Reshape>(ReshapeOptions{.target_shape = {4, -1}});
#pragma once

#include "kiln/layers/layer.h"
#include "kiln/layers/layer_holder.h"
#include "kiln/layers/layer_options.h"

namespace kiln {

namespace layers {

struct FlattenOptions {
  std::string data_format = "channels_last";  // or "channels_first"
  LayerOptions base;
};

struct ReshapeOptions {
  Shape target_shape;  // required: positive sizes, at most one -1 (batch axis excluded)
  LayerOptions base;
};

class FlattenImpl : public SimpleLayer {
 public:
  explicit FlattenImpl(const FlattenOptions& options);
  explicit FlattenImpl(const Json& config = Json::object());
  // The config's keys as options; ValueError for an unknown key or a bad value.
  static FlattenOptions options_from_config(const Json& config);

  std::string class_name() const override { return "Flatten"; }
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;

 private:
  FlattenImpl(const FlattenOptions& options, const Json& base_config);
  FlattenOptions options_;  // checked: the layer's config
};
KILN_LAYER_HOLDER(Flatten, FlattenOptions);

class ReshapeImpl : public SimpleLayer {
 public:
  explicit ReshapeImpl(const ReshapeOptions& options);
  explicit ReshapeImpl(const Json& config);
  explicit ReshapeImpl(const Shape& target_shape, const Json& extra = Json::object());
  static ReshapeOptions options_from_config(const Json& config);

  std::string class_name() const override { return "Reshape"; }
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;
  const Shape& target_shape() const { return options_.target_shape; }

 private:
  ReshapeImpl(const ReshapeOptions& options, const Json& base_config);
  // target_shape with the -1 resolved for `n` elements per sample (n < 0: unknown).
  Shape resolve(int64_t n, const Shape& input_shape) const;
  ReshapeOptions options_;  // checked: the layer's config
};
KILN_LAYER_HOLDER(Reshape, ReshapeOptions);

}  // namespace layers

}  // namespace kiln

#define KILN_LEGACY_LAYERS_RESHAPING_H
#include "kiln/layers/legacy_names.h"
