#include "kiln/layers/conv_transpose.h"

#include <algorithm>

#include "kiln/layers/config_reader.h"
#include "kiln/layers/conv_utils.h"

namespace kiln {
namespace {

int64_t convt_max(const std::vector<int64_t>& v) { return *std::max_element(v.begin(), v.end()); }

void convt_check_image(const Layer& l, const Shape& s, bool channels_last) {
  if (s.size() != 4)
    throw ShapeError(l.class_name() + " '" + l.name() + "' expects inputs of rank 4. Received: " + shape_to_string(s));
  if ((channels_last ? s[3] : s[1]) < 1)
    throw ShapeError(l.class_name() + " '" + l.name() +
                     "' needs a known channel dimension. Received: " + shape_to_string(s));
}

Json convt_format(bool channels_last) { return channels_last ? "channels_last" : "channels_first"; }

}  // namespace

// --- Conv2DTranspose -------------------------------------------------------------
Conv2DTransposeOptions Conv2DTranspose::options_from_config(const Json& config) {
  ConfigReader r(config, "Conv2DTranspose");
  Conv2DTransposeOptions o;
  o.filters = r.positive_int("filters");
  o.kernel_size = r.int_tuple("kernel_size", 2);
  o.strides = r.int_tuple("strides", 2, {1, 1});
  o.padding = r.choice("padding", "valid", {"valid", "same"});
  if (const Json* op = r.get("output_padding")) {
    std::vector<int64_t> v;
    if (op->is_number_integer())
      v.assign(2, op->get<int64_t>());
    else if (op->is_array() && op->size() == 2 && (*op)[0].is_number_integer() && (*op)[1].is_number_integer())
      v = {(*op)[0].get<int64_t>(), (*op)[1].get<int64_t>()};
    else
      r.invalid("output_padding", "null, a non-negative int or a list of 2 non-negative ints");
    for (int i = 0; i < 2; ++i)
      if (v[i] < 0 || v[i] >= o.strides[i])
        r.invalid("output_padding", "values smaller than the strides " + int_list_json(o.strides).dump());
    o.output_padding = v;
  }
  o.data_format = r.choice("data_format", "channels_last", {"channels_last", "channels_first"});
  o.dilation_rate = r.int_tuple("dilation_rate", 2, {1, 1});
  read_kernel_options(r, o);
  r.finish();
  return o;
}

Conv2DTranspose::Conv2DTranspose(const Conv2DTransposeOptions& o) : Conv2DTranspose(o, layer_base_config(o.base)) {}

Conv2DTranspose::Conv2DTranspose(const Json& config) : Conv2DTranspose(options_from_config(config), config) {}

Conv2DTranspose::Conv2DTranspose(const Conv2DTransposeOptions& o, const Json& base_config) : SimpleLayer(base_config) {
  namespace check = option_check;
  const std::string owner = "Conv2DTranspose";
  filters_ = check::positive(owner, "filters", o.filters);
  geom_.kernel_size = check::tuple(owner, "kernel_size", o.kernel_size, 2);
  geom_.strides = check::tuple(owner, "strides", o.strides, 2);
  geom_.padding = check::choice(owner, "padding", o.padding, {"valid", "same"});
  if (o.output_padding) {
    std::vector<int64_t> v =
        o.output_padding->size() == 1 ? std::vector<int64_t>(2, o.output_padding->at(0)) : *o.output_padding;
    if (v.size() != 2)
      check::invalid(owner, "output_padding", "null, a non-negative int or a list of 2 non-negative ints",
                     int_list_json(*o.output_padding));
    for (int i = 0; i < 2; ++i)
      if (v[i] < 0 || v[i] >= geom_.strides[i])
        check::invalid(owner, "output_padding",
                       "values smaller than the strides " + int_list_json(geom_.strides).dump(), int_list_json(v));
    output_padding_ = v;
  }
  geom_.channels_last =
      check::choice(owner, "data_format", o.data_format, {"channels_last", "channels_first"}) == "channels_last";
  geom_.dilation_rate = check::tuple(owner, "dilation_rate", o.dilation_rate, 2);
  activation_name_ = check::activation(owner, "activation", o.activation);
  use_bias_ = o.use_bias;
  kernel_init_ = o.kernel_initializer.resolve(owner, "kernel_initializer");
  bias_init_ = o.bias_initializer.resolve(owner, "bias_initializer");
  kernel_reg_ = o.kernel_regularizer;
  bias_reg_ = o.bias_regularizer;
  activity_reg_ = o.activity_regularizer;
  if (convt_max(geom_.strides) > 1 && convt_max(geom_.dilation_rate) > 1)
    throw ValueError(
        "Conv2DTranspose: `strides > 1` not supported in conjunction with `dilation_rate > 1`. Received: strides=" +
        int_list_json(geom_.strides).dump() + " and dilation_rate=" + int_list_json(geom_.dilation_rate).dump());
  activation_ = get_activation(activation_name_);
}

int64_t Conv2DTranspose::output_length(int i, int64_t n) const {
  if (n < 0) return kNone;
  const int64_t s = geom_.strides[i];
  const int64_t k = geom_.dilation_rate[i] * (geom_.kernel_size[i] - 1) + 1;
  if (!output_padding_) return geom_.padding == "valid" ? n * s + std::max<int64_t>(k - s, 0) : n * s;
  const int64_t pad = geom_.padding == "same" ? k / 2 : 0;
  return (n - 1) * s + k - 2 * pad + (*output_padding_)[i];
}

void Conv2DTranspose::build(const std::vector<Shape>& input_shapes) {
  const Shape& s = input_shapes.at(0);
  convt_check_image(*this, s, geom_.channels_last);
  const int64_t channels = geom_.channels_last ? s[3] : s[1];
  kernel_ = add_weight("kernel", {geom_.kernel_size[0], geom_.kernel_size[1], filters_, channels}, kernel_init_, true,
                       kernel_reg_);
  if (use_bias_) bias_ = add_weight("bias", {filters_}, bias_init_, true, bias_reg_);
}

at::Tensor Conv2DTranspose::call1(const at::Tensor& x, bool training) {
  const int64_t channels = kernel_->shape()[3];
  if (x.dim() != 4 || (geom_.channels_last ? x.size(3) : x.size(1)) != channels)
    throw ShapeError("Conv2DTranspose '" + name() + "' expects inputs of rank 4 with " + std::to_string(channels) +
                     " channels. Received: " + shape_to_string(sizes_of(x)));
  at::Tensor t = geom_.channels_last ? conv_utils::channels_last_to_first(x) : x;
  // (kh, kw, filters, in) -> LibTorch's transposed layout (in, filters, kh, kw).
  at::Tensor w = value(kernel_).permute({3, 2, 0, 1});
  // LibTorch 1.13's oneDNN transposed convolution rejects bfloat16 inputs
  // (it reads the weight in the forward layout), so reduced precisions run
  // it in float32 and cast back.
  const at::ScalarType dt = t.scalar_type();
  const bool upcast = dt == at::kBFloat16 || dt == at::kHalf;
  at::Tensor full = at::convolution(upcast ? t.to(at::kFloat) : t, upcast ? w.to(at::kFloat) : w, /*bias=*/{},
                                    geom_.strides, /*padding=*/{0, 0}, geom_.dilation_rate,
                                    /*transposed=*/true, /*output_padding=*/{0, 0}, /*groups=*/1)
                        .to(dt);
  // The full transposed convolution has (n-1)*s + k entries per axis; keep
  // the window TensorFlow keeps: it starts at the forward convolution's
  // leading padding and may run past the end (zeros there).
  std::vector<std::pair<int64_t, int64_t>> pads;
  for (int i = 0; i < 2; ++i) {
    const int64_t n = t.size(2 + i), len = output_length(i, n), have = full.size(2 + i);
    const int64_t k = geom_.dilation_rate[i] * (geom_.kernel_size[i] - 1) + 1;
    const int64_t total = std::max<int64_t>((n - 1) * geom_.strides[i] + k - len, 0);
    const int64_t before = geom_.padding == "same" ? total / 2 : 0;
    pads.emplace_back(-before, len - (have - before));
  }
  at::Tensor y = at::constant_pad_nd(full, conv_utils::pad_arg(pads), 0.0);
  if (bias_) y = y + value(bias_).reshape({1, filters_, 1, 1});
  if (geom_.channels_last) y = conv_utils::channels_first_to_last(y);
  y = activation_(y);
  if (activity_reg_ && training) add_loss((*activity_reg_)(y));
  return y;
}

std::vector<Shape> Conv2DTranspose::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  const Shape& s = input_shapes.at(0);
  convt_check_image(*this, s, geom_.channels_last);
  const int h = geom_.channels_last ? 1 : 2;
  Shape out = s;
  out[h] = output_length(0, s[h]);
  out[h + 1] = output_length(1, s[h + 1]);
  out[geom_.channels_last ? 3 : 1] = filters_;
  return {out};
}

