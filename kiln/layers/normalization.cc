#include "kiln/layers/normalization.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "kiln/core/json_limits.h"
#include "kiln/layers/config_fields.h"
#include "kiln/layers/conv_utils.h"

namespace kiln {
namespace {

// Statistics are fragile in 16 bits: like Keras, these layers work in at
// least float32 (the variable dtype under the mixed policies) and hand back
// the compute dtype.
at::ScalarType stat_dtype(at::ScalarType compute) { return at::promote_types(compute, at::kFloat); }
at::Tensor stat_value(const VariablePtr& v, at::ScalarType dt) { return v->value().to(dt); }

// at::batch_norm normalises dim 1. Channels-last inputs of rank 4 and 5
// (Conv2D/Conv3D outputs: NHWC views of tensors in LibTorch's channels_last
// memory format) permute to an NCHW view in that format, which LibTorch's
// CPU kernels and cuDNN normalise where it lies; other channels-last inputs
// view as (rows, C), which the CPU kernel also reads in place; any other
// axis moves to dim 1. channels_from_dim1 undoes it (y shaped like x's
// channels_to_dim1).
at::Tensor channels_to_dim1(const at::Tensor& x, int64_t axis) {
  const int64_t rank = x.dim();
  if (axis == 1) return x;
  if (axis != rank - 1) return x.movedim(axis, 1);
  if (rank == 4 || rank == 5) return conv_utils::channels_last_to_first(x);
  return x.reshape({-1, x.size(axis)});
}
at::Tensor channels_from_dim1(const at::Tensor& y, const at::Tensor& x, int64_t axis) {
  const int64_t rank = x.dim();
  if (axis == 1) return y;
  if (axis != rank - 1) return y.movedim(1, axis);
  if (rank == 4 || rank == 5) return conv_utils::channels_first_to_last(y);
  return y.reshape(x.sizes());
}

// Sum across data-parallel replicas whose gradient is the sum of the
// replicas' gradients (each replica's loss depends on every replica's
// share of the sum).
struct AllReduceSum : public torch::autograd::Function<AllReduceSum> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, Distribution* dist) {
    ctx->saved_data["dist"] = reinterpret_cast<int64_t>(dist);
    std::vector<at::Tensor> t = {x.detach().clone()};
    dist->all_reduce_sum(t);
    return t[0];
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    auto* dist = reinterpret_cast<Distribution*>(ctx->saved_data["dist"].toInt());
    std::vector<at::Tensor> t = {grads[0].contiguous().clone()};
    dist->all_reduce_sum(t);
    return {t[0], at::Tensor()};
  }
};

}  // namespace

// --- BatchNormalization -------------------------------------------------------
namespace {
bool positive_number(double v) { return v > 0; }

const FieldTable<layers::BatchNormalizationOptions>& batch_norm_fields() {
  using O = layers::BatchNormalizationOptions;
  static const FieldTable<O> t = {field("axis", &O::axis),
                                  field("momentum", &O::momentum).in_range(0.0, 1.0),
                                  field("epsilon", &O::epsilon).where(positive_number, "a positive number"),
                                  field("center", &O::center),
                                  field("scale", &O::scale),
                                  field("beta_initializer", &O::beta_initializer),
                                  field("gamma_initializer", &O::gamma_initializer),
                                  field("moving_mean_initializer", &O::moving_mean_initializer),
                                  field("moving_variance_initializer", &O::moving_variance_initializer),
                                  field("beta_regularizer", &O::beta_regularizer),
                                  field("gamma_regularizer", &O::gamma_regularizer),
                                  no_constraint<O>("beta_constraint"),
                                  no_constraint<O>("gamma_constraint"),
                                  field("synchronized", &O::synchronized)};
  return t;
}

const FieldTable<layers::LayerNormalizationOptions>& layer_norm_fields() {
  using O = layers::LayerNormalizationOptions;
  static const FieldTable<O> t =
      FieldTable<O>{
          field("axis", &O::axis).described("an integer or a non-empty list of distinct integers"),
          field("epsilon", &O::epsilon).where(positive_number, "a positive number"),
          field("center", &O::center),
          field("scale", &O::scale),
          field("rms_scaling", &O::rms_scaling),
      } +
      beta_gamma_fields<O>();
  return t;
}
}  // namespace

layers::BatchNormalizationOptions layers::BatchNormalizationImpl::options_from_config(const Json& config) {
  return read_fields(config, "BatchNormalization", batch_norm_fields());
}

