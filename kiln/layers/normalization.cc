#include "kiln/layers/normalization.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "kiln/core/json_limits.h"
#include "kiln/layers/config_reader.h"
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
BatchNormalizationOptions BatchNormalization::options_from_config(const Json& config) {
  ConfigReader r(config, "BatchNormalization");
  BatchNormalizationOptions o;
  o.axis = r.integer("axis", -1);
  o.momentum = r.number_in("momentum", 0.99, 0.0, 1.0);
  o.epsilon = r.number("epsilon", 1e-3);
  if (!(o.epsilon > 0)) r.invalid("epsilon", "a positive number");
  o.center = r.boolean("center", true);
  o.scale = r.boolean("scale", true);
  o.beta_initializer = r.initializer("beta_initializer", "zeros");
  o.gamma_initializer = r.initializer("gamma_initializer", "ones");
  o.moving_mean_initializer = r.initializer("moving_mean_initializer", "zeros");
  o.moving_variance_initializer = r.initializer("moving_variance_initializer", "ones");
  o.beta_regularizer = r.regularizer("beta_regularizer");
  o.gamma_regularizer = r.regularizer("gamma_regularizer");
  r.no_constraint("beta_constraint");
  r.no_constraint("gamma_constraint");
  o.synchronized = r.boolean("synchronized", false);
  r.finish();
  return o;
}

BatchNormalization::BatchNormalization(const BatchNormalizationOptions& o)
    : BatchNormalization(o, layer_base_config(o.base)) {}

BatchNormalization::BatchNormalization(const Json& config) : BatchNormalization(options_from_config(config), config) {}

BatchNormalization::BatchNormalization(const BatchNormalizationOptions& o, const Json& base_config)
    : SimpleLayer(base_config) {
  const std::string owner = "BatchNormalization";
  axis_ = o.axis;
  momentum_ = option_check::in_range(owner, "momentum", o.momentum, 0.0, 1.0);
  epsilon_ = o.epsilon;
  if (!(epsilon_ > 0)) option_check::invalid(owner, "epsilon", "a positive number", epsilon_);
  center_ = o.center;
  scale_ = o.scale;
  synchronized_ = o.synchronized;
  beta_init_ = o.beta_initializer.resolve(owner, "beta_initializer");
  gamma_init_ = o.gamma_initializer.resolve(owner, "gamma_initializer");
  mean_init_ = o.moving_mean_initializer.resolve(owner, "moving_mean_initializer");
  var_init_ = o.moving_variance_initializer.resolve(owner, "moving_variance_initializer");
  beta_reg_ = o.beta_regularizer;
  gamma_reg_ = o.gamma_regularizer;
}

BatchNormalization::BatchNormalization(int64_t axis, double momentum, double epsilon, const Json& extra)
    : BatchNormalization(merged_config(extra, Json{{"axis", axis}, {"momentum", momentum}, {"epsilon", epsilon}})) {}

void BatchNormalization::build(const std::vector<Shape>& input_shapes) {
  const Shape& s = input_shapes.at(0);
  const int64_t rank = (int64_t)s.size();
  resolved_axis_ = axis_ < 0 ? axis_ + rank : axis_;
  if (rank < 2 || resolved_axis_ < 1 || resolved_axis_ >= rank)
    throw ValueError("BatchNormalization '" + name() + "': axis=" + std::to_string(axis_) +
                     " is not a feature axis of inputs of shape " + shape_to_string(s));
  const int64_t c = s[resolved_axis_];
  if (c < 1)
    throw ShapeError("BatchNormalization '" + name() + "': axis " + std::to_string(axis_) +
                     " of the input must have a known size. Received: " + shape_to_string(s));
  if (scale_) gamma_ = add_weight("gamma", {c}, gamma_init_, true, gamma_reg_);
  if (center_) beta_ = add_weight("beta", {c}, beta_init_, true, beta_reg_);
  moving_mean_ = add_weight("moving_mean", {c}, mean_init_, false);
  moving_variance_ = add_weight("moving_variance", {c}, var_init_, false);
}