Json Conv2DTranspose::get_config() const {
  Json j = base_config();
  j["filters"] = filters_;
  j["kernel_size"] = geom_.kernel_size;
  j["strides"] = geom_.strides;
  j["padding"] = geom_.padding;
  j["output_padding"] = output_padding_ ? int_list_json(*output_padding_) : Json(nullptr);
  j["data_format"] = convt_format(geom_.channels_last);
  j["dilation_rate"] = geom_.dilation_rate;
  j["activation"] = activation_name_;
  j["use_bias"] = use_bias_;
  j["kernel_initializer"] = kernel_init_->to_json();
  j["bias_initializer"] = bias_init_->to_json();
  j["kernel_regularizer"] = regularizer_json(kernel_reg_);
  j["bias_regularizer"] = regularizer_json(bias_reg_);
  j["activity_regularizer"] = regularizer_json(activity_reg_);
  j["kernel_constraint"] = nullptr;
  j["bias_constraint"] = nullptr;
  return j;
}

KILN_REGISTER_LAYER(Conv2DTranspose);

// --- DepthwiseConv2D / SeparableConv2D ---------------------------------------------
DepthwiseConv2DOptions DepthwiseConv2D::options_from_config(const Json& config, bool separable) {
  ConfigReader r(config, separable ? "SeparableConv2D" : "DepthwiseConv2D");
  DepthwiseConv2DOptions o;
  if (separable) o.filters = r.positive_int("filters");
  o.kernel_size = r.int_tuple("kernel_size", 2);
  o.strides = r.int_tuple("strides", 2, {1, 1});
  o.padding = r.choice("padding", "valid", {"valid", "same"});
  o.data_format = r.choice("data_format", "channels_last", {"channels_last", "channels_first"});
  o.dilation_rate = r.int_tuple("dilation_rate", 2, {1, 1});
  o.depth_multiplier = r.positive_int("depth_multiplier", 1);
  o.activation = r.activation("activation", "linear");
  o.use_bias = r.boolean("use_bias", true);
  o.depthwise_initializer = r.initializer("depthwise_initializer", "glorot_uniform");
  if (separable) o.pointwise_initializer = r.initializer("pointwise_initializer", "glorot_uniform");
  o.bias_initializer = r.initializer("bias_initializer", "zeros");
  o.depthwise_regularizer = r.regularizer("depthwise_regularizer");
  if (separable) o.pointwise_regularizer = r.regularizer("pointwise_regularizer");
  o.bias_regularizer = r.regularizer("bias_regularizer");
  o.activity_regularizer = r.regularizer("activity_regularizer");
  r.no_constraint("depthwise_constraint");
  if (separable) r.no_constraint("pointwise_constraint");
  r.no_constraint("bias_constraint");
  r.finish();
  return o;
}

