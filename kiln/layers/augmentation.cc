#include "kiln/layers/augmentation.h"

#include <algorithm>
#include <cmath>

#include "kiln/layers/config_fields.h"
#include "kiln/layers/conv_utils.h"

namespace kiln {
namespace {

const std::vector<std::string> kAugFillModes = {"reflect", "wrap", "constant", "nearest"};
const char* const kAugFactorExpected = "a number or a list of two numbers, each between -1.0 and 1.0";

// A factor as Keras reads it: a number f means (-|f|, |f|), a pair is
// sorted; std::nullopt unless one of those within [-1, 1].
std::optional<std::pair<double, double>> aug_factor(const Json& j) {
  std::pair<double, double> f;
  if (j.is_number())
    f = {-std::abs(j.get<double>()), std::abs(j.get<double>())};
  else if (j.is_array() && j.size() == 2 && j[0].is_number() && j[1].is_number())
    f = std::minmax({j[0].get<double>(), j[1].get<double>()});
  else
    return std::nullopt;
  if (!(f.first >= -1.0 && f.second <= 1.0)) return std::nullopt;
  return f;
}

template <class O>
Field<O, Json> aug_factor_field(const char* key, Json O::*member) {
  return field(key, member).where([](const Json& j) { return aug_factor(j).has_value(); }, kAugFactorExpected);
}

// The keys every image layer has, in get_config()'s order.
template <class O>
FieldTable<O> aug_layout_fields() {
  return {field("data_format", &O::data_format).choice({"channels_last", "channels_first"})};
}
template <class O>
FieldTable<O> aug_random_fields() {
  return aug_layout_fields<O>() + FieldTable<O>{field("seed", &O::seed)};
}
template <class O>
FieldTable<O> aug_affine_fields() {
  return aug_random_fields<O>() +
         FieldTable<O>{field("fill_mode", &O::fill_mode).choice(kAugFillModes),
                       field("interpolation", &O::interpolation).choice({"bilinear", "nearest"}),
                       field("fill_value", &O::fill_value)};
}

// An integer pixel index mapped into [0, size) by the fill mode; `valid`
// (constant mode) marks indices inside the image.
at::Tensor aug_fix_index(const at::Tensor& i, int64_t size, const std::string& mode, at::Tensor* valid) {
  if (mode == "reflect") {
    at::Tensor m = at::remainder(i, 2 * size);
    return at::where(m < size, m, 2 * size - 1 - m);
  }
  if (mode == "wrap") return at::remainder(i, size);
  if (mode == "constant") *valid = at::logical_and(i >= 0, i < size);
  return at::clamp(i, 0, size - 1);
}

}  // namespace

at::Tensor affine_transform(const at::Tensor& images, const at::Tensor& transforms, const std::string& interpolation,
                            const std::string& fill_mode, double fill_value) {
  const int64_t n = images.size(0), h = images.size(1), w = images.size(2), c = images.size(3);
  const at::ScalarType coord_type = at::promote_types(images.scalar_type(), at::kFloat);
  auto opts = images.options().dtype(coord_type);
  at::Tensor t = transforms.to(coord_type);
  auto col = [&](int k) { return t.select(1, k).view({n, 1, 1}); };
  at::Tensor xs = at::arange(w, opts).view({1, 1, w});
  at::Tensor ys = at::arange(h, opts).view({1, h, 1});
  at::Tensor sx = col(0) * xs + col(1) * ys + col(2);  // (n, h, w)
  at::Tensor sy = col(3) * xs + col(4) * ys + col(5);
  at::Tensor flat = images.reshape({n * h * w, c});
  at::Tensor base = at::arange(n, images.options().dtype(at::kLong)).view({n, 1, 1}) * (h * w);
  at::Tensor fill = at::scalar_tensor(fill_value, images.options());
  auto sample = [&](const at::Tensor& iy, const at::Tensor& ix) {
    at::Tensor vy, vx;
    at::Tensor fy = aug_fix_index(iy, h, fill_mode, &vy), fx = aug_fix_index(ix, w, fill_mode, &vx);
    at::Tensor vals = flat.index_select(0, (base + fy * w + fx).reshape(-1)).view({n, h, w, c});
    if (fill_mode == "constant") vals = at::where(at::logical_and(vy, vx).unsqueeze(-1), vals, fill);
    return vals;
  };
  if (interpolation == "nearest") return sample(at::round(sy).to(at::kLong), at::round(sx).to(at::kLong));
  at::Tensor x0 = at::floor(sx), y0 = at::floor(sy);
  at::Tensor wx1 = (sx - x0).unsqueeze(-1).to(images.scalar_type());
  at::Tensor wy1 = (sy - y0).unsqueeze(-1).to(images.scalar_type());
  at::Tensor wx0 = 1 - wx1, wy0 = 1 - wy1;
  at::Tensor ix0 = x0.to(at::kLong), iy0 = y0.to(at::kLong);
  return wy0 * (wx0 * sample(iy0, ix0) + wx1 * sample(iy0, ix0 + 1)) +
         wy1 * (wx0 * sample(iy0 + 1, ix0) + wx1 * sample(iy0 + 1, ix0 + 1));
}

// --- ImageLayer ---------------------------------------------------------------------
layers::ImageLayer::ImageLayer(const Json& base_config, const std::string& owner, bool random)
    : SimpleLayer(base_config), owner_(owner), random_(random) {}

void layers::ImageLayer::set_layout(const std::string& data_format, const std::optional<int64_t>& seed) {
  channels_last_ = data_format == "channels_last";
  seeds_ = SeedGenerator(seed);
}

at::Tensor layers::ImageLayer::call1(const at::Tensor& x_in, bool training) {
  at::Tensor x = at::isFloatingType(x_in.scalar_type()) ? x_in : x_in.to(dtype_policy().compute_dtype());
  if (x.dim() != 3 && x.dim() != 4)
    throw ShapeError(owner_ + " '" + name() + "' expects images (batch, height, width, channels) or one image " +
                     "(height, width, channels). Received shape " + shape_to_string(sizes_of(x)));
  if (random_ && !training) return x;
  const bool unbatched = x.dim() == 3;
  at::Tensor b = unbatched ? x.unsqueeze(0) : x;
  if (!channels_last_) b = conv_utils::channels_first_to_last(b);
  at::Tensor y = transform(b, training);
  if (!channels_last_) y = conv_utils::channels_last_to_first(y);
  y = y.contiguous();
  return unbatched ? y.squeeze(0) : y;
}

std::vector<Shape> layers::ImageLayer::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  const Shape& s = input_shapes.at(0);
  if (s.size() != 3 && s.size() != 4)
    throw ShapeError(owner_ + " '" + name() + "' expects images (batch, height, width, channels). Received shape " +
                     shape_to_string(s));
  return input_shapes;
}

