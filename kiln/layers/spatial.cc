#include "kiln/layers/spatial.h"

#include <algorithm>

#include "kiln/layers/config_fields.h"
#include "kiln/layers/conv_utils.h"

namespace kiln {
namespace {

const char kMarginsExpected[] =
    "a non-negative int, a list of 2 non-negative ints, or a list of 2 lists of 2 non-negative ints";

// int | [h, w] | [[top, bottom], [left, right]], each non-negative.
Margins2D spatial_margins(ConfigReader& r, const char* key, const Json& j) {
  Margins2D m{};
  auto as_int = [&](const Json& e) {
    if (!e.is_number_integer() || e.get<int64_t>() < 0) r.invalid(key, kMarginsExpected);
    return e.get<int64_t>();
  };
  if (j.is_number()) {
    int64_t v = as_int(j);
    m = {{{v, v}, {v, v}}};
  } else if (j.is_array() && j.size() == 2) {
    for (int i = 0; i < 2; ++i) {
      const Json& e = j[i];
      if (e.is_array()) {
        if (e.size() != 2) r.invalid(key, kMarginsExpected);
        m[i] = {as_int(e[0]), as_int(e[1])};
      } else {
        int64_t v = as_int(e);
        m[i] = {v, v};
      }
    }
  } else {
    r.invalid(key, kMarginsExpected);
  }
  return m;
}

Json spatial_margins_json(const Margins2D& m) {
  return Json::array({Json::array({m[0][0], m[0][1]}), Json::array({m[1][0], m[1][1]})});
}

// ZeroPadding2D's padding, Cropping2D's cropping: any form above, written
// as [[top, bottom], [left, right]].
template <class O>
FieldDef<O> margins_field(const char* key, Margins2D O::*member) {
  auto read = [=](ConfigReader& r, O& o) {
    if (const Json* j = r.get(key)) o.*member = spatial_margins(r, key, *j);
  };
  auto check = [=](const std::string& owner, O& o) {
    for (const auto& side : o.*member)
      for (int64_t v : side)
        if (v < 0) option_check::invalid(owner, key, kMarginsExpected, spatial_margins_json(o.*member));
  };
  return FieldDef<O>{key, read, check, [=](Json& j, const O& o) { j[key] = spatial_margins_json(o.*member); }};
}

template <class O>
Field<O, std::string> data_format_field() {
  return field("data_format", &O::data_format).choice({"channels_last", "channels_first"});
}

const FieldTable<layers::UpSampling2DOptions>& up_sampling_fields() {
  using O = layers::UpSampling2DOptions;
  static const FieldTable<O> t = {field("size", &O::size).tuple(2), data_format_field<O>(),
                                  field("interpolation", &O::interpolation).choice({"nearest", "bilinear"})};
  return t;
}

const FieldTable<layers::ZeroPadding2DOptions>& zero_padding_fields() {
  using O = layers::ZeroPadding2DOptions;
  static const FieldTable<O> t = {margins_field("padding", &O::padding), data_format_field<O>()};
  return t;
}

const FieldTable<layers::Cropping2DOptions>& cropping_fields() {
  using O = layers::Cropping2DOptions;
  static const FieldTable<O> t = {margins_field("cropping", &O::cropping), data_format_field<O>()};
  return t;
}

const FieldTable<layers::PermuteOptions>& permute_fields() {
  static const FieldTable<layers::PermuteOptions> t = {int_list_field<layers::PermuteOptions>(
      "dims", &layers::PermuteOptions::dims,
      [](const std::vector<int64_t>& dims) {
        std::vector<int64_t> sorted = dims;
        std::sort(sorted.begin(), sorted.end());
        for (size_t i = 0; i < sorted.size(); ++i)
          if (sorted[i] != (int64_t)i + 1) return false;
        return !sorted.empty();
      },
      "a permutation of 1..rank-1 (1-based axes after the batch axis)", "e.g. [2, 1]")};
  return t;
}

const FieldTable<layers::RepeatVectorOptions>& repeat_vector_fields() {
  static const FieldTable<layers::RepeatVectorOptions> t = {
      field("n", &layers::RepeatVectorOptions::n).positive().required()};
  return t;
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
layers::UpSampling2DOptions layers::UpSampling2DImpl::options_from_config(const Json& config) {
  return read_fields(config, "UpSampling2D", up_sampling_fields());
}

layers::UpSampling2DImpl::UpSampling2DImpl(const layers::UpSampling2DOptions& o)
    : layers::UpSampling2DImpl(o, layer_base_config(o.base)) {}

layers::UpSampling2DImpl::UpSampling2DImpl(const Json& config)
    : layers::UpSampling2DImpl(options_from_config(config), config) {}

layers::UpSampling2DImpl::UpSampling2DImpl(const layers::UpSampling2DOptions& o, const Json& base_config)
    : SimpleLayer(base_config), options_(o) {
  check_fields("UpSampling2D", options_, up_sampling_fields());
  channels_last_ = options_.data_format == "channels_last";
}

at::Tensor layers::UpSampling2DImpl::call1(const at::Tensor& x, bool training) {
  spatial_check_rank4(*this, x);
  at::Tensor t = channels_last_ ? conv_utils::channels_last_to_first(x) : x;
  at::Tensor y;
  if (options_.interpolation == "nearest") {
    y = t.repeat_interleave(options_.size[0], 2).repeat_interleave(options_.size[1], 3);
  } else {
    // Half-pixel centres with scale in/out, as TensorFlow's resize.
    y = at::upsample_bilinear2d(t, {t.size(2) * options_.size[0], t.size(3) * options_.size[1]},
                                /*align_corners=*/false);
  }
  return channels_last_ ? conv_utils::channels_first_to_last(y).contiguous() : y;
}

std::vector<Shape> layers::UpSampling2DImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  Shape s = input_shapes.at(0);
  spatial_check_rank4(*this, s);
  const int h = channels_last_ ? 1 : 2;
  s[h] = spatial_mul(s[h], options_.size[0]);
  s[h + 1] = spatial_mul(s[h + 1], options_.size[1]);
  return {s};
}

Json layers::UpSampling2DImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, up_sampling_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(UpSampling2D, layers::UpSampling2DImpl);

// --- ZeroPadding2D -------------------------------------------------------------
layers::ZeroPadding2DOptions layers::ZeroPadding2DImpl::options_from_config(const Json& config) {
  return read_fields(config, "ZeroPadding2D", zero_padding_fields());
}

layers::ZeroPadding2DImpl::ZeroPadding2DImpl(const layers::ZeroPadding2DOptions& o)
    : layers::ZeroPadding2DImpl(o, layer_base_config(o.base)) {}

layers::ZeroPadding2DImpl::ZeroPadding2DImpl(const Json& config)
    : layers::ZeroPadding2DImpl(options_from_config(config), config) {}

layers::ZeroPadding2DImpl::ZeroPadding2DImpl(const layers::ZeroPadding2DOptions& o, const Json& base_config)
    : SimpleLayer(base_config), options_(o) {
  check_fields("ZeroPadding2D", options_, zero_padding_fields());
  channels_last_ = options_.data_format == "channels_last";
}

at::Tensor layers::ZeroPadding2DImpl::call1(const at::Tensor& x, bool training) {
  spatial_check_rank4(*this, x);
  // constant_pad_nd pads the last axes first: (left, right, top, bottom).
  std::vector<int64_t> pad = {options_.padding[1][0], options_.padding[1][1], options_.padding[0][0],
                              options_.padding[0][1]};
  if (channels_last_) pad.insert(pad.begin(), {0, 0});
  return at::constant_pad_nd(x, pad, 0.0);
}

std::vector<Shape> layers::ZeroPadding2DImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  Shape s = input_shapes.at(0);
  spatial_check_rank4(*this, s);
  const int h = channels_last_ ? 1 : 2;
  s[h] = spatial_add(s[h], options_.padding[0][0] + options_.padding[0][1]);
  s[h + 1] = spatial_add(s[h + 1], options_.padding[1][0] + options_.padding[1][1]);
  return {s};
}

Json layers::ZeroPadding2DImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, zero_padding_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(ZeroPadding2D, layers::ZeroPadding2DImpl);

// --- Cropping2D ----------------------------------------------------------------
layers::Cropping2DOptions layers::Cropping2DImpl::options_from_config(const Json& config) {
  return read_fields(config, "Cropping2D", cropping_fields());
}

layers::Cropping2DImpl::Cropping2DImpl(const layers::Cropping2DOptions& o)
    : layers::Cropping2DImpl(o, layer_base_config(o.base)) {}

layers::Cropping2DImpl::Cropping2DImpl(const Json& config)
    : layers::Cropping2DImpl(options_from_config(config), config) {}

layers::Cropping2DImpl::Cropping2DImpl(const layers::Cropping2DOptions& o, const Json& base_config)
    : SimpleLayer(base_config), options_(o) {
  check_fields("Cropping2D", options_, cropping_fields());
  channels_last_ = options_.data_format == "channels_last";
}

at::Tensor layers::Cropping2DImpl::call1(const at::Tensor& x, bool training) {
  spatial_check_rank4(*this, x);
  const int h = channels_last_ ? 1 : 2;
  for (int i = 0; i < 2; ++i)
    if (options_.cropping[i][0] + options_.cropping[i][1] >= x.size(h + i))
      throw ShapeError("Cropping2D '" + name() + "': cropping " + spatial_margins_json(options_.cropping).dump() +
                       " leaves nothing of inputs of shape " + shape_to_string(sizes_of(x)));
  return x.slice(h, options_.cropping[0][0], x.size(h) - options_.cropping[0][1])
      .slice(h + 1, options_.cropping[1][0], x.size(h + 1) - options_.cropping[1][1]);
}

std::vector<Shape> layers::Cropping2DImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  Shape s = input_shapes.at(0);
  spatial_check_rank4(*this, s);
  const int h = channels_last_ ? 1 : 2;
  for (int i = 0; i < 2; ++i) {
    if (s[h + i] < 0) continue;
    s[h + i] -= options_.cropping[i][0] + options_.cropping[i][1];
    if (s[h + i] < 1)
      throw ShapeError("Cropping2D '" + name() + "': cropping " + spatial_margins_json(options_.cropping).dump() +
                       " leaves nothing of inputs of shape " + shape_to_string(input_shapes.at(0)));
  }
  return {s};
}

