#include "kiln/layers/pooling.h"

#include <limits>

#include "kiln/layers/config_fields.h"
#include "kiln/layers/conv_utils.h"

namespace kiln {
namespace {

Json pooling_config(const Json& extra, const std::vector<int64_t>& pool_size, const std::vector<int64_t>& strides,
                    const std::string& padding) {
  return merged_config(extra, Json{{"pool_size", pool_size},
                                   {"strides", strides.empty() ? Json(nullptr) : Json(strides)},
                                   {"padding", padding}});
}

const FieldTable<layers::PoolingOptions>& pooling_fields(int rank) {
  using O = layers::PoolingOptions;
  auto table = [](int rank) {
    const char* strides = "strides";
    // Absent, null or empty: the pool size (read before it).
    FieldDef<O> strides_field{
        strides, [=](ConfigReader& r, O& o) { o.strides = r.int_tuple(strides, rank, o.pool_size); },
        [=](const std::string& owner, O& o) {
          o.strides = o.strides.empty() ? o.pool_size : option_check::tuple(owner, strides, o.strides, rank);
        },
        [=](Json& j, const O& o) { j[strides] = o.strides; }};
    return FieldTable<O>{field("pool_size", &O::pool_size).tuple(rank),
                         field("padding", &O::padding).choice({"valid", "same"}), strides_field,
                         field("data_format", &O::data_format).choice({"channels_last", "channels_first"})};
  };
  static const FieldTable<O> t1 = table(1), t2 = table(2);
  return rank == 1 ? t1 : t2;
}

const FieldTable<layers::GlobalPoolingOptions>& global_pooling_fields() {
  using O = layers::GlobalPoolingOptions;
  static const FieldTable<O> t = {field("data_format", &O::data_format).choice({"channels_last", "channels_first"}),
                                  field("keepdims", &O::keepdims)};
  return t;
}
}  // namespace

layers::PoolingOptions layers::Pooling::options_from_config(int rank, const std::string& owner, const Json& config) {
  return read_fields(config, owner, pooling_fields(rank));
}

layers::Pooling::Pooling(int rank, bool is_max, const std::string& owner, const layers::PoolingOptions& o,
                         const Json& base_config)
    : SimpleLayer(base_config), rank_(rank), is_max_(is_max), owner_(owner), options_(o) {
  check_fields(owner, options_, pooling_fields(rank));
  channels_last_ = options_.data_format == "channels_last";
}

at::Tensor layers::Pooling::call1(const at::Tensor& x, bool training) {
  if (x.dim() != rank_ + 2)
    throw ShapeError(owner_ + " '" + name() + "' expects inputs of rank " + std::to_string(rank_ + 2) +
                     ". Received: " + shape_to_string(sizes_of(x)));
  at::Tensor t = channels_last_ ? conv_utils::channels_last_to_first(x) : x;
  std::vector<std::pair<int64_t, int64_t>> pads;
  bool padded = false;
  for (int i = 0; i < rank_; ++i) {
    int64_t n = t.size(2 + i);
    if (conv_utils::output_length(n, options_.pool_size[i], options_.strides[i], 1, options_.padding) < 1)
      throw ShapeError(owner_ + " '" + name() + "': the input of shape " + shape_to_string(sizes_of(x)) +
                       " is smaller than pool_size " + int_list_json(options_.pool_size).dump());
    pads.push_back(conv_utils::padding_amounts(n, options_.pool_size[i], options_.strides[i], 1, options_.padding));
    padded = padded || pads.back().first || pads.back().second;
  }
  const std::vector<int64_t> zeros(rank_, 0);
  at::Tensor y;
  if (is_max_) {
    if (padded) t = at::constant_pad_nd(t, conv_utils::pad_arg(pads), -std::numeric_limits<double>::infinity());
    y = rank_ == 1 ? at::max_pool1d(t, options_.pool_size, options_.strides, zeros)
                   : at::max_pool2d(t, options_.pool_size, options_.strides, zeros);
  } else {
    auto avg = [&](const at::Tensor& v) {
      return rank_ == 1 ? at::avg_pool1d(v, options_.pool_size, options_.strides, zeros)
                        : at::avg_pool2d(v, options_.pool_size, options_.strides, zeros);
    };
    if (!padded) {
      y = avg(t);
    } else {
      // Average over the real cells only: divide by the fraction of each
      // window that is not padding.
      std::vector<int64_t> ones_shape = {1, 1};
      for (int i = 0; i < rank_; ++i) ones_shape.push_back(t.size(2 + i));
      at::Tensor ones = at::ones(ones_shape, t.options());
      auto arg = conv_utils::pad_arg(pads);
      y = avg(at::constant_pad_nd(t, arg, 0.0)) / avg(at::constant_pad_nd(ones, arg, 0.0));
    }
  }
  return channels_last_ ? conv_utils::channels_first_to_last(y) : y;
}

std::vector<Shape> layers::Pooling::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  const Shape& s = input_shapes.at(0);
  if ((int)s.size() != rank_ + 2)
    throw ShapeError(owner_ + " '" + name() + "' expects inputs of rank " + std::to_string(rank_ + 2) +
                     ". Received: " + shape_to_string(s));
  Shape out = s;
  for (int i = 0; i < rank_; ++i) {
    int64_t& d = out[channels_last_ ? 1 + i : 2 + i];
    int64_t len = conv_utils::output_length(d, options_.pool_size[i], options_.strides[i], 1, options_.padding);
    if (d >= 0 && len < 1)
      throw ShapeError(owner_ + " '" + name() + "': inputs of shape " + shape_to_string(s) +
                       " are smaller than pool_size " + int_list_json(options_.pool_size).dump());
    d = len;
  }
  return {out};
}