DepthwiseConv2D::DepthwiseConv2D(const DepthwiseConv2DOptions& o)
    : DepthwiseConv2D(o, layer_base_config(o.base), false) {}

DepthwiseConv2D::DepthwiseConv2D(const Json& config)
    : DepthwiseConv2D(options_from_config(config, false), config, false) {}

DepthwiseConv2D::DepthwiseConv2D(const DepthwiseConv2DOptions& o, const Json& base_config, bool separable)
    : SimpleLayer(base_config), separable_(separable), owner_(separable ? "SeparableConv2D" : "DepthwiseConv2D") {
  namespace check = option_check;
  if (separable_) {
    filters_ = check::positive(owner_, "filters", o.filters);
  } else if (o.filters != 0 || o.pointwise_regularizer) {
    throw ValueError("DepthwiseConv2D: `filters` and the pointwise_* options belong to SeparableConv2D");
  }
  geom_.kernel_size = check::tuple(owner_, "kernel_size", o.kernel_size, 2);
  geom_.strides = check::tuple(owner_, "strides", o.strides, 2);
  geom_.padding = check::choice(owner_, "padding", o.padding, {"valid", "same"});
  geom_.channels_last =
      check::choice(owner_, "data_format", o.data_format, {"channels_last", "channels_first"}) == "channels_last";
  geom_.dilation_rate = check::tuple(owner_, "dilation_rate", o.dilation_rate, 2);
  depth_multiplier_ = check::positive(owner_, "depth_multiplier", o.depth_multiplier);
  activation_name_ = check::activation(owner_, "activation", o.activation);
  use_bias_ = o.use_bias;
  depthwise_init_ = o.depthwise_initializer.resolve(owner_, "depthwise_initializer");
  if (separable_) pointwise_init_ = o.pointwise_initializer.resolve(owner_, "pointwise_initializer");
  bias_init_ = o.bias_initializer.resolve(owner_, "bias_initializer");
  depthwise_reg_ = o.depthwise_regularizer;
  if (separable_) pointwise_reg_ = o.pointwise_regularizer;
  bias_reg_ = o.bias_regularizer;
  activity_reg_ = o.activity_regularizer;
  if (convt_max(geom_.strides) > 1 && convt_max(geom_.dilation_rate) > 1)
    throw ValueError(
        owner_ + ": `strides > 1` not supported in conjunction with `dilation_rate > 1`. Received: strides=" +
        int_list_json(geom_.strides).dump() + " and dilation_rate=" + int_list_json(geom_.dilation_rate).dump());
  activation_ = get_activation(activation_name_);
}

