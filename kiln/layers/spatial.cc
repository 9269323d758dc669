#include "kiln/layers/spatial.h"

#include <algorithm>

#include "kiln/layers/config_reader.h"
#include "kiln/layers/conv_utils.h"

namespace kiln {
namespace {

bool spatial_channels_last(ConfigReader& r) {
  return r.choice("data_format", "channels_last", {"channels_last", "channels_first"}) == "channels_last";
}

// int | [h, w] | [[top, bottom], [left, right]], each non-negative.
Margins2D spatial_margins(ConfigReader& r, const char* key, int64_t fallback) {
  const std::string expected =
      "a non-negative int, a list of 2 non-negative ints, or a list of 2 lists of 2 non-negative ints";
  const Json* j = r.get(key);
  Margins2D m{};
  auto as_int = [&](const Json& e) {
    if (!e.is_number_integer() || e.get<int64_t>() < 0) r.invalid(key, expected);
    return e.get<int64_t>();
  };
  if (!j) {
    m = {{{fallback, fallback}, {fallback, fallback}}};
  } else if (j->is_number()) {
    int64_t v = as_int(*j);
    m = {{{v, v}, {v, v}}};
  } else if (j->is_array() && j->size() == 2) {
    for (int i = 0; i < 2; ++i) {
      const Json& e = (*j)[i];
      if (e.is_array()) {
        if (e.size() != 2) r.invalid(key, expected);
        m[i] = {as_int(e[0]), as_int(e[1])};
      } else {
        int64_t v = as_int(e);
        m[i] = {v, v};
      }
    }
  } else {
    r.invalid(key, expected);
  }
  return m;
}

Json spatial_margins_json(const Margins2D& m) {
  return Json::array({Json::array({m[0][0], m[0][1]}), Json::array({m[1][0], m[1][1]})});
}

void spatial_check_rank4(const Layer& l, const at::Tensor& x) {
  if (x.dim() != 4)
    throw ShapeError(l.class_name() + " '" + l.name() + "' expects 4-D image batches. Received shape " +
                     shape_to_string(sizes_of(x)));
}

void spatial_check_rank4(const Layer& l, const Shape& s) {
  if (s.size() != 4)
    throw ShapeError(l.class_name() + " '" + l.name() + "' expects 4-D image batches. Received shape " +
                     shape_to_string(s));
}

int64_t spatial_mul(int64_t n, int64_t k) { return n < 0 ? kNone : n * k; }
int64_t spatial_add(int64_t n, int64_t k) { return n < 0 ? kNone : n + k; }

}  // namespace

// --- UpSampling2D --------------------------------------------------------------
UpSampling2D::UpSampling2D(const Json& config) : SimpleLayer(config) {
  ConfigReader r(config, "UpSampling2D");
  size_ = r.int_tuple("size", 2, {2, 2});
  channels_last_ = spatial_channels_last(r);
  interpolation_ = r.choice("interpolation", "nearest", {"nearest", "bilinear"});
  r.finish();
}

at::Tensor UpSampling2D::call1(const at::Tensor& x, bool training) {
  spatial_check_rank4(*this, x);
  at::Tensor t = channels_last_ ? conv_utils::channels_last_to_first(x) : x;
  at::Tensor y;
  if (interpolation_ == "nearest") {
    y = t.repeat_interleave(size_[0], 2).repeat_interleave(size_[1], 3);
  } else {
    // Half-pixel centres with scale in/out, as TensorFlow's resize.
    y = at::upsample_bilinear2d(t, {t.size(2) * size_[0], t.size(3) * size_[1]}, /*align_corners=*/false);
  }
  return channels_last_ ? conv_utils::channels_first_to_last(y).contiguous() : y;
}

std::vector<Shape> UpSampling2D::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  Shape s = input_shapes.at(0);
  spatial_check_rank4(*this, s);
  const int h = channels_last_ ? 1 : 2;
  s[h] = spatial_mul(s[h], size_[0]);
  s[h + 1] = spatial_mul(s[h + 1], size_[1]);
  return {s};
}

Json UpSampling2D::get_config() const {
  Json j = base_config();
  j["size"] = size_;
  j["data_format"] = channels_last_ ? "channels_last" : "channels_first";
  j["interpolation"] = interpolation_;
  return j;
}

KILN_REGISTER_LAYER(UpSampling2D);

// --- ZeroPadding2D -------------------------------------------------------------
ZeroPadding2D::ZeroPadding2D(const Json& config) : SimpleLayer(config) {
  ConfigReader r(config, "ZeroPadding2D");
  padding_ = spatial_margins(r, "padding", 1);
  channels_last_ = spatial_channels_last(r);
  r.finish();
}

at::Tensor ZeroPadding2D::call1(const at::Tensor& x, bool training) {
  spatial_check_rank4(*this, x);
  // constant_pad_nd pads the last axes first: (left, right, top, bottom).
  std::vector<int64_t> pad = {padding_[1][0], padding_[1][1], padding_[0][0], padding_[0][1]};
  if (channels_last_) pad.insert(pad.begin(), {0, 0});
  return at::constant_pad_nd(x, pad, 0.0);
}

std::vector<Shape> ZeroPadding2D::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  Shape s = input_shapes.at(0);
  spatial_check_rank4(*this, s);
  const int h = channels_last_ ? 1 : 2;
  s[h] = spatial_add(s[h], padding_[0][0] + padding_[0][1]);
  s[h + 1] = spatial_add(s[h + 1], padding_[1][0] + padding_[1][1]);
  return {s};
}

