// Layers that move or resample data without weights, with Keras 3's names,
// keys and defaults: UpSampling2D, ZeroPadding2D, Cropping2D, Permute,
// RepeatVector. Image layers take data_format "channels_last" (default,
// (N, H, W, C)) or "channels_first" ((N, C, H, W)).
//
//   UpSampling2D(size=(2, 2), interpolation="nearest"|"bilinear"):
//     (N, H, W, C) -> (N, H*sh, W*sw, C). "nearest" repeats rows and
//     columns; "bilinear" uses half-pixel centres (TensorFlow's resize,
//     equal to PyTorch's interpolate(align_corners=False)).
//   ZeroPadding2D(padding=1): an int, [h, w] (symmetric), or
//     [[top, bottom], [left, right]]; config writes the last form.
//   Cropping2D(cropping=0): the same forms, removed from the edges.
//   Permute(dims): a 1-based permutation of the non-batch axes,
//     Permute([2, 1]): (N, A, B) -> (N, B, A).
//   RepeatVector(n): (N, F) -> (N, n, F).
//
//   auto up = std::make_shared<UpSampling2D>(UpSampling2DOptions{.size = {2}, .interpolation = "bilinear"});
#pragma once

#include <array>

#include "kiln/layers/layer.h"
#include "kiln/layers/layer_holder.h"
#include "kiln/layers/layer_options.h"

namespace kiln {

namespace layers {

struct UpSampling2DOptions {
  std::vector<int64_t> size = {2, 2};         // one factor for both axes, or (rows, columns)
  std::string data_format = "channels_last";  // or "channels_first"
  std::string interpolation = "nearest";      // or "bilinear"
  LayerOptions base;
};

}  // namespace layers

// Shared by ZeroPadding2D and Cropping2D: ((top, bottom), (left, right)).
using Margins2D = std::array<std::array<int64_t, 2>, 2>;

namespace layers {

struct ZeroPadding2DOptions {
  Margins2D padding = {{{1, 1}, {1, 1}}};  // non-negative
  std::string data_format = "channels_last";
  LayerOptions base;
};

struct Cropping2DOptions {
  Margins2D cropping = {};  // non-negative
  std::string data_format = "channels_last";
  LayerOptions base;
};

struct PermuteOptions {
  std::vector<int64_t> dims;  // required: a permutation of 1..rank-1
  LayerOptions base;
};

struct RepeatVectorOptions {
  int64_t n = 0;  // required, > 0
  LayerOptions base;
};

class UpSampling2DImpl : public SimpleLayer {
 public:
  explicit UpSampling2DImpl(const UpSampling2DOptions& options);
  explicit UpSampling2DImpl(const Json& config = Json::object());
  // The config's keys as options; ValueError for an unknown key or a bad value.
  static UpSampling2DOptions options_from_config(const Json& config);
  std::string class_name() const override { return "UpSampling2D"; }
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;

 private:
  UpSampling2DImpl(const UpSampling2DOptions& options, const Json& base_config);
  UpSampling2DOptions options_;  // checked: the layer's config
  bool channels_last_;           // from options_.data_format
};
KILN_LAYER_HOLDER(UpSampling2D, UpSampling2DOptions);

class ZeroPadding2DImpl : public SimpleLayer {
 public:
  explicit ZeroPadding2DImpl(const ZeroPadding2DOptions& options);
  explicit ZeroPadding2DImpl(const Json& config = Json::object());
  static ZeroPadding2DOptions options_from_config(const Json& config);
  std::string class_name() const override { return "ZeroPadding2D"; }
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;

 private:
  ZeroPadding2DImpl(const ZeroPadding2DOptions& options, const Json& base_config);
  ZeroPadding2DOptions options_;  // checked: the layer's config
  bool channels_last_;
};
KILN_LAYER_HOLDER(ZeroPadding2D, ZeroPadding2DOptions);

class Cropping2DImpl : public SimpleLayer {
 public:
  explicit Cropping2DImpl(const Cropping2DOptions& options);
  explicit Cropping2DImpl(const Json& config = Json::object());
  static Cropping2DOptions options_from_config(const Json& config);
  std::string class_name() const override { return "Cropping2D"; }
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;

 private:
  Cropping2DImpl(const Cropping2DOptions& options, const Json& base_config);
  Cropping2DOptions options_;  // checked: the layer's config
  bool channels_last_;
};
KILN_LAYER_HOLDER(Cropping2D, Cropping2DOptions);

class PermuteImpl : public SimpleLayer {
 public:
  explicit PermuteImpl(const PermuteOptions& options);
  explicit PermuteImpl(const Json& config);
  explicit PermuteImpl(const std::vector<int64_t>& dims, const Json& extra = Json::object());
  static PermuteOptions options_from_config(const Json& config);
  std::string class_name() const override { return "Permute"; }
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;

 private:
  PermuteImpl(const PermuteOptions& options, const Json& base_config);
  void check_rank(int64_t rank) const;
  PermuteOptions options_;  // checked: the layer's config
};
KILN_LAYER_HOLDER(Permute, PermuteOptions);

class RepeatVectorImpl : public SimpleLayer {
 public:
  explicit RepeatVectorImpl(const RepeatVectorOptions& options);
  explicit RepeatVectorImpl(const Json& config);
  explicit RepeatVectorImpl(int64_t n, const Json& extra = Json::object());
  static RepeatVectorOptions options_from_config(const Json& config);
  std::string class_name() const override { return "RepeatVector"; }
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;

 private:
  RepeatVectorImpl(const RepeatVectorOptions& options, const Json& base_config);
  RepeatVectorOptions options_;  // checked: the layer's config
};
KILN_LAYER_HOLDER(RepeatVector, RepeatVectorOptions);

}  // namespace layers

}  // namespace kiln

#define KILN_LEGACY_LAYERS_SPATIAL_H
#include "kiln/layers/legacy_names.h"
