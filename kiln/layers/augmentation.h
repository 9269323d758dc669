// Image preprocessing and augmentation layers (Keras 3's names, keys and
// defaults). Inputs are image batches (N, H, W, C), or one image (H, W, C);
// data_format "channels_first" takes (N, C, H, W). Integer images (uint8)
// are converted to the compute dtype.
//
// Resizing(height, width, interpolation="bilinear", crop_to_aspect_ratio=
//   false, pad_to_aspect_ratio=false, fill_mode="constant", fill_value=0,
//   antialias=false, data_format): resizes with half-pixel centres
//   (TensorFlow's resize; "bilinear" equals PyTorch's interpolate
//   (align_corners=False), "nearest" PyTorch's "nearest-exact"). With
//   crop_to_aspect_ratio the largest centred window of the target aspect
//   ratio is resized; with pad_to_aspect_ratio the image is first padded
//   (centred, with fill_value) to it. Applies in training and inference.
//
// The Random* layers act in training calls only and are the identity at
// inference (Keras's behaviour), so they sit in the model and vanish when it
// is served. Each draws one transformation per image:
//   RandomFlip(mode="horizontal_and_vertical" | "horizontal" | "vertical"):
//     each direction flipped with probability 1/2.
//   Factors, as Keras reads them: a number f means (-|f|, |f|), a pair
//   [a, b] means (min, max); every value in [-1, 1].
//   RandomTranslation(height_factor, width_factor, fill_mode="reflect",
//     interpolation="bilinear", fill_value=0): shifts by
//     uniform(lower, upper) * H (and * W); positive moves the image
//     down/right.
//   RandomRotation(factor, fill_mode="reflect", interpolation="bilinear",
//     fill_value=0): rotates by uniform(lower, upper) * 2 pi about the
//     image centre (Keras's rotation matrix; positive is counter-clockwise).
//   RandomZoom(height_factor, width_factor=null, fill_mode="reflect",
//     interpolation="bilinear", fill_value=0): zoom 1 + uniform(lower,
//     upper) per axis (negative: zoom in, positive: zoom out).
//     width_factor null keeps the aspect ratio (the height's zoom).
// fill_mode: "reflect" (d c b a | a b c d | d c b a), "wrap" (a b c d | a b
// c d | a b c d), "nearest" (a a a a | a b c d | d d d d), "constant"
// (fill_value). Points between pixels are interpolated per Keras's
// affine_transform: "bilinear" or "nearest" (round half to even), the fill
// mode applied to each neighbouring pixel's index.
//
// `seed` (null or an integer) as in seed_generator.h: null draws from
// LibTorch's default generator (kiln::set_random_seed repeats a run), an
// integer gives the layer its own generator.
//
//   auto aug = std::make_shared<RandomRotation>(RandomRotationOptions{.factor = 0.1, .seed = 7});
//   at::Tensor y = (*aug)(images, /*training=*/true);
#pragma once

#include "kiln/layers/layer.h"
#include "kiln/layers/layer_holder.h"
#include "kiln/layers/layer_options.h"
#include "kiln/layers/seed_generator.h"

namespace kiln {

namespace layers {

struct ResizingOptions {
  int64_t height = 0;                      // required, > 0
  int64_t width = 0;                       // required, > 0
  std::string interpolation = "bilinear";  // or "nearest"
  bool crop_to_aspect_ratio = false;
  bool pad_to_aspect_ratio = false;    // not with crop_to_aspect_ratio
  std::string fill_mode = "constant";  // the only mode
  double fill_value = 0.0;
  bool antialias = false;  // must be false
  std::string data_format = "channels_last";
  LayerOptions base;
};

struct RandomFlipOptions {
  std::string mode = "horizontal_and_vertical";  // or "horizontal", "vertical"
  std::optional<int64_t> seed;
  std::string data_format = "channels_last";
  LayerOptions base;
};

// RandomTranslation and RandomZoom. A factor (a number or a pair, see
// above) is written back by get_config() in the form given.
struct RandomTranslationOptions {
  Json height_factor;  // required
  Json width_factor;   // required by RandomTranslation; RandomZoom: null keeps the aspect ratio
  std::string fill_mode = "reflect";
  std::string interpolation = "bilinear";
  std::optional<int64_t> seed;
  double fill_value = 0.0;
  std::string data_format = "channels_last";
  LayerOptions base;
};
using RandomZoomOptions = RandomTranslationOptions;

struct RandomRotationOptions {
  Json factor;  // required; get_config() writes the pair (lower, upper)
  std::string fill_mode = "reflect";
  std::string interpolation = "bilinear";
  std::optional<int64_t> seed;
  double fill_value = 0.0;
  std::string data_format = "channels_last";
  LayerOptions base;
};

}  // namespace layers

// Keras's affine_transform on channels_last images (N, H, W, C): output
// pixel (y, x) of image n reads the input at (b0*x + b1*y + b2,
// a0*x + a1*y + a2) for transforms[n] = [a0, a1, a2, b0, b1, b2] (x, y in
// pixels, centres at integers). Differentiable in `images`.
at::Tensor affine_transform(const at::Tensor& images, const at::Tensor& transforms, const std::string& interpolation,
                            const std::string& fill_mode, double fill_value);

namespace layers {

// Shared layout handling of the image layers.
class ImageLayer : public SimpleLayer {
 public:
  at::Tensor call1(const at::Tensor& x, bool training) final;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;