Json layers::Cropping2DImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, cropping_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(Cropping2D, layers::Cropping2DImpl);

// --- Permute ------------------------------------------------------------------------
layers::PermuteOptions layers::PermuteImpl::options_from_config(const Json& config) {
  return read_fields(config, "Permute", permute_fields());
}

layers::PermuteImpl::PermuteImpl(const layers::PermuteOptions& o) : layers::PermuteImpl(o, layer_base_config(o.base)) {}

layers::PermuteImpl::PermuteImpl(const Json& config) : layers::PermuteImpl(options_from_config(config), config) {}

layers::PermuteImpl::PermuteImpl(const layers::PermuteOptions& o, const Json& base_config)
    : SimpleLayer(base_config), options_(o) {
  check_fields("Permute", options_, permute_fields());
}

layers::PermuteImpl::PermuteImpl(const std::vector<int64_t>& dims, const Json& extra)
    : layers::PermuteImpl(merged_config(extra, Json{{"dims", dims}})) {}

void layers::PermuteImpl::check_rank(int64_t rank) const {
  if (rank != (int64_t)options_.dims.size() + 1)
    throw ShapeError("Permute '" + name() + "': dims=" + int_list_json(options_.dims).dump() +
                     " needs inputs of rank " + std::to_string(options_.dims.size() + 1) + ". Received rank " +
                     std::to_string(rank));
}