// --- Resizing -------------------------------------------------------------------------
namespace {
const FieldTable<layers::ResizingOptions>& resizing_fields() {
  using O = layers::ResizingOptions;
  static const FieldTable<O> t =
      aug_layout_fields<O>() +
      FieldTable<O>{field("height", &O::height).positive().required(),
                    field("width", &O::width).positive().required(),
                    field("interpolation", &O::interpolation).choice({"bilinear", "nearest"}),
                    field("crop_to_aspect_ratio", &O::crop_to_aspect_ratio),
                    field("pad_to_aspect_ratio", &O::pad_to_aspect_ratio),
                    field("fill_mode", &O::fill_mode).choice({"constant"}),
                    field("fill_value", &O::fill_value),
                    field("antialias", &O::antialias)
                        .where([](bool antialias) { return !antialias; }, "false (kiln resizes without antialiasing)")};
  return t;
}
}  // namespace

layers::ResizingOptions layers::ResizingImpl::options_from_config(const Json& config) {
  return read_fields(config, "Resizing", resizing_fields());
}

layers::ResizingImpl::ResizingImpl(const layers::ResizingOptions& o)
    : layers::ResizingImpl(o, layer_base_config(o.base)) {}

layers::ResizingImpl::ResizingImpl(const Json& config) : layers::ResizingImpl(options_from_config(config), config) {}

