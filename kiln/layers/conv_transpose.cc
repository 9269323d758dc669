#include "kiln/layers/conv_transpose.h"

#include <algorithm>

#include "kiln/layers/config_fields.h"
#include "kiln/layers/conv_utils.h"

namespace kiln {
namespace {

void convt_check_image(const Layer& l, const Shape& s, bool channels_last) {
  if (s.size() != 4)
    throw ShapeError(l.class_name() + " '" + l.name() + "' expects inputs of rank 4. Received: " + shape_to_string(s));
  if ((channels_last ? s[3] : s[1]) < 1)
    throw ShapeError(l.class_name() + " '" + l.name() +
                     "' needs a known channel dimension. Received: " + shape_to_string(s));
}

}  // namespace

// --- Conv2DTranspose -------------------------------------------------------------
namespace {
const char kOutputPaddingExpected[] = "null, a non-negative int or a list of 2 non-negative ints";

// Checked against the strides, which come before it in the table.
FieldDef<layers::Conv2DTransposeOptions> output_padding_field() {
  using O = layers::Conv2DTransposeOptions;
  const char* key = "output_padding";
  auto smaller_than_strides = [](const O& o) {
    return "values smaller than the strides " + int_list_json(o.strides).dump();
  };
  return {key,
          [=](ConfigReader& r, O& o) {
            const Json* op = r.get(key);
            if (!op) return;
            std::vector<int64_t> v;
            if (op->is_number_integer())
              v.assign(2, op->get<int64_t>());
            else if (op->is_array() && op->size() == 2 && (*op)[0].is_number_integer() && (*op)[1].is_number_integer())
              v = {(*op)[0].get<int64_t>(), (*op)[1].get<int64_t>()};
            else
              r.invalid(key, kOutputPaddingExpected);
            for (int i = 0; i < 2; ++i)
              if (v[i] < 0 || v[i] >= o.strides[i]) r.invalid(key, smaller_than_strides(o));
            o.output_padding = v;
          },
          [=](const std::string& owner, O& o) {
            if (!o.output_padding) return;
            std::vector<int64_t> v =
                o.output_padding->size() == 1 ? std::vector<int64_t>(2, o.output_padding->at(0)) : *o.output_padding;
            if (v.size() != 2)
              option_check::invalid(owner, key, kOutputPaddingExpected, int_list_json(*o.output_padding));
            for (int i = 0; i < 2; ++i)
              if (v[i] < 0 || v[i] >= o.strides[i])
                option_check::invalid(owner, key, smaller_than_strides(o), int_list_json(v));
            o.output_padding = v;
          },
          [=](Json& j, const O& o) { j[key] = o.output_padding ? int_list_json(*o.output_padding) : Json(nullptr); }};
}

const FieldTable<layers::Conv2DTransposeOptions>& conv_transpose_fields() {
  using O = layers::Conv2DTransposeOptions;
  static const FieldTable<O> t =
      FieldTable<O>{
          field("filters", &O::filters).positive().required(),
          field("kernel_size", &O::kernel_size).tuple(2).required(),
          field("strides", &O::strides).tuple(2),
          field("padding", &O::padding).choice({"valid", "same"}),
          output_padding_field(),
          field("data_format", &O::data_format).choice({"channels_last", "channels_first"}),
          field("dilation_rate", &O::dilation_rate).tuple(2),
      } +
      kernel_fields<O>();
  return t;
}
}  // namespace

layers::Conv2DTransposeOptions layers::Conv2DTransposeImpl::options_from_config(const Json& config) {
  return read_fields(config, "Conv2DTranspose", conv_transpose_fields());
}

layers::Conv2DTransposeImpl::Conv2DTransposeImpl(const layers::Conv2DTransposeOptions& o)
    : layers::Conv2DTransposeImpl(o, layer_base_config(o.base)) {}

layers::Conv2DTransposeImpl::Conv2DTransposeImpl(const Json& config)
    : layers::Conv2DTransposeImpl(options_from_config(config), config) {}

layers::Conv2DTransposeImpl::Conv2DTransposeImpl(const layers::Conv2DTransposeOptions& o, const Json& base_config)
    : SimpleLayer(base_config), options_(o) {
  check_fields("Conv2DTranspose", options_, conv_transpose_fields());
  geom_ = conv_utils::checked_geometry("Conv2DTranspose", options_);
  activation_ = get_activation(options_.activation);
}

int64_t layers::Conv2DTransposeImpl::output_length(int i, int64_t n) const {
  if (n < 0) return kNone;
  const int64_t s = geom_.strides[i];
  const int64_t k = geom_.dilation_rate[i] * (geom_.kernel_size[i] - 1) + 1;
  const auto& output_padding = options_.output_padding;
  if (!output_padding) return geom_.padding == "valid" ? n * s + std::max<int64_t>(k - s, 0) : n * s;
  const int64_t pad = geom_.padding == "same" ? k / 2 : 0;
  return (n - 1) * s + k - 2 * pad + (*output_padding)[i];
}

void layers::Conv2DTransposeImpl::build(const std::vector<Shape>& input_shapes) {
  const Shape& s = input_shapes.at(0);
  convt_check_image(*this, s, geom_.channels_last);
  const int64_t channels = geom_.channels_last ? s[3] : s[1];
  const layers::Conv2DTransposeOptions& o = options_;
  kernel_ = add_weight("kernel", {geom_.kernel_size[0], geom_.kernel_size[1], o.filters, channels},
                       o.kernel_initializer.resolved(), true, o.kernel_regularizer);
  if (o.use_bias) bias_ = add_weight("bias", {o.filters}, o.bias_initializer.resolved(), true, o.bias_regularizer);
}

at::Tensor layers::Conv2DTransposeImpl::call1(const at::Tensor& x, bool training) {
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
  if (bias_) y = y + value(bias_).reshape({1, options_.filters, 1, 1});
  if (geom_.channels_last) y = conv_utils::channels_first_to_last(y);
  y = activation_(y);
  if (options_.activity_regularizer && training) add_loss((*options_.activity_regularizer)(y));
  return y;
}

std::vector<Shape> layers::Conv2DTransposeImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  const Shape& s = input_shapes.at(0);
  convt_check_image(*this, s, geom_.channels_last);
  const int h = geom_.channels_last ? 1 : 2;
  Shape out = s;
  out[h] = output_length(0, s[h]);
  out[h + 1] = output_length(1, s[h + 1]);
  out[geom_.channels_last ? 3 : 1] = options_.filters;
  return {out};
}