 protected:
  // `random`: the layer acts in training calls only.
  ImageLayer(const Json& base_config, const std::string& owner, bool random);
  // channels_last (N, H, W, C) in the compute dtype -> the result, same layout.
  virtual at::Tensor transform(const at::Tensor& images, bool training) = 0;
  // Called by subclasses' constructors with their checked options.
  void set_layout(const std::string& data_format, const std::optional<int64_t>& seed = std::nullopt);
  std::string owner_;
  bool channels_last_ = true;
  bool random_ = false;
  SeedGenerator seeds_;
};

class ResizingImpl : public ImageLayer {
 public:
  explicit ResizingImpl(const ResizingOptions& options);
  explicit ResizingImpl(const Json& config);
  ResizingImpl(int64_t height, int64_t width, const Json& extra = Json::object());
  std::string class_name() const override { return "Resizing"; }
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;

 protected:
  at::Tensor transform(const at::Tensor& images, bool training) override;

 private:
  ResizingImpl(const ResizingOptions& options, const Json& base_config);
  static ResizingOptions options_from_config(const Json& config);
  ResizingOptions options_;  // checked: the layer's config
};
KILN_LAYER_HOLDER(Resizing, ResizingOptions);

class RandomFlipImpl : public ImageLayer {
 public:
  explicit RandomFlipImpl(const RandomFlipOptions& options);
  explicit RandomFlipImpl(const Json& config = Json::object());
  std::string class_name() const override { return "RandomFlip"; }
  Json get_config() const override;

 protected:
  at::Tensor transform(const at::Tensor& images, bool training) override;

 private:
  RandomFlipImpl(const RandomFlipOptions& options, const Json& base_config);
  static RandomFlipOptions options_from_config(const Json& config);
  RandomFlipOptions options_;  // checked: the layer's config
};
KILN_LAYER_HOLDER(RandomFlip, RandomFlipOptions);

// RandomTranslation, RandomRotation and RandomZoom: a random affine map.
class RandomAffineLayer : public ImageLayer {
 protected:
  RandomAffineLayer(const Json& base_config, const std::string& owner);
  at::Tensor transform(const at::Tensor& images, bool training) final;
  // (N, 6) float64 transforms for N images of size h x w.
  virtual at::Tensor draw(int64_t n, int64_t h, int64_t w) = 0;
  // Called by subclasses' constructors with their checked options.
  template <class O>
  void set_affine(const O& o) {
    set_layout(o.data_format, o.seed);
    fill_mode_ = o.fill_mode;
    interpolation_ = o.interpolation;
    fill_value_ = o.fill_value;
  }
  at::Tensor uniform(int64_t n, double lower, double upper);
  std::string fill_mode_, interpolation_;
  double fill_value_ = 0.0;
};

class RandomTranslationImpl : public RandomAffineLayer {
 public:
  explicit RandomTranslationImpl(const RandomTranslationOptions& options);
  explicit RandomTranslationImpl(const Json& config);
  std::string class_name() const override { return "RandomTranslation"; }
  Json get_config() const override;

 protected:
  at::Tensor draw(int64_t n, int64_t h, int64_t w) override;

 private:
  RandomTranslationImpl(const RandomTranslationOptions& options, const Json& base_config);
  static RandomTranslationOptions options_from_config(const Json& config);
  RandomTranslationOptions options_;          // checked: the layer's config
  std::pair<double, double> height_, width_;  // (lower, upper) of the factors
};
KILN_LAYER_HOLDER(RandomTranslation, RandomTranslationOptions);

class RandomRotationImpl : public RandomAffineLayer {
 public:
  explicit RandomRotationImpl(const RandomRotationOptions& options);
  explicit RandomRotationImpl(const Json& config);
  std::string class_name() const override { return "RandomRotation"; }
  Json get_config() const override;

 protected:
  at::Tensor draw(int64_t n, int64_t h, int64_t w) override;

 private:
  RandomRotationImpl(const RandomRotationOptions& options, const Json& base_config);
  static RandomRotationOptions options_from_config(const Json& config);
  RandomRotationOptions options_;     // checked: the layer's config
  std::pair<double, double> factor_;  // (lower, upper)
};
KILN_LAYER_HOLDER(RandomRotation, RandomRotationOptions);

class RandomZoomImpl : public RandomAffineLayer {
 public:
  explicit RandomZoomImpl(const RandomZoomOptions& options);
  explicit RandomZoomImpl(const Json& config);
  std::string class_name() const override { return "RandomZoom"; }
  Json get_config() const override;

 protected:
  at::Tensor draw(int64_t n, int64_t h, int64_t w) override;

 private:
  RandomZoomImpl(const RandomZoomOptions& options, const Json& base_config);
  static RandomZoomOptions options_from_config(const Json& config);
  RandomZoomOptions options_;  // checked: the layer's config
  std::pair<double, double> height_;
  std::optional<std::pair<double, double>> width_;  // unset: the height's zoom
};
KILN_LAYER_HOLDER(RandomZoom, RandomZoomOptions);

}  // namespace layers

}  // namespace kiln

#define KILN_LEGACY_LAYERS_AUGMENTATION_H
#include "kiln/layers/legacy_names.h"
