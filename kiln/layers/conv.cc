#include "kiln/layers/conv.h"

#include "kiln/layers/config_reader.h"
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

ConvOptions Conv::options_from_config(int rank, const std::string& owner, const Json& config) {
  ConfigReader r(config, owner);
  ConvOptions o;
  o.filters = r.positive_int("filters");
  o.kernel_size = r.int_tuple("kernel_size", rank);
  o.strides = r.int_tuple("strides", rank, std::vector<int64_t>(rank, 1));
  o.padding = r.choice(
      "padding", "valid",
      rank == 1 ? std::vector<std::string>{"valid", "same", "causal"} : std::vector<std::string>{"valid", "same"});
  o.data_format = r.choice("data_format", "channels_last", {"channels_last", "channels_first"});
  o.dilation_rate = r.int_tuple("dilation_rate", rank, std::vector<int64_t>(rank, 1));
  o.groups = r.positive_int("groups", 1);
  read_kernel_options(r, o);
  r.finish();
  return o;
}

Conv::Conv(int rank, const std::string& owner, const ConvOptions& o, const Json& base_config)
    : SimpleLayer(base_config), rank_(rank), owner_(owner) {
  namespace check = option_check;
  filters_ = check::positive(owner, "filters", o.filters);
  geom_.kernel_size = check::tuple(owner, "kernel_size", o.kernel_size, rank);
  geom_.strides = check::tuple(owner, "strides", o.strides, rank);
  geom_.padding = check::choice(
      owner, "padding", o.padding,
      rank == 1 ? std::vector<std::string>{"valid", "same", "causal"} : std::vector<std::string>{"valid", "same"});
  geom_.channels_last =
      check::choice(owner, "data_format", o.data_format, {"channels_last", "channels_first"}) == "channels_last";
  geom_.dilation_rate = check::tuple(owner, "dilation_rate", o.dilation_rate, rank);
  geom_.groups = check::positive(owner, "groups", o.groups);
  activation_name_ = check::activation(owner, "activation", o.activation);
  use_bias_ = o.use_bias;
  kernel_init_ = o.kernel_initializer.resolve(owner, "kernel_initializer");
  bias_init_ = o.bias_initializer.resolve(owner, "bias_initializer");
  kernel_reg_ = o.kernel_regularizer;
  bias_reg_ = o.bias_regularizer;
  activity_reg_ = o.activity_regularizer;
  if (filters_ % geom_.groups != 0)
    check::invalid(owner, "groups", "a divisor of filters=" + std::to_string(filters_), geom_.groups);
  auto max_of = [](const std::vector<int64_t>& v) { return *std::max_element(v.begin(), v.end()); };
  if (max_of(geom_.strides) > 1 && max_of(geom_.dilation_rate) > 1)
    throw ValueError(
        owner + ": `strides > 1` not supported in conjunction with `dilation_rate > 1`. Received: strides=" +
        int_list_json(geom_.strides).dump() + " and dilation_rate=" + int_list_json(geom_.dilation_rate).dump());
  activation_ = get_activation(activation_name_);
  impl_ = float_conv_impl(geom_);
}

void Conv::build(const std::vector<Shape>& input_shapes) {
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
  kshape.push_back(filters_);
  kernel_ = add_weight("kernel", kshape, kernel_init_, true, kernel_reg_);
  if (use_bias_) bias_ = add_weight("bias", {filters_}, bias_init_, true, bias_reg_);
}

at::Tensor Conv::call1(const at::Tensor& x, bool training) {
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
      shape[0] = filters_;
      b = b.reshape(shape);
    }
    y = y + b;
  }
  y = activation_(y);
  if (activity_reg_ && training) add_loss((*activity_reg_)(y));
  return y;
}

std::vector<Shape> Conv::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  const Shape& s = input_shapes.at(0);
  Shape out = {s[0]};
  if (!geom_.channels_last) out.push_back(filters_);
  for (int i = 0; i < rank_; ++i) {
    int64_t n = s[geom_.channels_last ? 1 + i : 2 + i];
    int64_t len =
        conv_utils::output_length(n, geom_.kernel_size[i], geom_.strides[i], geom_.dilation_rate[i], geom_.padding);
    if (n >= 0 && len < 1)
      throw ShapeError(owner_ + " '" + name() + "': inputs of shape " + shape_to_string(s) +
                       " are smaller than the (dilated) kernel " + int_list_json(geom_.kernel_size).dump());
    out.push_back(len);
  }
  if (geom_.channels_last) out.push_back(filters_);
  return {out};
}

Json Conv::get_config() const {
  Json j = base_config();
  j["filters"] = filters_;
  j["kernel_size"] = geom_.kernel_size;
  j["strides"] = geom_.strides;
  j["padding"] = geom_.padding;
  j["data_format"] = geom_.channels_last ? "channels_last" : "channels_first";
  j["dilation_rate"] = geom_.dilation_rate;
  j["groups"] = geom_.groups;
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

Conv1D::Conv1D(const ConvOptions& o) : Conv(1, "Conv1D", o, layer_base_config(o.base)) {}
Conv1D::Conv1D(const Json& config) : Conv(1, "Conv1D", options_from_config(1, "Conv1D", config), config) {}
Conv1D::Conv1D(int64_t filters, int64_t kernel_size, const std::string& activation, const Json& extra)
    : Conv1D(
          merged_config(extra, Json{{"filters", filters}, {"kernel_size", kernel_size}, {"activation", activation}})) {}

Conv2D::Conv2D(const ConvOptions& o) : Conv(2, "Conv2D", o, layer_base_config(o.base)) {}
Conv2D::Conv2D(const Json& config) : Conv(2, "Conv2D", options_from_config(2, "Conv2D", config), config) {}
Conv2D::Conv2D(int64_t filters, int64_t kernel_size, const std::string& activation, const Json& extra)
    : Conv2D(
          merged_config(extra, Json{{"filters", filters}, {"kernel_size", kernel_size}, {"activation", activation}})) {}
Conv2D::Conv2D(int64_t filters, const std::vector<int64_t>& kernel_size, const std::string& activation,
               const Json& extra)
    : Conv2D(
          merged_config(extra, Json{{"filters", filters}, {"kernel_size", kernel_size}, {"activation", activation}})) {}

KILN_REGISTER_LAYER(Conv1D);
KILN_REGISTER_LAYER(Conv2D);

}  // namespace kiln