Json layers::Pooling::get_config() const {
  Json j = base_config();
  write_fields(j, options_, pooling_fields(rank_));
  return j;
}

layers::MaxPooling1DImpl::MaxPooling1DImpl(const layers::PoolingOptions& o)
    : layers::Pooling(1, true, "MaxPooling1D", o, layer_base_config(o.base)) {}
layers::MaxPooling1DImpl::MaxPooling1DImpl(const Json& config)
    : layers::Pooling(1, true, "MaxPooling1D", options_from_config(1, "MaxPooling1D", config), config) {}
layers::MaxPooling1DImpl::MaxPooling1DImpl(int64_t pool_size, int64_t strides, const std::string& padding,
                                           const Json& extra)
    : layers::MaxPooling1DImpl(pooling_config(
          extra, {pool_size}, strides ? std::vector<int64_t>{strides} : std::vector<int64_t>{}, padding)) {}
layers::AveragePooling1DImpl::AveragePooling1DImpl(const layers::PoolingOptions& o)
    : layers::Pooling(1, false, "AveragePooling1D", o, layer_base_config(o.base)) {}
layers::AveragePooling1DImpl::AveragePooling1DImpl(const Json& config)
    : layers::Pooling(1, false, "AveragePooling1D", options_from_config(1, "AveragePooling1D", config), config) {}
layers::AveragePooling1DImpl::AveragePooling1DImpl(int64_t pool_size, int64_t strides, const std::string& padding,
                                                   const Json& extra)
    : layers::AveragePooling1DImpl(pooling_config(
          extra, {pool_size}, strides ? std::vector<int64_t>{strides} : std::vector<int64_t>{}, padding)) {}
layers::MaxPooling2DImpl::MaxPooling2DImpl(const layers::PoolingOptions& o)
    : layers::Pooling(2, true, "MaxPooling2D", o, layer_base_config(o.base)) {}
layers::MaxPooling2DImpl::MaxPooling2DImpl(const Json& config)
    : layers::Pooling(2, true, "MaxPooling2D", options_from_config(2, "MaxPooling2D", config), config) {}
layers::MaxPooling2DImpl::MaxPooling2DImpl(const std::vector<int64_t>& pool_size, const std::vector<int64_t>& strides,
                                           const std::string& padding, const Json& extra)
    : layers::MaxPooling2DImpl(pooling_config(extra, pool_size, strides, padding)) {}
layers::AveragePooling2DImpl::AveragePooling2DImpl(const layers::PoolingOptions& o)
    : layers::Pooling(2, false, "AveragePooling2D", o, layer_base_config(o.base)) {}
layers::AveragePooling2DImpl::AveragePooling2DImpl(const Json& config)
    : layers::Pooling(2, false, "AveragePooling2D", options_from_config(2, "AveragePooling2D", config), config) {}
layers::AveragePooling2DImpl::AveragePooling2DImpl(const std::vector<int64_t>& pool_size,
                                                   const std::vector<int64_t>& strides, const std::string& padding,
                                                   const Json& extra)
    : layers::AveragePooling2DImpl(pooling_config(extra, pool_size, strides, padding)) {}

KILN_REGISTER_LAYER_AS(MaxPooling1D, layers::MaxPooling1DImpl);
KILN_REGISTER_LAYER_AS(AveragePooling1D, layers::AveragePooling1DImpl);
KILN_REGISTER_LAYER_AS(MaxPooling2D, layers::MaxPooling2DImpl);
KILN_REGISTER_LAYER_AS(AveragePooling2D, layers::AveragePooling2DImpl);