layers::ResizingImpl::ResizingImpl(const layers::ResizingOptions& o, const Json& base_config)
    : layers::ImageLayer(base_config, "Resizing", /*random=*/false), options_(o) {
  check_fields("Resizing", options_, resizing_fields());
  if (options_.crop_to_aspect_ratio && options_.pad_to_aspect_ratio)
    throw ValueError("Resizing: only one of `crop_to_aspect_ratio` and `pad_to_aspect_ratio` can be true");
  set_layout(options_.data_format);
}

layers::ResizingImpl::ResizingImpl(int64_t height, int64_t width, const Json& extra)
    : layers::ResizingImpl(merged_config(extra, Json{{"height", height}, {"width", width}})) {}

at::Tensor layers::ResizingImpl::transform(const at::Tensor& images_in, bool training) {
  const layers::ResizingOptions& o = options_;
  at::Tensor images = images_in;
  int64_t h = images.size(1), w = images.size(2);
  if (o.crop_to_aspect_ratio) {
    // Keras's centred crop box of the target aspect ratio.
    int64_t ch = std::max<int64_t>(std::min<int64_t>(h, (int64_t)((double)(w * o.height) / o.width)), 1);
    int64_t cw = std::max<int64_t>(std::min<int64_t>(w, (int64_t)((double)(h * o.width) / o.height)), 1);
    int64_t hs = (int64_t)((double)(h - ch) / 2), ws = (int64_t)((double)(w - cw) / 2);
    images = images.slice(1, hs, hs + ch).slice(2, ws, ws + cw);
  } else if (o.pad_to_aspect_ratio) {
    int64_t ph = std::max<int64_t>(h, (int64_t)((double)(w * o.height) / o.width));
    int64_t pw = std::max<int64_t>(w, (int64_t)((double)(h * o.width) / o.height));
    int64_t hs = (int64_t)((double)(ph - h) / 2), ws = (int64_t)((double)(pw - w) / 2);
    images = at::constant_pad_nd(images, {0, 0, ws, pw - w - ws, hs, ph - h - hs}, o.fill_value);
  }
  h = images.size(1);
  w = images.size(2);
  if (o.interpolation == "nearest") {
    // Half-pixel centres: source floor((i + 0.5) * in / out).
    auto source = [&](int64_t out, int64_t in) {
      at::Tensor i = at::arange(out, at::kDouble);
      return at::clamp_max(at::floor((i + 0.5) * ((double)in / out)), (double)(in - 1)).to(at::kLong);
    };
    return images.index_select(1, source(o.height, h)).index_select(2, source(o.width, w));
  }
  const at::ScalarType dt = images.scalar_type();
  at::Tensor cf = conv_utils::channels_last_to_first(images).to(at::promote_types(dt, at::kFloat));
  at::Tensor y = at::upsample_bilinear2d(cf, {o.height, o.width}, /*align_corners=*/false);
  return conv_utils::channels_first_to_last(y).to(dt);
}

std::vector<Shape> layers::ResizingImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  Shape s = layers::ImageLayer::compute_output_shape(input_shapes).at(0);
  const int hdim = (int)s.size() - (channels_last_ ? 3 : 2);
  s[hdim] = options_.height;
  s[hdim + 1] = options_.width;
  return {s};
}

Json layers::ResizingImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, resizing_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(Resizing, layers::ResizingImpl);

// --- RandomFlip -------------------------------------------------------------------------
namespace {
const FieldTable<layers::RandomFlipOptions>& random_flip_fields() {
  using O = layers::RandomFlipOptions;
  static const FieldTable<O> t =
      aug_random_fields<O>() +
      FieldTable<O>{field("mode", &O::mode).choice({"horizontal", "vertical", "horizontal_and_vertical"})};
  return t;
}
}  // namespace

layers::RandomFlipOptions layers::RandomFlipImpl::options_from_config(const Json& config) {
  return read_fields(config, "RandomFlip", random_flip_fields());
}

layers::RandomFlipImpl::RandomFlipImpl(const layers::RandomFlipOptions& o)
    : layers::RandomFlipImpl(o, layer_base_config(o.base)) {}