Json layers::Conv2DTransposeImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, conv_transpose_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(Conv2DTranspose, layers::Conv2DTransposeImpl);

// --- DepthwiseConv2D / SeparableConv2D ---------------------------------------------
namespace {
const FieldTable<layers::DepthwiseConv2DOptions>& depthwise_fields(bool separable) {
  using O = layers::DepthwiseConv2DOptions;
  auto table = [](bool separable) {
    FieldTable<O> t;
    if (separable) t.push_back(field("filters", &O::filters).positive().required());
    t = t + FieldTable<O>{field("kernel_size", &O::kernel_size).tuple(2).required(),
                          field("strides", &O::strides).tuple(2),
                          field("padding", &O::padding).choice({"valid", "same"}),
                          field("depth_multiplier", &O::depth_multiplier).positive(),
                          field("data_format", &O::data_format).choice({"channels_last", "channels_first"}),
                          field("dilation_rate", &O::dilation_rate).tuple(2),
                          field("activation", &O::activation).activation(),
                          field("use_bias", &O::use_bias),
                          field("depthwise_initializer", &O::depthwise_initializer)};
    if (separable) t.push_back(field("pointwise_initializer", &O::pointwise_initializer));
    t.push_back(field("bias_initializer", &O::bias_initializer));
    t.push_back(field("depthwise_regularizer", &O::depthwise_regularizer));
    if (separable) t.push_back(field("pointwise_regularizer", &O::pointwise_regularizer));
    t.push_back(field("bias_regularizer", &O::bias_regularizer));
    t.push_back(field("activity_regularizer", &O::activity_regularizer));
    t.push_back(no_constraint<O>("depthwise_constraint"));
    if (separable) t.push_back(no_constraint<O>("pointwise_constraint"));
    t.push_back(no_constraint<O>("bias_constraint"));
    return t;
  };
  static const FieldTable<O> depthwise = table(false), separable_table = table(true);
  return separable ? separable_table : depthwise;
}
}  // namespace

layers::DepthwiseConv2DOptions layers::DepthwiseConv2DImpl::options_from_config(const Json& config, bool separable) {
  return read_fields(config, separable ? "SeparableConv2D" : "DepthwiseConv2D", depthwise_fields(separable));
}

layers::DepthwiseConv2DImpl::DepthwiseConv2DImpl(const layers::DepthwiseConv2DOptions& o)
    : layers::DepthwiseConv2DImpl(o, layer_base_config(o.base), false) {}