Json ZeroPadding2D::get_config() const {
  Json j = base_config();
  j["padding"] = spatial_margins_json(padding_);
  j["data_format"] = channels_last_ ? "channels_last" : "channels_first";
  return j;
}

KILN_REGISTER_LAYER(ZeroPadding2D);

// --- Cropping2D ----------------------------------------------------------------
Cropping2D::Cropping2D(const Json& config) : SimpleLayer(config) {
  ConfigReader r(config, "Cropping2D");
  cropping_ = spatial_margins(r, "cropping", 0);
  channels_last_ = spatial_channels_last(r);
  r.finish();
}

at::Tensor Cropping2D::call1(const at::Tensor& x, bool training) {
  spatial_check_rank4(*this, x);
  const int h = channels_last_ ? 1 : 2;
  for (int i = 0; i < 2; ++i)
    if (cropping_[i][0] + cropping_[i][1] >= x.size(h + i))
      throw ShapeError("Cropping2D '" + name() + "': cropping " + spatial_margins_json(cropping_).dump() +
                       " leaves nothing of inputs of shape " + shape_to_string(sizes_of(x)));
  return x.slice(h, cropping_[0][0], x.size(h) - cropping_[0][1])
      .slice(h + 1, cropping_[1][0], x.size(h + 1) - cropping_[1][1]);
}

std::vector<Shape> Cropping2D::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  Shape s = input_shapes.at(0);
  spatial_check_rank4(*this, s);
  const int h = channels_last_ ? 1 : 2;
  for (int i = 0; i < 2; ++i) {
    if (s[h + i] < 0) continue;
    s[h + i] -= cropping_[i][0] + cropping_[i][1];
    if (s[h + i] < 1)
      throw ShapeError("Cropping2D '" + name() + "': cropping " + spatial_margins_json(cropping_).dump() +
                       " leaves nothing of inputs of shape " + shape_to_string(input_shapes.at(0)));
  }
  return {s};
}

Json Cropping2D::get_config() const {
  Json j = base_config();
  j["cropping"] = spatial_margins_json(cropping_);
  j["data_format"] = channels_last_ ? "channels_last" : "channels_first";
  return j;
}

KILN_REGISTER_LAYER(Cropping2D);

// --- Permute ------------------------------------------------------------------------
Permute::Permute(const Json& config) : SimpleLayer(config) {
  ConfigReader r(config, "Permute");
  const Json* d = r.get("dims");
  const std::string expected = "a permutation of 1..rank-1 (1-based axes after the batch axis)";
  if (!d) throw ValueError("Permute: the config is missing `dims` (e.g. [2, 1])");
  if (!d->is_array() || d->empty()) r.invalid("dims", expected);
  for (auto& e : *d) {
    if (!e.is_number_integer()) r.invalid("dims", expected);
    dims_.push_back(e.get<int64_t>());
  }
  std::vector<int64_t> sorted = dims_;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i)
    if (sorted[i] != (int64_t)i + 1) r.invalid("dims", expected);
  r.finish();
}

Permute::Permute(const std::vector<int64_t>& dims, const Json& extra)
    : Permute(merged_config(extra, Json{{"dims", dims}})) {}

void Permute::check_rank(int64_t rank) const {
  if (rank != (int64_t)dims_.size() + 1)
    throw ShapeError("Permute '" + name() + "': dims=" + int_list_json(dims_).dump() + " needs inputs of rank " +
                     std::to_string(dims_.size() + 1) + ". Received rank " + std::to_string(rank));
}

at::Tensor Permute::call1(const at::Tensor& x, bool training) {
  check_rank(x.dim());
  std::vector<int64_t> perm = {0};
  perm.insert(perm.end(), dims_.begin(), dims_.end());
  return x.permute(perm);
}

std::vector<Shape> Permute::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  const Shape& s = input_shapes.at(0);
  check_rank((int64_t)s.size());
  Shape out = {s[0]};
  for (auto d : dims_) out.push_back(s[d]);
  return {out};
}

Json Permute::get_config() const {
  Json j = base_config();
  j["dims"] = dims_;
  return j;
}

KILN_REGISTER_LAYER(Permute);

// --- RepeatVector -------------------------------------------------------------------
RepeatVector::RepeatVector(const Json& config) : SimpleLayer(config) {
  ConfigReader r(config, "RepeatVector");
  n_ = r.positive_int("n");
  r.finish();
}

RepeatVector::RepeatVector(int64_t n, const Json& extra) : RepeatVector(merged_config(extra, Json{{"n", n}})) {}

at::Tensor RepeatVector::call1(const at::Tensor& x, bool training) {
  if (x.dim() != 2)
    throw ShapeError("RepeatVector '" + name() + "' expects inputs of shape (batch, features). Received " +
                     shape_to_string(sizes_of(x)));
  return x.unsqueeze(1).expand({x.size(0), n_, x.size(1)}).contiguous();
}

std::vector<Shape> RepeatVector::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  const Shape& s = input_shapes.at(0);
  if (s.size() != 2)
    throw ShapeError("RepeatVector '" + name() + "' expects inputs of shape (batch, features). Received " +
                     shape_to_string(s));
  return {{s[0], n_, s[1]}};
}

Json RepeatVector::get_config() const {
  Json j = base_config();
  j["n"] = n_;
  return j;
}

KILN_REGISTER_LAYER(RepeatVector);

}  // namespace kiln