layers::RandomFlipImpl::RandomFlipImpl(const Json& config)
    : layers::RandomFlipImpl(options_from_config(config), config) {}

layers::RandomFlipImpl::RandomFlipImpl(const layers::RandomFlipOptions& o, const Json& base_config)
    : layers::ImageLayer(base_config, "RandomFlip", /*random=*/true), options_(o) {
  check_fields("RandomFlip", options_, random_flip_fields());
  set_layout(options_.data_format, options_.seed);
}

at::Tensor layers::RandomFlipImpl::transform(const at::Tensor& images, bool training) {
  const int64_t n = images.size(0);
  at::Tensor y = images;
  if (options_.mode != "vertical") {
    at::Tensor flip = at::rand({n}, seeds_.generator(), at::kDouble) < 0.5;
    y = at::where(flip.view({n, 1, 1, 1}), y.flip({2}), y);
  }
  if (options_.mode != "horizontal") {
    at::Tensor flip = at::rand({n}, seeds_.generator(), at::kDouble) < 0.5;
    y = at::where(flip.view({n, 1, 1, 1}), y.flip({1}), y);
  }
  return y;
}

Json layers::RandomFlipImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, random_flip_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(RandomFlip, layers::RandomFlipImpl);

// --- random affine layers -----------------------------------------------------------------
layers::RandomAffineLayer::RandomAffineLayer(const Json& base_config, const std::string& owner)
    : layers::ImageLayer(base_config, owner, /*random=*/true) {}

at::Tensor layers::RandomAffineLayer::uniform(int64_t n, double lower, double upper) {
  return at::rand({n}, seeds_.generator(), at::kDouble) * (upper - lower) + lower;
}

at::Tensor layers::RandomAffineLayer::transform(const at::Tensor& images, bool training) {
  at::Tensor t = draw(images.size(0), images.size(1), images.size(2));
  return affine_transform(images, t, interpolation_, fill_mode_, fill_value_);
}

namespace {
const FieldTable<layers::RandomTranslationOptions>& random_translation_fields() {
  using O = layers::RandomTranslationOptions;
  static const FieldTable<O> t =
      aug_affine_fields<O>() +
      FieldTable<O>{aug_factor_field("height_factor", &O::height_factor).required(kAugFactorExpected),
                    aug_factor_field("width_factor", &O::width_factor).required(kAugFactorExpected)};
  return t;
}
}  // namespace

layers::RandomTranslationOptions layers::RandomTranslationImpl::options_from_config(const Json& config) {
  return read_fields(config, "RandomTranslation", random_translation_fields());
}

layers::RandomTranslationImpl::RandomTranslationImpl(const layers::RandomTranslationOptions& o)
    : layers::RandomTranslationImpl(o, layer_base_config(o.base)) {}

layers::RandomTranslationImpl::RandomTranslationImpl(const Json& config)
    : layers::RandomTranslationImpl(options_from_config(config), config) {}

layers::RandomTranslationImpl::RandomTranslationImpl(const layers::RandomTranslationOptions& o, const Json& base_config)
    : layers::RandomAffineLayer(base_config, "RandomTranslation"), options_(o) {
  check_fields("RandomTranslation", options_, random_translation_fields());
  set_affine(options_);
  height_ = *aug_factor(options_.height_factor);
  width_ = *aug_factor(options_.width_factor);
}

at::Tensor layers::RandomTranslationImpl::draw(int64_t n, int64_t h, int64_t w) {
  at::Tensor dy = uniform(n, height_.first, height_.second) * (double)h;
  at::Tensor dx = uniform(n, width_.first, width_.second) * (double)w;
  at::Tensor one = at::ones({n}, at::kDouble), zero = at::zeros({n}, at::kDouble);
  return at::stack({one, zero, -dx, zero, one, -dy}, 1);
}

Json layers::RandomTranslationImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, random_translation_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(RandomTranslation, layers::RandomTranslationImpl);

