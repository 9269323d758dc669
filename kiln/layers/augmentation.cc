#include "kiln/layers/augmentation.h"

#include <algorithm>
#include <cmath>

#include "kiln/layers/config_reader.h"
#include "kiln/layers/conv_utils.h"

namespace kiln {
namespace {

const std::vector<std::string> kAugFillModes = {"reflect", "wrap", "constant", "nearest"};

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
ImageLayer::ImageLayer(const Json& config, const std::string& owner) : SimpleLayer(config), owner_(owner) {}

void ImageLayer::read_common(ConfigReader& r, bool random) {
  random_ = random;
  channels_last_ = r.choice("data_format", "channels_last", {"channels_last", "channels_first"}) == "channels_last";
  if (random_) seeds_ = SeedGenerator::from_config(r);
}

at::Tensor ImageLayer::call1(const at::Tensor& x_in, bool training) {
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

std::vector<Shape> ImageLayer::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  const Shape& s = input_shapes.at(0);
  if (s.size() != 3 && s.size() != 4)
    throw ShapeError(owner_ + " '" + name() + "' expects images (batch, height, width, channels). Received shape " +
                     shape_to_string(s));
  return input_shapes;
}

Json ImageLayer::get_config() const {
  Json j = base_config();
  j["data_format"] = channels_last_ ? "channels_last" : "channels_first";
  if (random_) j["seed"] = seeds_.to_json();
  return j;
}

// --- Resizing -------------------------------------------------------------------------
Resizing::Resizing(const Json& config) : ImageLayer(config, "Resizing") {
  ConfigReader r(config, "Resizing");
  height_ = r.positive_int("height");
  width_ = r.positive_int("width");
  interpolation_ = r.choice("interpolation", "bilinear", {"bilinear", "nearest"});
  crop_ = r.boolean("crop_to_aspect_ratio", false);
  pad_ = r.boolean("pad_to_aspect_ratio", false);
  if (crop_ && pad_)
    throw ValueError("Resizing: only one of `crop_to_aspect_ratio` and `pad_to_aspect_ratio` can be true");
  r.choice("fill_mode", "constant", {"constant"});
  fill_value_ = r.number("fill_value", 0.0);
  if (r.boolean("antialias", false)) r.invalid("antialias", "false (kiln resizes without antialiasing)");
  read_common(r, false);
  r.finish();
}

Resizing::Resizing(int64_t height, int64_t width, const Json& extra)
    : Resizing(merged_config(extra, Json{{"height", height}, {"width", width}})) {}

at::Tensor Resizing::transform(const at::Tensor& images_in, bool training) {
  at::Tensor images = images_in;
  int64_t h = images.size(1), w = images.size(2);
  if (crop_) {
    // Keras's centred crop box of the target aspect ratio.
    int64_t ch = std::max<int64_t>(std::min<int64_t>(h, (int64_t)((double)(w * height_) / width_)), 1);
    int64_t cw = std::max<int64_t>(std::min<int64_t>(w, (int64_t)((double)(h * width_) / height_)), 1);
    int64_t hs = (int64_t)((double)(h - ch) / 2), ws = (int64_t)((double)(w - cw) / 2);
    images = images.slice(1, hs, hs + ch).slice(2, ws, ws + cw);
  } else if (pad_) {
    int64_t ph = std::max<int64_t>(h, (int64_t)((double)(w * height_) / width_));
    int64_t pw = std::max<int64_t>(w, (int64_t)((double)(h * width_) / height_));
    int64_t hs = (int64_t)((double)(ph - h) / 2), ws = (int64_t)((double)(pw - w) / 2);
    images = at::constant_pad_nd(images, {0, 0, ws, pw - w - ws, hs, ph - h - hs}, fill_value_);
  }
  h = images.size(1);
  w = images.size(2);
  if (interpolation_ == "nearest") {
    // Half-pixel centres: source floor((i + 0.5) * in / out).
    auto source = [&](int64_t out, int64_t in) {
      at::Tensor i = at::arange(out, at::kDouble);
      return at::clamp_max(at::floor((i + 0.5) * ((double)in / out)), (double)(in - 1)).to(at::kLong);
    };
    return images.index_select(1, source(height_, h)).index_select(2, source(width_, w));
  }
  const at::ScalarType dt = images.scalar_type();
  at::Tensor cf = conv_utils::channels_last_to_first(images).to(at::promote_types(dt, at::kFloat));
  at::Tensor y = at::upsample_bilinear2d(cf, {height_, width_}, /*align_corners=*/false);
  return conv_utils::channels_first_to_last(y).to(dt);
}

std::vector<Shape> Resizing::compute_output_shape(const std::vector<Shape>& input_shapes) {
  Shape s = ImageLayer::compute_output_shape(input_shapes).at(0);
  const int hdim = (int)s.size() - (channels_last_ ? 3 : 2);
  s[hdim] = height_;
  s[hdim + 1] = width_;
  return {s};
}

Json Resizing::get_config() const {
  Json j = ImageLayer::get_config();
  j["height"] = height_;
  j["width"] = width_;
  j["interpolation"] = interpolation_;
  j["crop_to_aspect_ratio"] = crop_;
  j["pad_to_aspect_ratio"] = pad_;
  j["fill_mode"] = "constant";
  j["fill_value"] = fill_value_;
  j["antialias"] = false;
  return j;
}

KILN_REGISTER_LAYER(Resizing);

// --- RandomFlip -------------------------------------------------------------------------
RandomFlip::RandomFlip(const Json& config) : ImageLayer(config, "RandomFlip") {
  ConfigReader r(config, "RandomFlip");
  mode_ = r.choice("mode", "horizontal_and_vertical", {"horizontal", "vertical", "horizontal_and_vertical"});
  read_common(r, true);
  r.finish();
}

at::Tensor RandomFlip::transform(const at::Tensor& images, bool training) {
  const int64_t n = images.size(0);
  at::Tensor y = images;
  if (mode_ != "vertical") {
    at::Tensor flip = at::rand({n}, seeds_.generator(), at::kDouble) < 0.5;
    y = at::where(flip.view({n, 1, 1, 1}), y.flip({2}), y);
  }
  if (mode_ != "horizontal") {
    at::Tensor flip = at::rand({n}, seeds_.generator(), at::kDouble) < 0.5;
    y = at::where(flip.view({n, 1, 1, 1}), y.flip({1}), y);
  }
  return y;
}

Json RandomFlip::get_config() const {
  Json j = ImageLayer::get_config();
  j["mode"] = mode_;
  return j;
}

KILN_REGISTER_LAYER(RandomFlip);

// --- random affine layers -----------------------------------------------------------------
RandomAffineLayer::RandomAffineLayer(const Json& config, const std::string& owner) : ImageLayer(config, owner) {}

std::pair<double, double> RandomAffineLayer::read_factor(ConfigReader& r, const char* key, double lo, double hi) {
  const Json* j = r.get(key);
  const std::string expected =
      "a number or a list of two numbers, each between " + Json(lo).dump() + " and " + Json(hi).dump();
  if (!j) throw ValueError(owner_ + ": the config is missing `" + key + "` (" + expected + ")");
  std::pair<double, double> f;
  // Keras: a number f means (-|f|, |f|); a pair is sorted.
  if (j->is_number())
    f = {-std::abs(j->get<double>()), std::abs(j->get<double>())};
  else if (j->is_array() && j->size() == 2 && (*j)[0].is_number() && (*j)[1].is_number())
    f = std::minmax({(*j)[0].get<double>(), (*j)[1].get<double>()});
  else
    r.invalid(key, expected);
  const double raw_lo = j->is_number() ? j->get<double>() : f.first;
  if (!(f.first >= lo && f.second <= hi && raw_lo >= lo)) r.invalid(key, expected);
  return f;
}

void RandomAffineLayer::read_fill(ConfigReader& r) {
  fill_mode_ = r.choice("fill_mode", "reflect", kAugFillModes);
  interpolation_ = r.choice("interpolation", "bilinear", {"bilinear", "nearest"});
  fill_value_ = r.number("fill_value", 0.0);
  read_common(r, true);
}

at::Tensor RandomAffineLayer::uniform(int64_t n, double lower, double upper) {
  return at::rand({n}, seeds_.generator(), at::kDouble) * (upper - lower) + lower;
}

at::Tensor RandomAffineLayer::transform(const at::Tensor& images, bool training) {
  at::Tensor t = draw(images.size(0), images.size(1), images.size(2));
  return affine_transform(images, t, interpolation_, fill_mode_, fill_value_);
}

Json RandomAffineLayer::get_config() const {
  Json j = ImageLayer::get_config();
  j["fill_mode"] = fill_mode_;
  j["interpolation"] = interpolation_;
  j["fill_value"] = fill_value_;
  return j;
}

RandomTranslation::RandomTranslation(const Json& config) : RandomAffineLayer(config, "RandomTranslation") {
  ConfigReader r(config, "RandomTranslation");
  height_json_ = r.has("height_factor") ? config["height_factor"] : Json(nullptr);
  width_json_ = r.has("width_factor") ? config["width_factor"] : Json(nullptr);
  height_ = read_factor(r, "height_factor", -1.0, 1.0);
  width_ = read_factor(r, "width_factor", -1.0, 1.0);
  read_fill(r);
  r.finish();
}

at::Tensor RandomTranslation::draw(int64_t n, int64_t h, int64_t w) {
  at::Tensor dy = uniform(n, height_.first, height_.second) * (double)h;
  at::Tensor dx = uniform(n, width_.first, width_.second) * (double)w;
  at::Tensor one = at::ones({n}, at::kDouble), zero = at::zeros({n}, at::kDouble);
  return at::stack({one, zero, -dx, zero, one, -dy}, 1);
}

Json RandomTranslation::get_config() const {
  Json j = RandomAffineLayer::get_config();
  j["height_factor"] = height_json_;
  j["width_factor"] = width_json_;
  return j;
}

KILN_REGISTER_LAYER(RandomTranslation);

RandomRotation::RandomRotation(const Json& config) : RandomAffineLayer(config, "RandomRotation") {
  ConfigReader r(config, "RandomRotation");
  factor_ = read_factor(r, "factor", -1.0, 1.0);
  read_fill(r);
  r.finish();
}

at::Tensor RandomRotation::draw(int64_t n, int64_t h, int64_t w) {
  at::Tensor angle = uniform(n, factor_.first, factor_.second) * (2.0 * M_PI);
  at::Tensor cs = at::cos(angle), sn = at::sin(angle);
  const double hh = (double)(h - 1), ww = (double)(w - 1);
  at::Tensor x_off = (ww - (cs * ww - sn * hh)) / 2.0;
  at::Tensor y_off = (hh - (sn * ww + cs * hh)) / 2.0;
  return at::stack({cs, -sn, x_off, sn, cs, y_off}, 1);
}

Json RandomRotation::get_config() const {
  Json j = RandomAffineLayer::get_config();
  j["factor"] = Json::array({factor_.first, factor_.second});  // Keras writes the (lower, upper) pair
  return j;
}

KILN_REGISTER_LAYER(RandomRotation);

RandomZoom::RandomZoom(const Json& config) : RandomAffineLayer(config, "RandomZoom") {
  ConfigReader r(config, "RandomZoom");
  height_json_ = r.has("height_factor") ? config["height_factor"] : Json(nullptr);
  width_json_ = r.has("width_factor") ? config["width_factor"] : Json(nullptr);
  height_ = read_factor(r, "height_factor", -1.0, 1.0);
  if (r.has("width_factor"))
    width_ = read_factor(r, "width_factor", -1.0, 1.0);
  else
    r.get("width_factor");
  read_fill(r);
  r.finish();
}

at::Tensor RandomZoom::draw(int64_t n, int64_t h, int64_t w) {
  at::Tensor zy = 1.0 + uniform(n, height_.first, height_.second);
  at::Tensor zx = width_ ? 1.0 + uniform(n, width_->first, width_->second) : zy;
  at::Tensor zero = at::zeros({n}, at::kDouble);
  at::Tensor x_off = ((double)(w - 1) / 2.0) * (1.0 - zx);
  at::Tensor y_off = ((double)(h - 1) / 2.0) * (1.0 - zy);
  return at::stack({zx, zero, x_off, zero, zy, y_off}, 1);
}

Json RandomZoom::get_config() const {
  Json j = RandomAffineLayer::get_config();
  j["height_factor"] = height_json_;
  j["width_factor"] = width_json_;
  return j;
}

KILN_REGISTER_LAYER(RandomZoom);

}  // namespace kiln
