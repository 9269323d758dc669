#include "kiln/layers/group_norm.h"

#include "kiln/layers/config_fields.h"

namespace kiln {

namespace {
const FieldTable<layers::GroupNormalizationOptions>& group_norm_fields() {
  using O = layers::GroupNormalizationOptions;
  static const FieldTable<O> t =
      FieldTable<O>{
          field("groups", &O::groups).where([](int64_t g) { return g > 0 || g == -1; }, "a positive integer, or -1"),
          field("axis", &O::axis),
          field("epsilon", &O::epsilon).where([](double e) { return e >= 0; }, "a non-negative number"),
          field("center", &O::center),
          field("scale", &O::scale),
      } +
      beta_gamma_fields<O>();
  return t;
}
}  // namespace

layers::GroupNormalizationOptions layers::GroupNormalizationImpl::options_from_config(const Json& config) {
  return read_fields(config, "GroupNormalization", group_norm_fields());
}

layers::GroupNormalizationImpl::GroupNormalizationImpl(const layers::GroupNormalizationOptions& o)
    : layers::GroupNormalizationImpl(o, layer_base_config(o.base)) {}

layers::GroupNormalizationImpl::GroupNormalizationImpl(const Json& config)
    : layers::GroupNormalizationImpl(options_from_config(config), config) {}

layers::GroupNormalizationImpl::GroupNormalizationImpl(const layers::GroupNormalizationOptions& o,
                                                       const Json& base_config)
    : SimpleLayer(base_config), options_(o) {
  check_fields("GroupNormalization", options_, group_norm_fields());
}

void layers::GroupNormalizationImpl::build(const std::vector<Shape>& input_shapes) {
  const Shape& s = input_shapes.at(0);
  const int64_t rank = (int64_t)s.size();
  const layers::GroupNormalizationOptions& o = options_;
  resolved_axis_ = o.axis < 0 ? o.axis + rank : o.axis;
  if (rank < 2 || resolved_axis_ < 1 || resolved_axis_ >= rank)
    throw ValueError("GroupNormalization '" + name() + "': axis=" + std::to_string(o.axis) +
                     " is not a non-batch axis of inputs of shape " + shape_to_string(s));
  channels_ = s[resolved_axis_];
  if (channels_ < 1)
    throw ShapeError("GroupNormalization '" + name() + "': axis " + std::to_string(resolved_axis_) +
                     " must have a known size. Received input shape " + shape_to_string(s));
  groups_ = o.groups == -1 ? channels_ : o.groups;
  if (groups_ > channels_ || channels_ % groups_ != 0)
    throw ValueError("GroupNormalization '" + name() + "': the number of channels (" + std::to_string(channels_) +
                     ") must be a multiple of the number of groups (" + std::to_string(groups_) +
                     "). Received input shape " + shape_to_string(s));
  if (o.scale) gamma_ = add_weight("gamma", {channels_}, o.gamma_initializer.resolved(), true, o.gamma_regularizer);
  if (o.center) beta_ = add_weight("beta", {channels_}, o.beta_initializer.resolved(), true, o.beta_regularizer);
}

at::Tensor layers::GroupNormalizationImpl::call1(const at::Tensor& x, bool training) {
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
  at::Tensor y = at::group_norm(t, groups_, g, b, options_.epsilon, /*cudnn_enabled=*/false);
  return y.movedim(1, a).to(out_dtype);
}

std::vector<Shape> layers::GroupNormalizationImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  return input_shapes;
}

Json layers::GroupNormalizationImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, group_norm_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(GroupNormalization, layers::GroupNormalizationImpl);

}  // namespace kiln
