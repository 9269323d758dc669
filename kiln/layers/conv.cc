#include "kiln/layers/conv.h"

#include "kiln/layers/config_fields.h"
#include "kiln/layers/conv_utils.h"

namespace kiln {
namespace {

class FloatConv : public KernelImpl {
 public:
  explicit FloatConv(ConvGeometry g) : g_(std::move(g)) {}
  std::string mode() const override { return "float"; }
  at::Tensor apply(const at::Tensor& x, const at::Tensor& kernel) const override {
    const int64_t rank = (int64_t)g_.kernel_size.size();
    // A channels_last input stays in place: the permuted view has NHWC
    // strides, which LibTorch's convolution takes as its channels_last
    // memory format (no copy), and its output permutes back to a
    // contiguous channels_last tensor.
    at::Tensor t = g_.channels_last ? conv_utils::channels_last_to_first(x) : x;
    std::vector<int64_t> zeros(rank, 0), conv_padding(rank, 0);
    if (g_.padding != "valid") {
      std::vector<std::pair<int64_t, int64_t>> pads;
      bool even = true;  // every axis pads as much before as after
      for (int64_t i = 0; i < rank; ++i) {
        pads.push_back(conv_utils::padding_amounts(t.size(2 + i), g_.kernel_size[i], g_.strides[i], g_.dilation_rate[i],
                                                   g_.padding));
        even = even && pads.back().first == pads.back().second;
        conv_padding[i] = pads.back().first;
      }
      // The same zeros either way; the convolution's own padding (every
      // "same" convolution of an odd kernel at stride 1) saves copying the
      // padded input forward and slicing its gradient backward.
      if (!even) {
        t = at::constant_pad_nd(t, conv_utils::pad_arg(pads), 0.0);
        conv_padding = zeros;
      }
    }
    // (k..., in/groups, out) -> (out, in/groups, k...).
    std::vector<int64_t> perm = {rank + 1, rank};
    for (int64_t i = 0; i < rank; ++i) perm.push_back(i);
    at::Tensor w = kernel.permute(perm);
    at::Tensor y = at::convolution(t, w, /*bias=*/{}, g_.strides, conv_padding, g_.dilation_rate,
                                   /*transposed=*/false, /*output_padding=*/zeros, g_.groups);
    return g_.channels_last ? conv_utils::channels_first_to_last(y) : y;
  }