layers::DepthwiseConv2DImpl::DepthwiseConv2DImpl(const Json& config)
    : layers::DepthwiseConv2DImpl(options_from_config(config, false), config, false) {}

layers::DepthwiseConv2DImpl::DepthwiseConv2DImpl(const layers::DepthwiseConv2DOptions& o, const Json& base_config,
                                                 bool separable)
    : SimpleLayer(base_config),
      separable_(separable),
      owner_(separable ? "SeparableConv2D" : "DepthwiseConv2D"),
      options_(o) {
  if (!separable_ && (o.filters != 0 || o.pointwise_regularizer))
    throw ValueError("DepthwiseConv2D: `filters` and the pointwise_* options belong to SeparableConv2D");
  check_fields(owner_, options_, depthwise_fields(separable_));
  geom_ = conv_utils::checked_geometry(owner_, options_);
  activation_ = get_activation(options_.activation);
}

void layers::DepthwiseConv2DImpl::build(const std::vector<Shape>& input_shapes) {
  const Shape& s = input_shapes.at(0);
  convt_check_image(*this, s, geom_.channels_last);
  in_channels_ = geom_.channels_last ? s[3] : s[1];
  const layers::DepthwiseConv2DOptions& o = options_;
  const int64_t mid = in_channels_ * o.depth_multiplier;
  depthwise_ =
      add_weight("depthwise_kernel", {geom_.kernel_size[0], geom_.kernel_size[1], in_channels_, o.depth_multiplier},
                 o.depthwise_initializer.resolved(), true, o.depthwise_regularizer);
  if (separable_)
    pointwise_ = add_weight("pointwise_kernel", {1, 1, mid, o.filters}, o.pointwise_initializer.resolved(), true,
                            o.pointwise_regularizer);
  if (o.use_bias)
    bias_ = add_weight("bias", {separable_ ? o.filters : mid}, o.bias_initializer.resolved(), true, o.bias_regularizer);
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

at::Tensor layers::DepthwiseConv2DImpl::call1(const at::Tensor& x, bool training) {
  if (x.dim() != 4 || (geom_.channels_last ? x.size(3) : x.size(1)) != in_channels_)
    throw ShapeError(owner_ + " '" + name() + "' expects inputs of rank 4 with " + std::to_string(in_channels_) +
                     " channels. Received: " + shape_to_string(sizes_of(x)));
  for (int i = 0; i < 2; ++i)
    if (conv_utils::output_length(x.size(geom_.channels_last ? 1 + i : 2 + i), geom_.kernel_size[i], geom_.strides[i],
                                  geom_.dilation_rate[i], geom_.padding) < 1)
      throw ShapeError(owner_ + " '" + name() + "': the input of shape " + shape_to_string(sizes_of(x)) +
                       " is smaller than the (dilated) kernel " + int_list_json(geom_.kernel_size).dump());
  const int64_t mid = in_channels_ * options_.depth_multiplier;
  // (kh, kw, in, m) -> grouped conv kernel (kh, kw, 1, in*m): output channel c*m + m'.
  at::Tensor dw = value(depthwise_).reshape({geom_.kernel_size[0], geom_.kernel_size[1], 1, mid});
  at::Tensor y = depthwise_impl_->apply(x, dw);
  if (separable_) y = pointwise_impl_->apply(y, value(pointwise_));
  if (bias_) {
    at::Tensor b = value(bias_);
    y = geom_.channels_last ? y + b : y + b.reshape({-1, 1, 1});
  }
  y = activation_(y);
  if (options_.activity_regularizer && training) add_loss((*options_.activity_regularizer)(y));
  return y;
}

std::vector<Shape> layers::DepthwiseConv2DImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
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
  out[geom_.channels_last ? 3 : 1] = separable_ ? options_.filters : in_channels_ * options_.depth_multiplier;
  return {out};
}

Json layers::DepthwiseConv2DImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, depthwise_fields(separable_));
  return j;
}

KILN_REGISTER_LAYER_AS(DepthwiseConv2D, layers::DepthwiseConv2DImpl);

layers::SeparableConv2DImpl::SeparableConv2DImpl(const layers::SeparableConv2DOptions& o)
    : layers::DepthwiseConv2DImpl(o, layer_base_config(o.base), true) {}

layers::SeparableConv2DImpl::SeparableConv2DImpl(const Json& config)
    : layers::DepthwiseConv2DImpl(options_from_config(config, true), config, true) {}

KILN_REGISTER_LAYER_AS(SeparableConv2D, layers::SeparableConv2DImpl);

}  // namespace kiln
