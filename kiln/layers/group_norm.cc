#include "kiln/layers/group_norm.h"

#include "kiln/layers/config_reader.h"

namespace kiln {

GroupNormalizationOptions GroupNormalization::options_from_config(const Json& config) {
  ConfigReader r(config, "GroupNormalization");
  GroupNormalizationOptions o;
  o.groups = r.integer("groups", 32);
  if (o.groups == 0 || o.groups < -1) r.invalid("groups", "a positive integer, or -1");
  o.axis = r.integer("axis", -1);
  o.epsilon = r.number("epsilon", 1e-3);
  if (!(o.epsilon >= 0)) r.invalid("epsilon", "a non-negative number");
  o.center = r.boolean("center", true);
  o.scale = r.boolean("scale", true);
  o.beta_initializer = r.initializer("beta_initializer", "zeros");
  o.gamma_initializer = r.initializer("gamma_initializer", "ones");
  o.beta_regularizer = r.regularizer("beta_regularizer");
  o.gamma_regularizer = r.regularizer("gamma_regularizer");
  r.no_constraint("beta_constraint");
  r.no_constraint("gamma_constraint");
  r.finish();
  return o;
}

GroupNormalization::GroupNormalization(const GroupNormalizationOptions& o)
    : GroupNormalization(o, layer_base_config(o.base)) {}

GroupNormalization::GroupNormalization(const Json& config) : GroupNormalization(options_from_config(config), config) {}

GroupNormalization::GroupNormalization(const GroupNormalizationOptions& o, const Json& base_config)
    : SimpleLayer(base_config) {
  const std::string owner = "GroupNormalization";
  if (o.groups == 0 || o.groups < -1) option_check::invalid(owner, "groups", "a positive integer, or -1", o.groups);
  if (!(o.epsilon >= 0)) option_check::invalid(owner, "epsilon", "a non-negative number", o.epsilon);
  groups_config_ = o.groups;
  axis_ = o.axis;
  epsilon_ = o.epsilon;
  center_ = o.center;
  scale_ = o.scale;
  beta_init_ = o.beta_initializer.resolve(owner, "beta_initializer");
  gamma_init_ = o.gamma_initializer.resolve(owner, "gamma_initializer");
  beta_reg_ = o.beta_regularizer;
  gamma_reg_ = o.gamma_regularizer;
}

void GroupNormalization::build(const std::vector<Shape>& input_shapes) {
  const Shape& s = input_shapes.at(0);
  const int64_t rank = (int64_t)s.size();
  resolved_axis_ = axis_ < 0 ? axis_ + rank : axis_;
  if (rank < 2 || resolved_axis_ < 1 || resolved_axis_ >= rank)
    throw ValueError("GroupNormalization '" + name() + "': axis=" + std::to_string(axis_) +
                     " is not a non-batch axis of inputs of shape " + shape_to_string(s));
  channels_ = s[resolved_axis_];
  if (channels_ < 1)
    throw ShapeError("GroupNormalization '" + name() + "': axis " + std::to_string(resolved_axis_) +
                     " must have a known size. Received input shape " + shape_to_string(s));
  groups_ = groups_config_ == -1 ? channels_ : groups_config_;
  if (groups_ > channels_ || channels_ % groups_ != 0)
    throw ValueError("GroupNormalization '" + name() + "': the number of channels (" + std::to_string(channels_) +
                     ") must be a multiple of the number of groups (" + std::to_string(groups_) +
                     "). Received input shape " + shape_to_string(s));
  if (scale_) gamma_ = add_weight("gamma", {channels_}, gamma_init_, true, gamma_reg_);
  if (center_) beta_ = add_weight("beta", {channels_}, beta_init_, true, beta_reg_);
}

at::Tensor GroupNormalization::call1(const at::Tensor& x, bool training) {
  const int64_t a = resolved_axis_;
  if (x.dim() != (int64_t)build_input_shapes().at(0).size() || x.size(a) != channels_)
    throw ShapeError("GroupNormalization '" + name() + "' was built for inputs of shape " +
                     shape_to_string(build_input_shapes().at(0)) + ". Received " + shape_to_string(sizes_of(x)));
  const at::ScalarType out_dtype = x.scalar_type();
  const at::ScalarType stat = at::promote_types(out_dtype, at::kFloat);
  at::Tensor t = x.to(stat).movedim(a, 1);
  // LibTorch 2.11's CPU group_norm backward for channels-last inputs with
  // fewer than 2048 positions per channel writes the input's gradient even
  // when none was asked for, through a null pointer: it crashed training of
  // any model whose first layer is a channels_last GroupNormalization
  // (gradients for gamma and beta only). An input that needs no gradient
  // therefore goes in as a contiguous channels-first tensor, which takes the
  // kernel without that bug; one that needs it keeps its layout.
  if (!t.requires_grad() && t.device().is_cpu() && !t.is_contiguous()) t = t.contiguous();
  at::Tensor g = gamma_ ? gamma_->value().to(stat) : at::Tensor();
  at::Tensor b = beta_ ? beta_->value().to(stat) : at::Tensor();
  at::Tensor y = at::group_norm(t, groups_, g, b, epsilon_, /*cudnn_enabled=*/false);
  return y.movedim(1, a).to(out_dtype);
}

std::vector<Shape> GroupNormalization::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  return input_shapes;
}

Json GroupNormalization::get_config() const {
  Json j = base_config();
  j["groups"] = groups_config_;
  j["axis"] = axis_;
  j["epsilon"] = epsilon_;
  j["center"] = center_;
  j["scale"] = scale_;
  j["beta_initializer"] = beta_init_->to_json();
  j["gamma_initializer"] = gamma_init_->to_json();
  j["beta_regularizer"] = regularizer_json(beta_reg_);
  j["gamma_regularizer"] = regularizer_json(gamma_reg_);
  j["beta_constraint"] = nullptr;
  j["gamma_constraint"] = nullptr;
  return j;
}

KILN_REGISTER_LAYER(GroupNormalization);

}  // namespace kiln