at::Tensor BatchNormalization::call1(const at::Tensor& x, bool training) {
  const int64_t c = moving_mean_->shape()[0];
  const int64_t rank = (int64_t)build_input_shapes().at(0).size();
  if (x.dim() != rank || x.size(resolved_axis_) != c)
    throw ShapeError("BatchNormalization '" + name() + "' was built for inputs of shape " +
                     shape_to_string(build_input_shapes().at(0)) + ". Received: " + shape_to_string(sizes_of(x)));
  const bool update = training && trainable();
  auto dist = synchronized_ && update ? distribution() : nullptr;
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
at::Tensor BatchNormalization::call_fused(const at::Tensor& x, bool update) {
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
    y = at::batch_norm(t, g, b, mean, unbiased, /*training=*/true, /*momentum=*/1.0, epsilon_, cudnn);
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
                       /*momentum=*/0.0, epsilon_, cudnn);
  }
  return channels_from_dim1(y, in, resolved_axis_).to(x.scalar_type());
}

// Training statistics written out: the synchronized path's cross-replica
// sums, and batches too small for the fused path's unbiased variance.
at::Tensor BatchNormalization::call_by_formula(const at::Tensor& x, Distribution* dist) {
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
  at::Tensor inv = at::rsqrt(var + epsilon_);
  if (gamma_) inv = inv * stat_value(gamma_, dt);
  at::Tensor y = (xf - mean.reshape(bshape)) * inv.reshape(bshape);
  if (beta_) y = y + stat_value(beta_, dt).reshape(bshape);
  return y.to(x.scalar_type());
}

// Keras: moving = moving * momentum + batch * (1 - momentum).
void BatchNormalization::update_moving_statistics(const at::Tensor& mean, const at::Tensor& var) {
  const double m = momentum_;
  moving_mean_->assign(moving_mean_->value() * m + mean.to(moving_mean_->dtype()) * (1.0 - m));
  moving_variance_->assign(moving_variance_->value() * m + var.to(moving_variance_->dtype()) * (1.0 - m));
}

std::vector<Shape> BatchNormalization::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  return input_shapes;
}

Json BatchNormalization::get_config() const {
  Json j = base_config();
  j["axis"] = axis_;
  j["momentum"] = momentum_;
  j["epsilon"] = epsilon_;
  j["center"] = center_;
  j["scale"] = scale_;
  j["beta_initializer"] = beta_init_->to_json();
  j["gamma_initializer"] = gamma_init_->to_json();
  j["moving_mean_initializer"] = mean_init_->to_json();
  j["moving_variance_initializer"] = var_init_->to_json();
  j["beta_regularizer"] = regularizer_json(beta_reg_);
  j["gamma_regularizer"] = regularizer_json(gamma_reg_);
  j["beta_constraint"] = nullptr;
  j["gamma_constraint"] = nullptr;
  j["synchronized"] = synchronized_;
  return j;
}

KILN_REGISTER_LAYER(BatchNormalization);

// --- LayerNormalization -------------------------------------------------------
LayerNormalizationOptions LayerNormalization::options_from_config(const Json& config) {
  ConfigReader r(config, "LayerNormalization");
  LayerNormalizationOptions o;
  const std::string expected = "an integer or a non-empty list of distinct integers";
  if (const Json* a = r.get("axis")) {
    if (a->is_number_integer()) {
      o.axis = a->get<int64_t>();
    } else if (a->is_array() && !a->empty()) {
      std::vector<int64_t> axes;
      for (auto& e : *a) {
        if (!e.is_number_integer()) r.invalid("axis", expected);
        axes.push_back(e.get<int64_t>());
      }
      o.axis = axes;
    } else {
      r.invalid("axis", expected);
    }
  }
  o.epsilon = r.number("epsilon", 1e-3);
  if (!(o.epsilon > 0)) r.invalid("epsilon", "a positive number");
  o.center = r.boolean("center", true);
  o.scale = r.boolean("scale", true);
  o.rms_scaling = r.boolean("rms_scaling", false);
  o.beta_initializer = r.initializer("beta_initializer", "zeros");
  o.gamma_initializer = r.initializer("gamma_initializer", "ones");
  o.beta_regularizer = r.regularizer("beta_regularizer");
  o.gamma_regularizer = r.regularizer("gamma_regularizer");
  r.no_constraint("beta_constraint");
  r.no_constraint("gamma_constraint");
  r.finish();
  return o;
}

LayerNormalization::LayerNormalization(const LayerNormalizationOptions& o)
    : LayerNormalization(o, layer_base_config(o.base)) {}

LayerNormalization::LayerNormalization(const Json& config) : LayerNormalization(options_from_config(config), config) {}