void DepthwiseConv2D::build(const std::vector<Shape>& input_shapes) {
  const Shape& s = input_shapes.at(0);
  convt_check_image(*this, s, geom_.channels_last);
  in_channels_ = geom_.channels_last ? s[3] : s[1];
  const int64_t mid = in_channels_ * depth_multiplier_;
  depthwise_ =
      add_weight("depthwise_kernel", {geom_.kernel_size[0], geom_.kernel_size[1], in_channels_, depth_multiplier_},
                 depthwise_init_, true, depthwise_reg_);
  if (separable_)
    pointwise_ = add_weight("pointwise_kernel", {1, 1, mid, filters_}, pointwise_init_, true, pointwise_reg_);
  if (use_bias_) bias_ = add_weight("bias", {separable_ ? filters_ : mid}, bias_init_, true, bias_reg_);
  ConvGeometry g = geom_;
  g.groups = in_channels_;
  depthwise_impl_ = float_conv_impl(g);
  if (separable_) {
    ConvGeometry p;
    p.kernel_size = {1, 1};
    p.strides = {1, 1};
    p.dilation_rate = {1, 1};
    p.channels_last = geom_.channels_last;
    pointwise_impl_ = float_conv_impl(p);
  }
}

at::Tensor DepthwiseConv2D::call1(const at::Tensor& x, bool training) {
  if (x.dim() != 4 || (geom_.channels_last ? x.size(3) : x.size(1)) != in_channels_)
    throw ShapeError(owner_ + " '" + name() + "' expects inputs of rank 4 with " + std::to_string(in_channels_) +
                     " channels. Received: " + shape_to_string(sizes_of(x)));
  for (int i = 0; i < 2; ++i)
    if (conv_utils::output_length(x.size(geom_.channels_last ? 1 + i : 2 + i), geom_.kernel_size[i], geom_.strides[i],
                                  geom_.dilation_rate[i], geom_.padding) < 1)
      throw ShapeError(owner_ + " '" + name() + "': the input of shape " + shape_to_string(sizes_of(x)) +
                       " is smaller than the (dilated) kernel " + int_list_json(geom_.kernel_size).dump());
  const int64_t mid = in_channels_ * depth_multiplier_;
  // (kh, kw, in, m) -> grouped conv kernel (kh, kw, 1, in*m): output channel c*m + m'.
  at::Tensor dw = value(depthwise_).reshape({geom_.kernel_size[0], geom_.kernel_size[1], 1, mid});
  at::Tensor y = depthwise_impl_->apply(x, dw);
  if (separable_) y = pointwise_impl_->apply(y, value(pointwise_));
  if (bias_) {
    at::Tensor b = value(bias_);
    y = geom_.channels_last ? y + b : y + b.reshape({-1, 1, 1});
  }
  y = activation_(y);
  if (activity_reg_ && training) add_loss((*activity_reg_)(y));
  return y;
}

