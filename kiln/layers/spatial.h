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
//   auto up = std::make_shared<UpSampling2D>(Json{{"size", 2}, {"interpolation", "bilinear"}});
#pragma once

#include <array>

#include "kiln/layers/layer.h"

namespace kiln {

class UpSampling2D : public SimpleLayer {
 public:
  explicit UpSampling2D(const Json& config = Json::object());
  std::string class_name() const override { return "UpSampling2D"; }
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;

 private:
  std::vector<int64_t> size_;
  bool channels_last_;
  std::string interpolation_;
};

// Shared by ZeroPadding2D and Cropping2D: ((top, bottom), (left, right)).
using Margins2D = std::array<std::array<int64_t, 2>, 2>;

class ZeroPadding2D : public SimpleLayer {
 public:
  explicit ZeroPadding2D(const Json& config = Json::object());
  std::string class_name() const override { return "ZeroPadding2D"; }
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;

 private:
  Margins2D padding_;
  bool channels_last_;
};

class Cropping2D : public SimpleLayer {
 public:
  explicit Cropping2D(const Json& config = Json::object());
  std::string class_name() const override { return "Cropping2D"; }
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;

 private:
  Margins2D cropping_;
  bool channels_last_;
};

class Permute : public SimpleLayer {
 public:
  explicit Permute(const Json& config);
  explicit Permute(const std::vector<int64_t>& dims, const Json& extra = Json::object());
  std::string class_name() const override { return "Permute"; }
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;

 private:
  void check_rank(int64_t rank) const;
  std::vector<int64_t> dims_;  // 1-based
};

class RepeatVector : public SimpleLayer {
 public:
  explicit RepeatVector(const Json& config);
  explicit RepeatVector(int64_t n, const Json& extra = Json::object());
  std::string class_name() const override { return "RepeatVector"; }
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;

 private:
  int64_t n_;
};

}  // namespace kiln