 private:
  ConvGeometry g_;
};

}  // namespace

KernelImplPtr float_conv_impl(const ConvGeometry& geometry) { return std::make_unique<FloatConv>(geometry); }

namespace {
const FieldTable<layers::ConvOptions>& conv_fields(int rank) {
  auto table = [](int rank) {
    using O = layers::ConvOptions;
    return FieldTable<O>{
               field("filters", &O::filters).positive().required(),
               field("kernel_size", &O::kernel_size).tuple(rank).required(),
               field("strides", &O::strides).tuple(rank),
               field("padding", &O::padding)
                   .choice(rank == 1 ? std::vector<std::string>{"valid", "same", "causal"}
                                     : std::vector<std::string>{"valid", "same"}),
               field("data_format", &O::data_format).choice({"channels_last", "channels_first"}),
               field("dilation_rate", &O::dilation_rate).tuple(rank),
               field("groups", &O::groups).positive(),
           } +
           kernel_fields<O>();
  };
  static const FieldTable<layers::ConvOptions> t1 = table(1), t2 = table(2);
  return rank == 1 ? t1 : t2;
}
}  // namespace

layers::ConvOptions layers::Conv::options_from_config(int rank, const std::string& owner, const Json& config) {
  return read_fields(config, owner, conv_fields(rank));
}

layers::Conv::Conv(int rank, const std::string& owner, const layers::ConvOptions& o, const Json& base_config)
    : SimpleLayer(base_config), rank_(rank), owner_(owner), options_(o) {
  check_fields(owner, options_, conv_fields(rank));
  if (options_.filters % options_.groups != 0)
    option_check::invalid(owner, "groups", "a divisor of filters=" + std::to_string(options_.filters), options_.groups);
  geom_ = conv_utils::checked_geometry(owner, options_);
  geom_.groups = options_.groups;
  activation_ = get_activation(options_.activation);
  impl_ = float_conv_impl(geom_);
}

void layers::Conv::build(const std::vector<Shape>& input_shapes) {
  const Shape& s = input_shapes.at(0);
  if ((int)s.size() != rank_ + 2)
    throw ShapeError(owner_ + " '" + name() + "' expects inputs of rank " + std::to_string(rank_ + 2) +
                     ". Received: " + shape_to_string(s));
  const int64_t channels = geom_.channels_last ? s.back() : s[1];
  if (channels < 1)
    throw ShapeError(owner_ + " '" + name() + "' needs a known channel dimension. Received: " + shape_to_string(s));
  if (channels % geom_.groups != 0)
    throw ValueError(owner_ +
                     ": the number of input channels must be evenly divisible by the number of groups. "
                     "Received groups=" +
                     std::to_string(geom_.groups) + ", but the input has " + std::to_string(channels) +
                     " channels (full input shape is " + shape_to_string(s) + ")");
  Shape kshape = geom_.kernel_size;
  kshape.push_back(channels / geom_.groups);
  kshape.push_back(options_.filters);
  kernel_ = add_weight("kernel", kshape, options_.kernel_initializer.resolved(), true, options_.kernel_regularizer);
  if (options_.use_bias)
    bias_ =
        add_weight("bias", {options_.filters}, options_.bias_initializer.resolved(), true, options_.bias_regularizer);
}

at::Tensor layers::Conv::call1(const at::Tensor& x, bool training) {
  const int64_t channels = kernel_->shape()[rank_] * geom_.groups;
  if (x.dim() != rank_ + 2 || (geom_.channels_last ? x.size(-1) : x.size(1)) != channels)
    throw ShapeError(owner_ + " '" + name() + "' expects inputs of rank " + std::to_string(rank_ + 2) + " with " +
                     std::to_string(channels) + " channels. Received: " + shape_to_string(sizes_of(x)));
  for (int i = 0; i < rank_; ++i) {
    int64_t n = x.size(geom_.channels_last ? 1 + i : 2 + i);
    if (conv_utils::output_length(n, geom_.kernel_size[i], geom_.strides[i], geom_.dilation_rate[i], geom_.padding) < 1)
      throw ShapeError(owner_ + " '" + name() + "': the input of shape " + shape_to_string(sizes_of(x)) +
                       " is smaller than the (dilated) kernel " + int_list_json(geom_.kernel_size).dump() +
                       " with padding=\"valid\"");
  }
  at::Tensor y = impl_->apply(x, value(kernel_));
  // A separate add, not at::convolution's bias: on LibTorch 2.11's oneDNN
  // path the fused bias measured no faster (bench/conv_bench, a few percent
  // slower, docs/PERFORMANCE.md), and cuDNN adds it as a separate op anyway.
  if (bias_) {
    at::Tensor b = value(bias_);
    if (!geom_.channels_last) {
      std::vector<int64_t> shape(rank_ + 1, 1);
      shape[0] = options_.filters;
      b = b.reshape(shape);
    }
    y = y + b;
  }
  y = activation_(y);
  if (options_.activity_regularizer && training) add_loss((*options_.activity_regularizer)(y));
  return y;
}

std::vector<Shape> layers::Conv::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  const Shape& s = input_shapes.at(0);
  Shape out = {s[0]};
  if (!geom_.channels_last) out.push_back(options_.filters);
  for (int i = 0; i < rank_; ++i) {
    int64_t n = s[geom_.channels_last ? 1 + i : 2 + i];
    int64_t len =
        conv_utils::output_length(n, geom_.kernel_size[i], geom_.strides[i], geom_.dilation_rate[i], geom_.padding);
    if (n >= 0 && len < 1)
      throw ShapeError(owner_ + " '" + name() + "': inputs of shape " + shape_to_string(s) +
                       " are smaller than the (dilated) kernel " + int_list_json(geom_.kernel_size).dump());
    out.push_back(len);
  }
  if (geom_.channels_last) out.push_back(options_.filters);
  return {out};
}

Json layers::Conv::get_config() const {
  Json j = base_config();
  write_fields(j, options_, conv_fields(rank_));
  return j;
}

layers::Conv1DImpl::Conv1DImpl(const layers::ConvOptions& o)
    : layers::Conv(1, "Conv1D", o, layer_base_config(o.base)) {}
layers::Conv1DImpl::Conv1DImpl(const Json& config)
    : layers::Conv(1, "Conv1D", options_from_config(1, "Conv1D", config), config) {}
layers::Conv1DImpl::Conv1DImpl(int64_t filters, int64_t kernel_size, const std::string& activation, const Json& extra)
    : layers::Conv1DImpl(
          merged_config(extra, Json{{"filters", filters}, {"kernel_size", kernel_size}, {"activation", activation}})) {}

layers::Conv2DImpl::Conv2DImpl(const layers::ConvOptions& o)
    : layers::Conv(2, "Conv2D", o, layer_base_config(o.base)) {}
layers::Conv2DImpl::Conv2DImpl(const Json& config)
    : layers::Conv(2, "Conv2D", options_from_config(2, "Conv2D", config), config) {}
layers::Conv2DImpl::Conv2DImpl(int64_t filters, int64_t kernel_size, const std::string& activation, const Json& extra)
    : layers::Conv2DImpl(
          merged_config(extra, Json{{"filters", filters}, {"kernel_size", kernel_size}, {"activation", activation}})) {}
layers::Conv2DImpl::Conv2DImpl(int64_t filters, const std::vector<int64_t>& kernel_size, const std::string& activation,
                               const Json& extra)
    : layers::Conv2DImpl(
          merged_config(extra, Json{{"filters", filters}, {"kernel_size", kernel_size}, {"activation", activation}})) {}

KILN_REGISTER_LAYER_AS(Conv1D, layers::Conv1DImpl);
KILN_REGISTER_LAYER_AS(Conv2D, layers::Conv2DImpl);

}  // namespace kiln