std::vector<Shape> DepthwiseConv2D::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  const Shape& s = input_shapes.at(0);
  convt_check_image(*this, s, geom_.channels_last);
  Shape out = s;
  const int h = geom_.channels_last ? 1 : 2;
  for (int i = 0; i < 2; ++i) {
    int64_t len = conv_utils::output_length(s[h + i], geom_.kernel_size[i], geom_.strides[i], geom_.dilation_rate[i],
                                            geom_.padding);
    if (s[h + i] >= 0 && len < 1)
      throw ShapeError(owner_ + " '" + name() + "': inputs of shape " + shape_to_string(s) +
                       " are smaller than the (dilated) kernel " + int_list_json(geom_.kernel_size).dump());
    out[h + i] = len;
  }
  out[geom_.channels_last ? 3 : 1] = separable_ ? filters_ : in_channels_ * depth_multiplier_;
  return {out};
}

Json DepthwiseConv2D::get_config() const {
  Json j = base_config();
  if (separable_) j["filters"] = filters_;
  j["kernel_size"] = geom_.kernel_size;
  j["strides"] = geom_.strides;
  j["padding"] = geom_.padding;
  j["depth_multiplier"] = depth_multiplier_;
  j["data_format"] = convt_format(geom_.channels_last);
  j["dilation_rate"] = geom_.dilation_rate;
  j["activation"] = activation_name_;
  j["use_bias"] = use_bias_;
  j["depthwise_initializer"] = depthwise_init_->to_json();
  if (separable_) j["pointwise_initializer"] = pointwise_init_->to_json();
  j["bias_initializer"] = bias_init_->to_json();
  j["depthwise_regularizer"] = regularizer_json(depthwise_reg_);
  if (separable_) j["pointwise_regularizer"] = regularizer_json(pointwise_reg_);
  j["bias_regularizer"] = regularizer_json(bias_reg_);
  j["activity_regularizer"] = regularizer_json(activity_reg_);
  j["depthwise_constraint"] = nullptr;
  if (separable_) j["pointwise_constraint"] = nullptr;
  j["bias_constraint"] = nullptr;
  return j;
}

KILN_REGISTER_LAYER(DepthwiseConv2D);

SeparableConv2D::SeparableConv2D(const SeparableConv2DOptions& o)
    : DepthwiseConv2D(o, layer_base_config(o.base), true) {}

SeparableConv2D::SeparableConv2D(const Json& config)
    : DepthwiseConv2D(options_from_config(config, true), config, true) {}

KILN_REGISTER_LAYER(SeparableConv2D);

}  // namespace kiln