at::Tensor layers::PermuteImpl::call1(const at::Tensor& x, bool training) {
  check_rank(x.dim());
  std::vector<int64_t> perm = {0};
  perm.insert(perm.end(), options_.dims.begin(), options_.dims.end());
  return x.permute(perm);
}

std::vector<Shape> layers::PermuteImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  const Shape& s = input_shapes.at(0);
  check_rank((int64_t)s.size());
  Shape out = {s[0]};
  for (auto d : options_.dims) out.push_back(s[d]);
  return {out};
}

Json layers::PermuteImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, permute_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(Permute, layers::PermuteImpl);

// --- RepeatVector -------------------------------------------------------------------
layers::RepeatVectorOptions layers::RepeatVectorImpl::options_from_config(const Json& config) {
  return read_fields(config, "RepeatVector", repeat_vector_fields());
}

layers::RepeatVectorImpl::RepeatVectorImpl(const layers::RepeatVectorOptions& o)
    : layers::RepeatVectorImpl(o, layer_base_config(o.base)) {}

layers::RepeatVectorImpl::RepeatVectorImpl(const Json& config)
    : layers::RepeatVectorImpl(options_from_config(config), config) {}

layers::RepeatVectorImpl::RepeatVectorImpl(const layers::RepeatVectorOptions& o, const Json& base_config)
    : SimpleLayer(base_config), options_(o) {
  check_fields("RepeatVector", options_, repeat_vector_fields());
}

layers::RepeatVectorImpl::RepeatVectorImpl(int64_t n, const Json& extra)
    : layers::RepeatVectorImpl(merged_config(extra, Json{{"n", n}})) {}

at::Tensor layers::RepeatVectorImpl::call1(const at::Tensor& x, bool training) {
  if (x.dim() != 2)
    throw ShapeError("RepeatVector '" + name() + "' expects inputs of shape (batch, features). Received " +
                     shape_to_string(sizes_of(x)));
  return x.unsqueeze(1).expand({x.size(0), options_.n, x.size(1)}).contiguous();
}

std::vector<Shape> layers::RepeatVectorImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  const Shape& s = input_shapes.at(0);
  if (s.size() != 2)
    throw ShapeError("RepeatVector '" + name() + "' expects inputs of shape (batch, features). Received " +
                     shape_to_string(s));
  return {{s[0], options_.n, s[1]}};
}

Json layers::RepeatVectorImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, repeat_vector_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(RepeatVector, layers::RepeatVectorImpl);

}  // namespace kiln