layers::BatchNormalizationImpl::BatchNormalizationImpl(const layers::BatchNormalizationOptions& o)
    : layers::BatchNormalizationImpl(o, layer_base_config(o.base)) {}

layers::BatchNormalizationImpl::BatchNormalizationImpl(const Json& config)
    : layers::BatchNormalizationImpl(options_from_config(config), config) {}

layers::BatchNormalizationImpl::BatchNormalizationImpl(const layers::BatchNormalizationOptions& o,
                                                       const Json& base_config)
    : SimpleLayer(base_config), options_(o) {
  check_fields("BatchNormalization", options_, batch_norm_fields());
}

layers::BatchNormalizationImpl::BatchNormalizationImpl(int64_t axis, double momentum, double epsilon, const Json& extra)
    : layers::BatchNormalizationImpl(
          merged_config(extra, Json{{"axis", axis}, {"momentum", momentum}, {"epsilon", epsilon}})) {}

void layers::BatchNormalizationImpl::build(const std::vector<Shape>& input_shapes) {
  const Shape& s = input_shapes.at(0);
  const int64_t rank = (int64_t)s.size();
  const layers::BatchNormalizationOptions& o = options_;
  resolved_axis_ = o.axis < 0 ? o.axis + rank : o.axis;
  if (rank < 2 || resolved_axis_ < 1 || resolved_axis_ >= rank)
    throw ValueError("BatchNormalization '" + name() + "': axis=" + std::to_string(o.axis) +
                     " is not a feature axis of inputs of shape " + shape_to_string(s));
  const int64_t c = s[resolved_axis_];
  if (c < 1)
    throw ShapeError("BatchNormalization '" + name() + "': axis " + std::to_string(o.axis) +
                     " of the input must have a known size. Received: " + shape_to_string(s));
  if (o.scale) gamma_ = add_weight("gamma", {c}, o.gamma_initializer.resolved(), true, o.gamma_regularizer);
  if (o.center) beta_ = add_weight("beta", {c}, o.beta_initializer.resolved(), true, o.beta_regularizer);
  moving_mean_ = add_weight("moving_mean", {c}, o.moving_mean_initializer.resolved(), false);
  moving_variance_ = add_weight("moving_variance", {c}, o.moving_variance_initializer.resolved(), false);
}

at::Tensor layers::BatchNormalizationImpl::call1(const at::Tensor& x, bool training) {
  const int64_t c = moving_mean_->shape()[0];
  const int64_t rank = (int64_t)build_input_shapes().at(0).size();
  if (x.dim() != rank || x.size(resolved_axis_) != c)
    throw ShapeError("BatchNormalization '" + name() + "' was built for inputs of shape " +
                     shape_to_string(build_input_shapes().at(0)) + ". Received: " + shape_to_string(sizes_of(x)));
  const bool update = training && trainable();
  auto dist = options_.synchronized && update ? distribution() : nullptr;
  if (dist && dist->num_replicas() > 1) return call_by_formula(x, dist.get());
  // Batches of fewer than two rows keep the formula's statistics (a single
  // row: variance 0, where LibTorch's unbiased running variance is 0/0).
  if (update && x.numel() / c < 2) return call_by_formula(x, nullptr);
  return call_fused(x, update);
}

