#include "kiln/layers/pooling.h"

#include <limits>

#include "kiln/layers/config_reader.h"
#include "kiln/layers/conv_utils.h"

namespace kiln {
namespace {

Json pooling_config(const Json& extra, const std::vector<int64_t>& pool_size, const std::vector<int64_t>& strides,
                    const std::string& padding) {
  return merged_config(extra, Json{{"pool_size", pool_size},
                                   {"strides", strides.empty() ? Json(nullptr) : Json(strides)},
                                   {"padding", padding}});
}
}  // namespace

PoolingOptions Pooling::options_from_config(int rank, const std::string& owner, const Json& config) {
  ConfigReader r(config, owner);
  PoolingOptions o;
  o.pool_size = r.int_tuple("pool_size", rank, std::vector<int64_t>(rank, 2));
  o.strides = r.int_tuple("strides", rank, o.pool_size);
  o.padding = r.choice("padding", "valid", {"valid", "same"});
  o.data_format = r.choice("data_format", "channels_last", {"channels_last", "channels_first"});
  r.finish();
  return o;
}

Pooling::Pooling(int rank, bool is_max, const std::string& owner, const PoolingOptions& o, const Json& base_config)
    : SimpleLayer(base_config), rank_(rank), is_max_(is_max), owner_(owner) {
  pool_size_ = option_check::tuple(owner, "pool_size", o.pool_size, rank);
  strides_ = o.strides.empty() ? pool_size_ : option_check::tuple(owner, "strides", o.strides, rank);
  padding_ = option_check::choice(owner, "padding", o.padding, {"valid", "same"});
  channels_last_ =
      option_check::choice(owner, "data_format", o.data_format, {"channels_last", "channels_first"}) == "channels_last";
}

at::Tensor Pooling::call1(const at::Tensor& x, bool training) {
  if (x.dim() != rank_ + 2)
    throw ShapeError(owner_ + " '" + name() + "' expects inputs of rank " + std::to_string(rank_ + 2) +
                     ". Received: " + shape_to_string(sizes_of(x)));
  at::Tensor t = channels_last_ ? conv_utils::channels_last_to_first(x) : x;
  std::vector<std::pair<int64_t, int64_t>> pads;
  bool padded = false;
  for (int i = 0; i < rank_; ++i) {
    int64_t n = t.size(2 + i);
    if (conv_utils::output_length(n, pool_size_[i], strides_[i], 1, padding_) < 1)
      throw ShapeError(owner_ + " '" + name() + "': the input of shape " + shape_to_string(sizes_of(x)) +
                       " is smaller than pool_size " + int_list_json(pool_size_).dump());
    pads.push_back(conv_utils::padding_amounts(n, pool_size_[i], strides_[i], 1, padding_));
    padded = padded || pads.back().first || pads.back().second;
  }
  const std::vector<int64_t> zeros(rank_, 0);
  at::Tensor y;
  if (is_max_) {
    if (padded) t = at::constant_pad_nd(t, conv_utils::pad_arg(pads), -std::numeric_limits<double>::infinity());
    y = rank_ == 1 ? at::max_pool1d(t, pool_size_, strides_, zeros) : at::max_pool2d(t, pool_size_, strides_, zeros);
  } else {
    auto avg = [&](const at::Tensor& v) {
      return rank_ == 1 ? at::avg_pool1d(v, pool_size_, strides_, zeros)
                        : at::avg_pool2d(v, pool_size_, strides_, zeros);
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

std::vector<Shape> Pooling::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  const Shape& s = input_shapes.at(0);
  if ((int)s.size() != rank_ + 2)
    throw ShapeError(owner_ + " '" + name() + "' expects inputs of rank " + std::to_string(rank_ + 2) +
                     ". Received: " + shape_to_string(s));
  Shape out = s;
  for (int i = 0; i < rank_; ++i) {
    int64_t& d = out[channels_last_ ? 1 + i : 2 + i];
    int64_t len = conv_utils::output_length(d, pool_size_[i], strides_[i], 1, padding_);
    if (d >= 0 && len < 1)
      throw ShapeError(owner_ + " '" + name() + "': inputs of shape " + shape_to_string(s) +
                       " are smaller than pool_size " + int_list_json(pool_size_).dump());
    d = len;
  }
  return {out};
}

Json Pooling::get_config() const {
  Json j = base_config();
  j["pool_size"] = pool_size_;
  j["padding"] = padding_;
  j["strides"] = strides_;
  j["data_format"] = channels_last_ ? "channels_last" : "channels_first";
  return j;
}

MaxPooling1D::MaxPooling1D(const PoolingOptions& o) : Pooling(1, true, "MaxPooling1D", o, layer_base_config(o.base)) {}
MaxPooling1D::MaxPooling1D(const Json& config)
    : Pooling(1, true, "MaxPooling1D", options_from_config(1, "MaxPooling1D", config), config) {}
MaxPooling1D::MaxPooling1D(int64_t pool_size, int64_t strides, const std::string& padding, const Json& extra)
    : MaxPooling1D(pooling_config(extra, {pool_size}, strides ? std::vector<int64_t>{strides} : std::vector<int64_t>{},
                                  padding)) {}
AveragePooling1D::AveragePooling1D(const PoolingOptions& o)
    : Pooling(1, false, "AveragePooling1D", o, layer_base_config(o.base)) {}
AveragePooling1D::AveragePooling1D(const Json& config)
    : Pooling(1, false, "AveragePooling1D", options_from_config(1, "AveragePooling1D", config), config) {}
AveragePooling1D::AveragePooling1D(int64_t pool_size, int64_t strides, const std::string& padding, const Json& extra)
    : AveragePooling1D(pooling_config(extra, {pool_size},
                                      strides ? std::vector<int64_t>{strides} : std::vector<int64_t>{}, padding)) {}
MaxPooling2D::MaxPooling2D(const PoolingOptions& o) : Pooling(2, true, "MaxPooling2D", o, layer_base_config(o.base)) {}
MaxPooling2D::MaxPooling2D(const Json& config)
    : Pooling(2, true, "MaxPooling2D", options_from_config(2, "MaxPooling2D", config), config) {}
MaxPooling2D::MaxPooling2D(const std::vector<int64_t>& pool_size, const std::vector<int64_t>& strides,
                           const std::string& padding, const Json& extra)
    : MaxPooling2D(pooling_config(extra, pool_size, strides, padding)) {}
AveragePooling2D::AveragePooling2D(const PoolingOptions& o)
    : Pooling(2, false, "AveragePooling2D", o, layer_base_config(o.base)) {}
AveragePooling2D::AveragePooling2D(const Json& config)
    : Pooling(2, false, "AveragePooling2D", options_from_config(2, "AveragePooling2D", config), config) {}
AveragePooling2D::AveragePooling2D(const std::vector<int64_t>& pool_size, const std::vector<int64_t>& strides,
                                   const std::string& padding, const Json& extra)
    : AveragePooling2D(pooling_config(extra, pool_size, strides, padding)) {}

KILN_REGISTER_LAYER(MaxPooling1D);
KILN_REGISTER_LAYER(AveragePooling1D);
KILN_REGISTER_LAYER(MaxPooling2D);
KILN_REGISTER_LAYER(AveragePooling2D);

// --- global pooling ---------------------------------------------------------
GlobalPoolingOptions GlobalPooling::options_from_config(const std::string& owner, const Json& config) {
  ConfigReader r(config, owner);
  GlobalPoolingOptions o;
  o.data_format = r.choice("data_format", "channels_last", {"channels_last", "channels_first"});
  o.keepdims = r.boolean("keepdims", false);
  r.finish();
  return o;
}

GlobalPooling::GlobalPooling(int rank, bool is_max, const std::string& owner, const GlobalPoolingOptions& o,
                             const Json& base_config)
    : SimpleLayer(base_config), rank_(rank), is_max_(is_max), owner_(owner) {
  channels_last_ =
      option_check::choice(owner, "data_format", o.data_format, {"channels_last", "channels_first"}) == "channels_last";
  keepdims_ = o.keepdims;
}

at::Tensor GlobalPooling::call1(const at::Tensor& x, bool training) {
  if (x.dim() != rank_ + 2)
    throw ShapeError(owner_ + " '" + name() + "' expects inputs of rank " + std::to_string(rank_ + 2) +
                     ". Received: " + shape_to_string(sizes_of(x)));
  std::vector<int64_t> axes;
  for (int i = 0; i < rank_; ++i) axes.push_back(channels_last_ ? 1 + i : 2 + i);
  if (!is_max_) return x.mean(axes, keepdims_);
  return at::amax(x, axes, keepdims_);
}

std::vector<Shape> GlobalPooling::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  const Shape& s = input_shapes.at(0);
  if ((int)s.size() != rank_ + 2)
    throw ShapeError(owner_ + " '" + name() + "' expects inputs of rank " + std::to_string(rank_ + 2) +
                     ". Received: " + shape_to_string(s));
  const int64_t c = channels_last_ ? s.back() : s[1];
  if (!keepdims_) return {{s[0], c}};
  Shape out(s.size(), 1);
  out[0] = s[0];
  out[channels_last_ ? s.size() - 1 : 1] = c;
  return {out};
}

Json GlobalPooling::get_config() const {
  Json j = base_config();
  j["data_format"] = channels_last_ ? "channels_last" : "channels_first";
  j["keepdims"] = keepdims_;
  return j;
}

GlobalAveragePooling1D::GlobalAveragePooling1D(const GlobalPoolingOptions& o)
    : GlobalPooling(1, false, "GlobalAveragePooling1D", o, layer_base_config(o.base)) {}
GlobalAveragePooling1D::GlobalAveragePooling1D(const Json& c)
    : GlobalPooling(1, false, "GlobalAveragePooling1D", options_from_config("GlobalAveragePooling1D", c), c) {}
GlobalAveragePooling2D::GlobalAveragePooling2D(const GlobalPoolingOptions& o)
    : GlobalPooling(2, false, "GlobalAveragePooling2D", o, layer_base_config(o.base)) {}
GlobalAveragePooling2D::GlobalAveragePooling2D(const Json& c)
    : GlobalPooling(2, false, "GlobalAveragePooling2D", options_from_config("GlobalAveragePooling2D", c), c) {}
GlobalMaxPooling1D::GlobalMaxPooling1D(const GlobalPoolingOptions& o)
    : GlobalPooling(1, true, "GlobalMaxPooling1D", o, layer_base_config(o.base)) {}
GlobalMaxPooling1D::GlobalMaxPooling1D(const Json& c)
    : GlobalPooling(1, true, "GlobalMaxPooling1D", options_from_config("GlobalMaxPooling1D", c), c) {}
GlobalMaxPooling2D::GlobalMaxPooling2D(const GlobalPoolingOptions& o)
    : GlobalPooling(2, true, "GlobalMaxPooling2D", o, layer_base_config(o.base)) {}
GlobalMaxPooling2D::GlobalMaxPooling2D(const Json& c)
    : GlobalPooling(2, true, "GlobalMaxPooling2D", options_from_config("GlobalMaxPooling2D", c), c) {}

KILN_REGISTER_LAYER(GlobalAveragePooling1D);
KILN_REGISTER_LAYER(GlobalAveragePooling2D);
KILN_REGISTER_LAYER(GlobalMaxPooling1D);
KILN_REGISTER_LAYER(GlobalMaxPooling2D);

}  // namespace kiln