// --- global pooling ---------------------------------------------------------
layers::GlobalPoolingOptions layers::GlobalPooling::options_from_config(const std::string& owner, const Json& config) {
  return read_fields(config, owner, global_pooling_fields());
}

layers::GlobalPooling::GlobalPooling(int rank, bool is_max, const std::string& owner,
                                     const layers::GlobalPoolingOptions& o, const Json& base_config)
    : SimpleLayer(base_config), rank_(rank), is_max_(is_max), owner_(owner), options_(o) {
  check_fields(owner, options_, global_pooling_fields());
  channels_last_ = options_.data_format == "channels_last";
}

at::Tensor layers::GlobalPooling::call1(const at::Tensor& x, bool training) {
  if (x.dim() != rank_ + 2)
    throw ShapeError(owner_ + " '" + name() + "' expects inputs of rank " + std::to_string(rank_ + 2) +
                     ". Received: " + shape_to_string(sizes_of(x)));
  std::vector<int64_t> axes;
  for (int i = 0; i < rank_; ++i) axes.push_back(channels_last_ ? 1 + i : 2 + i);
  if (!is_max_) return x.mean(axes, options_.keepdims);
  return at::amax(x, axes, options_.keepdims);
}

std::vector<Shape> layers::GlobalPooling::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  const Shape& s = input_shapes.at(0);
  if ((int)s.size() != rank_ + 2)
    throw ShapeError(owner_ + " '" + name() + "' expects inputs of rank " + std::to_string(rank_ + 2) +
                     ". Received: " + shape_to_string(s));
  const int64_t c = channels_last_ ? s.back() : s[1];
  if (!options_.keepdims) return {{s[0], c}};
  Shape out(s.size(), 1);
  out[0] = s[0];
  out[channels_last_ ? s.size() - 1 : 1] = c;
  return {out};
}

Json layers::GlobalPooling::get_config() const {
  Json j = base_config();
  write_fields(j, options_, global_pooling_fields());
  return j;
}

layers::GlobalAveragePooling1DImpl::GlobalAveragePooling1DImpl(const layers::GlobalPoolingOptions& o)
    : layers::GlobalPooling(1, false, "GlobalAveragePooling1D", o, layer_base_config(o.base)) {}
layers::GlobalAveragePooling1DImpl::GlobalAveragePooling1DImpl(const Json& c)
    : layers::GlobalPooling(1, false, "GlobalAveragePooling1D", options_from_config("GlobalAveragePooling1D", c), c) {}
layers::GlobalAveragePooling2DImpl::GlobalAveragePooling2DImpl(const layers::GlobalPoolingOptions& o)
    : layers::GlobalPooling(2, false, "GlobalAveragePooling2D", o, layer_base_config(o.base)) {}
layers::GlobalAveragePooling2DImpl::GlobalAveragePooling2DImpl(const Json& c)
    : layers::GlobalPooling(2, false, "GlobalAveragePooling2D", options_from_config("GlobalAveragePooling2D", c), c) {}
layers::GlobalMaxPooling1DImpl::GlobalMaxPooling1DImpl(const layers::GlobalPoolingOptions& o)
    : layers::GlobalPooling(1, true, "GlobalMaxPooling1D", o, layer_base_config(o.base)) {}
layers::GlobalMaxPooling1DImpl::GlobalMaxPooling1DImpl(const Json& c)
    : layers::GlobalPooling(1, true, "GlobalMaxPooling1D", options_from_config("GlobalMaxPooling1D", c), c) {}
layers::GlobalMaxPooling2DImpl::GlobalMaxPooling2DImpl(const layers::GlobalPoolingOptions& o)
    : layers::GlobalPooling(2, true, "GlobalMaxPooling2D", o, layer_base_config(o.base)) {}
layers::GlobalMaxPooling2DImpl::GlobalMaxPooling2DImpl(const Json& c)
    : layers::GlobalPooling(2, true, "GlobalMaxPooling2D", options_from_config("GlobalMaxPooling2D", c), c) {}

KILN_REGISTER_LAYER_AS(GlobalAveragePooling1D, layers::GlobalAveragePooling1DImpl);
KILN_REGISTER_LAYER_AS(GlobalAveragePooling2D, layers::GlobalAveragePooling2DImpl);
KILN_REGISTER_LAYER_AS(GlobalMaxPooling1D, layers::GlobalMaxPooling1DImpl);
KILN_REGISTER_LAYER_AS(GlobalMaxPooling2D, layers::GlobalMaxPooling2DImpl);

}  // namespace kiln