// LibTorch's fused kernel (one pass for the statistics, one for the output;
// one backward kernel), as torch.nn.BatchNorm runs it: at::batch_norm picks
// cuDNN on the GPU and the channels-last CPU kernels for NHWC memory.
//
// Keras's moving statistics differ from LibTorch's running ones (the
// biased batch variance, momentum on the old value), so LibTorch updates two
// zeroed buffers with momentum 1: the batch mean and the unbiased batch
// variance of the statistics it normalised with (var_sum / (n - 1)), from
// which the biased one is var_sum / n to a rounding. That costs no extra
// pass over x; recomputing the variance from the saved inverse standard
// deviation (1 / invstd^2 - eps) would lose digits when var << eps.
at::Tensor layers::BatchNormalizationImpl::call_fused(const at::Tensor& x, bool update) {
  const int64_t c = moving_mean_->shape()[0];
  const auto dt = stat_dtype(x.scalar_type());
  const auto opts = x.options().dtype(dt);
  // bfloat16/float16 inputs go in as they are: LibTorch's kernels accumulate
  // in float32 with float32 parameters (its mixed-type path), as x.to(float)
  // first would, without the copy.
  at::Tensor in = at::isFloatingType(x.scalar_type()) ? x : x.to(dt);
  at::Tensor t = channels_to_dim1(in, resolved_axis_);
  // cuDNN runs only with both parameters; ones and zeros take no gradient.
  at::Tensor g = gamma_ ? stat_value(gamma_, dt) : at::ones({c}, opts);
  at::Tensor b = beta_ ? stat_value(beta_, dt) : at::zeros({c}, opts);
  const bool cudnn = at::globalContext().userEnabledCuDNN();
  at::Tensor y;
  if (update) {
    at::Tensor mean = at::zeros({c}, opts), unbiased = at::zeros({c}, opts);
    y = at::batch_norm(t, g, b, mean, unbiased, /*training=*/true, /*momentum=*/1.0, options_.epsilon, cudnn);
    const double n = static_cast<double>(t.numel() / c);
    at::NoGradGuard ng;
    update_moving_statistics(mean, unbiased * ((n - 1) / n));
  } else {
    // The backward reads the statistics it was given: copies, so that a
    // later update of the moving ones (a shared layer also called in
    // training) cannot invalidate the graph.
    auto moving = [&](const VariablePtr& v) {
      at::Tensor s = stat_value(v, dt);
      return at::GradMode::is_enabled() ? s.clone() : s;
    };
    y = at::batch_norm(t, g, b, moving(moving_mean_), moving(moving_variance_), /*training=*/false,
                       /*momentum=*/0.0, options_.epsilon, cudnn);
  }
  return channels_from_dim1(y, in, resolved_axis_).to(x.scalar_type());
}

// Training statistics written out: the synchronized path's cross-replica
// sums, and batches too small for the fused path's unbiased variance.
at::Tensor layers::BatchNormalizationImpl::call_by_formula(const at::Tensor& x, Distribution* dist) {
  const int64_t c = moving_mean_->shape()[0];
  const int64_t rank = x.dim();
  const auto dt = stat_dtype(x.scalar_type());
  at::Tensor xf = x.to(dt);
  std::vector<int64_t> reduce, bshape(rank, 1);
  for (int64_t i = 0; i < rank; ++i)
    if (i != resolved_axis_) reduce.push_back(i);
  bshape[resolved_axis_] = c;
  at::Tensor mean, var;
  if (dist) {
    // Sums over every replica's rows: [sum x, sum x^2, count] per channel.
    const double rows = static_cast<double>(xf.numel() / c);
    at::Tensor packed = at::cat({xf.sum(reduce), xf.square().sum(reduce), at::full({1}, rows, xf.options())});
    at::Tensor total = AllReduceSum::apply(packed, dist);
    at::Tensor n = total.narrow(0, 2 * c, 1);
    mean = total.narrow(0, 0, c) / n;
    var = (total.narrow(0, c, c) / n - mean.square()).clamp_min(0);
  } else {
    mean = xf.mean(reduce);
    var = (xf - mean.reshape(bshape)).square().mean(reduce);
  }
  {
    at::NoGradGuard ng;
    update_moving_statistics(mean.detach(), var.detach());
  }
  at::Tensor inv = at::rsqrt(var + options_.epsilon);
  if (gamma_) inv = inv * stat_value(gamma_, dt);
  at::Tensor y = (xf - mean.reshape(bshape)) * inv.reshape(bshape);
  if (beta_) y = y + stat_value(beta_, dt).reshape(bshape);
  return y.to(x.scalar_type());
}

// Keras: moving = moving * momentum + batch * (1 - momentum).
void layers::BatchNormalizationImpl::update_moving_statistics(const at::Tensor& mean, const at::Tensor& var) {
  const double m = options_.momentum;
  moving_mean_->assign(moving_mean_->value() * m + mean.to(moving_mean_->dtype()) * (1.0 - m));
  moving_variance_->assign(moving_variance_->value() * m + var.to(moving_variance_->dtype()) * (1.0 - m));
}

std::vector<Shape> layers::BatchNormalizationImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  return input_shapes;
}

Json layers::BatchNormalizationImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, batch_norm_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(BatchNormalization, layers::BatchNormalizationImpl);

// --- LayerNormalization -------------------------------------------------------
layers::LayerNormalizationOptions layers::LayerNormalizationImpl::options_from_config(const Json& config) {
  return read_fields(config, "LayerNormalization", layer_norm_fields());
}

layers::LayerNormalizationImpl::LayerNormalizationImpl(const layers::LayerNormalizationOptions& o)
    : layers::LayerNormalizationImpl(o, layer_base_config(o.base)) {}

