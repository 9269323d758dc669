#include "kiln/layers/normalization.h"

#include <algorithm>

#include "kiln/core/json_limits.h"
#include "kiln/layers/config_reader.h"

namespace kiln {
namespace {

// Statistics are fragile in 16 bits: like Keras, these layers work in at
// least float32 (the variable dtype under the mixed policies) and hand back
// the compute dtype.
at::ScalarType stat_dtype(at::ScalarType compute) { return at::promote_types(compute, at::kFloat); }
at::Tensor stat_value(const VariablePtr& v, at::ScalarType dt) { return v->value().to(dt); }

}  // namespace

// --- BatchNormalization -------------------------------------------------------
BatchNormalization::BatchNormalization(const Json& config) : SimpleLayer(config) {
  ConfigReader r(config, "BatchNormalization");
  axis_ = r.integer("axis", -1);
  momentum_ = r.number_in("momentum", 0.99, 0.0, 1.0);
  epsilon_ = r.number("epsilon", 1e-3);
  if (!(epsilon_ > 0)) r.invalid("epsilon", "a positive number");
  center_ = r.boolean("center", true);
  scale_ = r.boolean("scale", true);
  beta_init_ = r.initializer("beta_initializer", "zeros");
  gamma_init_ = r.initializer("gamma_initializer", "ones");
  mean_init_ = r.initializer("moving_mean_initializer", "zeros");
  var_init_ = r.initializer("moving_variance_initializer", "ones");
  beta_reg_ = r.regularizer("beta_regularizer");
  gamma_reg_ = r.regularizer("gamma_regularizer");
  r.no_constraint("beta_constraint");
  r.no_constraint("gamma_constraint");
  if (r.boolean("synchronized", false))
    r.invalid("synchronized", "false (cross-replica statistics are not supported yet)");
  r.finish();
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
  const auto dt = stat_dtype(x.scalar_type());
  at::Tensor xf = x.to(dt);
  std::vector<int64_t> reduce, bshape(rank, 1);
  for (int64_t i = 0; i < rank; ++i)
    if (i != resolved_axis_) reduce.push_back(i);
  bshape[resolved_axis_] = c;
  at::Tensor mean, var;
  if (training && trainable()) {
    mean = xf.mean(reduce);
    var = (xf - mean.reshape(bshape)).square().mean(reduce);
    at::NoGradGuard ng;
    const double m = momentum_;
    moving_mean_->assign(moving_mean_->value() * m + mean.detach().to(moving_mean_->dtype()) * (1.0 - m));
    moving_variance_->assign(moving_variance_->value() * m + var.detach().to(moving_variance_->dtype()) * (1.0 - m));
  } else {
    mean = stat_value(moving_mean_, dt);
    var = stat_value(moving_variance_, dt);
  }
  at::Tensor inv = at::rsqrt(var + epsilon_);
  if (gamma_) inv = inv * stat_value(gamma_, dt);
  at::Tensor y = (xf - mean.reshape(bshape)) * inv.reshape(bshape);
  if (beta_) y = y + stat_value(beta_, dt).reshape(bshape);
  return y.to(x.scalar_type());
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
  j["synchronized"] = false;
  return j;
}

KILN_REGISTER_LAYER(BatchNormalization);

// --- LayerNormalization -------------------------------------------------------
LayerNormalization::LayerNormalization(const Json& config) : SimpleLayer(config) {
  ConfigReader r(config, "LayerNormalization");
  const Json* a = r.get("axis");
  axis_json_ = a ? *a : Json(-1);
  const std::string expected = "an integer or a non-empty list of distinct integers";
  if (axis_json_.is_number_integer()) {
    axes_ = {axis_json_.get<int64_t>()};
  } else if (axis_json_.is_array() && !axis_json_.empty()) {
    for (auto& e : axis_json_) {
      if (!e.is_number_integer()) r.invalid("axis", expected);
      axes_.push_back(e.get<int64_t>());
    }
  } else {
    r.invalid("axis", expected);
  }
  epsilon_ = r.number("epsilon", 1e-3);
  if (!(epsilon_ > 0)) r.invalid("epsilon", "a positive number");
  center_ = r.boolean("center", true);
  scale_ = r.boolean("scale", true);
  rms_scaling_ = r.boolean("rms_scaling", false);
  beta_init_ = r.initializer("beta_initializer", "zeros");
  gamma_init_ = r.initializer("gamma_initializer", "ones");
  beta_reg_ = r.regularizer("beta_regularizer");
  gamma_reg_ = r.regularizer("gamma_regularizer");
  r.no_constraint("beta_constraint");
  r.no_constraint("gamma_constraint");
  r.finish();
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