namespace {
const FieldTable<layers::RandomRotationOptions>& random_rotation_fields() {
  using O = layers::RandomRotationOptions;
  static const FieldTable<O> t =
      aug_affine_fields<O>() + FieldTable<O>{aug_factor_field("factor", &O::factor).required(kAugFactorExpected)};
  return t;
}
}  // namespace

layers::RandomRotationOptions layers::RandomRotationImpl::options_from_config(const Json& config) {
  return read_fields(config, "RandomRotation", random_rotation_fields());
}

layers::RandomRotationImpl::RandomRotationImpl(const layers::RandomRotationOptions& o)
    : layers::RandomRotationImpl(o, layer_base_config(o.base)) {}

layers::RandomRotationImpl::RandomRotationImpl(const Json& config)
    : layers::RandomRotationImpl(options_from_config(config), config) {}

layers::RandomRotationImpl::RandomRotationImpl(const layers::RandomRotationOptions& o, const Json& base_config)
    : layers::RandomAffineLayer(base_config, "RandomRotation"), options_(o) {
  check_fields("RandomRotation", options_, random_rotation_fields());
  set_affine(options_);
  factor_ = *aug_factor(options_.factor);
  options_.factor = Json::array({factor_.first, factor_.second});  // written as the pair, as Keras does
}

at::Tensor layers::RandomRotationImpl::draw(int64_t n, int64_t h, int64_t w) {
  at::Tensor angle = uniform(n, factor_.first, factor_.second) * (2.0 * M_PI);
  at::Tensor cs = at::cos(angle), sn = at::sin(angle);
  const double hh = (double)(h - 1), ww = (double)(w - 1);
  at::Tensor x_off = (ww - (cs * ww - sn * hh)) / 2.0;
  at::Tensor y_off = (hh - (sn * ww + cs * hh)) / 2.0;
  return at::stack({cs, -sn, x_off, sn, cs, y_off}, 1);
}

Json layers::RandomRotationImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, random_rotation_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(RandomRotation, layers::RandomRotationImpl);

namespace {
const FieldTable<layers::RandomZoomOptions>& random_zoom_fields() {
  using O = layers::RandomZoomOptions;
  static const FieldTable<O> t =
      aug_affine_fields<O>() +
      FieldTable<O>{aug_factor_field("height_factor", &O::height_factor).required(kAugFactorExpected),
                    aug_factor_field("width_factor", &O::width_factor)};
  return t;
}
}  // namespace

layers::RandomZoomOptions layers::RandomZoomImpl::options_from_config(const Json& config) {
  return read_fields(config, "RandomZoom", random_zoom_fields());
}

layers::RandomZoomImpl::RandomZoomImpl(const layers::RandomZoomOptions& o)
    : layers::RandomZoomImpl(o, layer_base_config(o.base)) {}

layers::RandomZoomImpl::RandomZoomImpl(const Json& config)
    : layers::RandomZoomImpl(options_from_config(config), config) {}

layers::RandomZoomImpl::RandomZoomImpl(const layers::RandomZoomOptions& o, const Json& base_config)
    : layers::RandomAffineLayer(base_config, "RandomZoom"), options_(o) {
  check_fields("RandomZoom", options_, random_zoom_fields());
  set_affine(options_);
  height_ = *aug_factor(options_.height_factor);
  if (!options_.width_factor.is_null()) width_ = aug_factor(options_.width_factor);
}

at::Tensor layers::RandomZoomImpl::draw(int64_t n, int64_t h, int64_t w) {
  at::Tensor zy = 1.0 + uniform(n, height_.first, height_.second);
  at::Tensor zx = width_ ? 1.0 + uniform(n, width_->first, width_->second) : zy;
  at::Tensor zero = at::zeros({n}, at::kDouble);
  at::Tensor x_off = ((double)(w - 1) / 2.0) * (1.0 - zx);
  at::Tensor y_off = ((double)(h - 1) / 2.0) * (1.0 - zy);
  return at::stack({zx, zero, x_off, zero, zy, y_off}, 1);
}

Json layers::RandomZoomImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, random_zoom_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(RandomZoom, layers::RandomZoomImpl);

}  // namespace kiln