layers::LayerNormalizationImpl::LayerNormalizationImpl(const Json& config)
    : layers::LayerNormalizationImpl(options_from_config(config), config) {}

layers::LayerNormalizationImpl::LayerNormalizationImpl(const layers::LayerNormalizationOptions& o,
                                                       const Json& base_config)
    : SimpleLayer(base_config), options_(o) {
  check_fields("LayerNormalization", options_, layer_norm_fields());
  const auto* one = std::get_if<int64_t>(&options_.axis);
  axes_ = one ? std::vector<int64_t>{*one} : std::get<std::vector<int64_t>>(options_.axis);
}

layers::LayerNormalizationImpl::LayerNormalizationImpl(int64_t axis, double epsilon, const Json& extra)
    : layers::LayerNormalizationImpl(merged_config(extra, Json{{"axis", axis}, {"epsilon", epsilon}})) {}

void layers::LayerNormalizationImpl::build(const std::vector<Shape>& input_shapes) {
  const Shape& s = input_shapes.at(0);
  const int64_t rank = (int64_t)s.size();
  resolved_.clear();
  for (auto a : axes_) {
    int64_t r = a < 0 ? a + rank : a;
    if (r < 1 || r >= rank || std::count(resolved_.begin(), resolved_.end(), r))
      throw ValueError("LayerNormalization '" + name() + "': axis=" + json_excerpt(int_or_list_json(options_.axis)) +
                       " does not name distinct feature axes of inputs of shape " + shape_to_string(s));
    if (s[r] < 1)
      throw ShapeError("LayerNormalization '" + name() + "': axis " + std::to_string(a) +
                       " of the input must have a known size. Received: " + shape_to_string(s));
    resolved_.push_back(r);
  }
  std::sort(resolved_.begin(), resolved_.end());
  Shape param;
  for (auto r : resolved_) param.push_back(s[r]);
  const layers::LayerNormalizationOptions& o = options_;
  if (o.scale || o.rms_scaling)
    gamma_ = add_weight("gamma", param, o.gamma_initializer.resolved(), true, o.gamma_regularizer);
  if (o.center && !o.rms_scaling)
    beta_ = add_weight("beta", param, o.beta_initializer.resolved(), true, o.beta_regularizer);
}

at::Tensor layers::LayerNormalizationImpl::call1(const at::Tensor& x, bool training) {
  const Shape& built = build_input_shapes().at(0);
  bool ok = x.dim() == (int64_t)built.size();
  for (size_t i = 0; ok && i < resolved_.size(); ++i) ok = x.size(resolved_[i]) == built[resolved_[i]];
  if (!ok)
    throw ShapeError("LayerNormalization '" + name() + "' was built for inputs of shape " + shape_to_string(built) +
                     ". Received: " + shape_to_string(sizes_of(x)));
  const auto dt = stat_dtype(x.scalar_type());
  at::Tensor xf = x.to(dt);
  at::Tensor g = gamma_ ? stat_value(gamma_, dt) : at::Tensor();
  at::Tensor b = beta_ ? stat_value(beta_, dt) : at::Tensor();
  const int64_t rank = x.dim();
  bool trailing = true;
  for (size_t i = 0; i < resolved_.size(); ++i)
    trailing = trailing && resolved_[i] == rank - (int64_t)resolved_.size() + (int64_t)i;
  at::Tensor y;
  if (trailing && !options_.rms_scaling) {
    std::vector<int64_t> normalized(x.sizes().end() - resolved_.size(), x.sizes().end());
    y = at::layer_norm(xf, normalized, g, b, options_.epsilon);
  } else {
    std::vector<int64_t> bshape(rank, 1);
    for (auto r : resolved_) bshape[r] = x.size(r);
    if (options_.rms_scaling) {
      y = xf * at::rsqrt(xf.square().mean(resolved_, /*keepdim=*/true) + options_.epsilon);
    } else {
      at::Tensor mean = xf.mean(resolved_, /*keepdim=*/true);
      at::Tensor centred = xf - mean;
      y = centred * at::rsqrt(centred.square().mean(resolved_, /*keepdim=*/true) + options_.epsilon);
    }
    if (g.defined()) y = y * g.reshape(bshape);
    if (b.defined()) y = y + b.reshape(bshape);
  }
  return y.to(x.scalar_type());
}

std::vector<Shape> layers::LayerNormalizationImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  return input_shapes;
}

Json layers::LayerNormalizationImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, layer_norm_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(LayerNormalization, layers::LayerNormalizationImpl);

}  // namespace kiln