LayerNormalization::LayerNormalization(const LayerNormalizationOptions& o, const Json& base_config)
    : SimpleLayer(base_config) {
  const std::string owner = "LayerNormalization";
  if (const auto* one = std::get_if<int64_t>(&o.axis)) {
    axes_ = {*one};
    axis_json_ = *one;
  } else {
    axes_ = std::get<std::vector<int64_t>>(o.axis);
    axis_json_ = axes_;
    if (axes_.empty())
      option_check::invalid(owner, "axis", "an integer or a non-empty list of distinct integers", axis_json_);
  }
  epsilon_ = o.epsilon;
  if (!(epsilon_ > 0)) option_check::invalid(owner, "epsilon", "a positive number", epsilon_);
  center_ = o.center;
  scale_ = o.scale;
  rms_scaling_ = o.rms_scaling;
  beta_init_ = o.beta_initializer.resolve(owner, "beta_initializer");
  gamma_init_ = o.gamma_initializer.resolve(owner, "gamma_initializer");
  beta_reg_ = o.beta_regularizer;
  gamma_reg_ = o.gamma_regularizer;
}

LayerNormalization::LayerNormalization(int64_t axis, double epsilon, const Json& extra)
    : LayerNormalization(merged_config(extra, Json{{"axis", axis}, {"epsilon", epsilon}})) {}

void LayerNormalization::build(const std::vector<Shape>& input_shapes) {
  const Shape& s = input_shapes.at(0);
  const int64_t rank = (int64_t)s.size();
  resolved_.clear();
  for (auto a : axes_) {
    int64_t r = a < 0 ? a + rank : a;
    if (r < 1 || r >= rank || std::count(resolved_.begin(), resolved_.end(), r))
      throw ValueError("LayerNormalization '" + name() + "': axis=" + json_excerpt(axis_json_) +
                       " does not name distinct feature axes of inputs of shape " + shape_to_string(s));
    if (s[r] < 1)
      throw ShapeError("LayerNormalization '" + name() + "': axis " + std::to_string(a) +
                       " of the input must have a known size. Received: " + shape_to_string(s));
    resolved_.push_back(r);
  }
  std::sort(resolved_.begin(), resolved_.end());
  Shape param;
  for (auto r : resolved_) param.push_back(s[r]);
  if (scale_ || rms_scaling_) gamma_ = add_weight("gamma", param, gamma_init_, true, gamma_reg_);
  if (center_ && !rms_scaling_) beta_ = add_weight("beta", param, beta_init_, true, beta_reg_);
}

at::Tensor LayerNormalization::call1(const at::Tensor& x, bool training) {
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
  if (trailing && !rms_scaling_) {
    std::vector<int64_t> normalized(x.sizes().end() - resolved_.size(), x.sizes().end());
    y = at::layer_norm(xf, normalized, g, b, epsilon_);
  } else {
    std::vector<int64_t> bshape(rank, 1);
    for (auto r : resolved_) bshape[r] = x.size(r);
    if (rms_scaling_) {
      y = xf * at::rsqrt(xf.square().mean(resolved_, /*keepdim=*/true) + epsilon_);
    } else {
      at::Tensor mean = xf.mean(resolved_, /*keepdim=*/true);
      at::Tensor centred = xf - mean;
      y = centred * at::rsqrt(centred.square().mean(resolved_, /*keepdim=*/true) + epsilon_);
    }
    if (g.defined()) y = y * g.reshape(bshape);
    if (b.defined()) y = y + b.reshape(bshape);
  }
  return y.to(x.scalar_type());
}

std::vector<Shape> LayerNormalization::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  return input_shapes;
}

Json LayerNormalization::get_config() const {
  Json j = base_config();
  j["axis"] = axis_json_;
  j["epsilon"] = epsilon_;
  j["center"] = center_;
  j["scale"] = scale_;
  j["rms_scaling"] = rms_scaling_;
  j["beta_initializer"] = beta_init_->to_json();
  j["gamma_initializer"] = gamma_init_->to_json();
  j["beta_regularizer"] = regularizer_json(beta_reg_);
  j["gamma_regularizer"] = regularizer_json(gamma_reg_);
  j["beta_constraint"] = nullptr;
  j["gamma_constraint"] = nullptr;
  return j;
}

KILN_REGISTER_LAYER(LayerNormalization);

}  // namespace kiln
