// Regularisation layers that act in training only (identity at inference),
// Keras 3's names, keys and defaults:
//
//   SpatialDropout2D(rate, data_format="channels_last", seed=null): drops
//     whole feature maps: one keep/drop draw per (sample, channel), kept
//     maps scaled by 1/(1 - rate). Inputs (N, H, W, C) or, channels_first,
//     (N, C, H, W).
//   GaussianNoise(stddev, seed=null): adds N(0, stddev^2) noise; stddev
//     between 0 and 1, as Keras checks.
//
// `seed` (see seed_generator.h): null draws from LibTorch's default
// generator (repeatable after kiln::set_random_seed); an integer gives the
// layer its own seeded generator.
#pragma once

#include "kiln/layers/layer.h"
#include "kiln/layers/layer_holder.h"
#include "kiln/layers/layer_options.h"
#include "kiln/layers/seed_generator.h"

namespace kiln {

namespace layers {

struct SpatialDropout2DOptions {
  double rate = 0.0;  // in [0, 1]
  std::string data_format = "channels_last";
  std::optional<int64_t> seed;
  LayerOptions base;
};

class SpatialDropout2DImpl : public SimpleLayer {
 public:
  explicit SpatialDropout2DImpl(const SpatialDropout2DOptions& options);
  explicit SpatialDropout2DImpl(const Json& config);
  explicit SpatialDropout2DImpl(double rate, const Json& extra = Json::object());
  std::string class_name() const override { return "SpatialDropout2D"; }
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;

 private:
  SpatialDropout2DImpl(const SpatialDropout2DOptions& options, const Json& base_config);
  static SpatialDropout2DOptions options_from_config(const Json& config);

  SpatialDropout2DOptions options_;  // checked: the layer's config
  SeedGenerator seeds_;
};
KILN_LAYER_HOLDER(SpatialDropout2D, SpatialDropout2DOptions);

class GaussianNoiseImpl : public SimpleLayer {
 public:
  explicit GaussianNoiseImpl(const Json& config);
  explicit GaussianNoiseImpl(double stddev, const Json& extra = Json::object());
  std::string class_name() const override { return "GaussianNoise"; }
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;

 private:
  double stddev_;
  SeedGenerator seeds_;
};
KILN_LAYER_HOLDER(GaussianNoise, void);

}  // namespace layers

}  // namespace kiln

#define KILN_LEGACY_LAYERS_NOISE_H
#include "kiln/layers/legacy_names.h"
