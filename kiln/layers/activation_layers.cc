#include "kiln/layers/activation_layers.h"

#include <algorithm>

#include "kiln/layers/config_reader.h"

namespace kiln {
namespace {

std::vector<Shape> act_same_shapes(Layer& l, const std::vector<Shape>& s) {
  l.build_if_needed(s);
  return s;
}

// An int or a list of ints; `what` names the expectation in errors.
std::vector<int64_t> act_int_or_list(ConfigReader& r, const char* key, const Json& j) {
  std::vector<int64_t> out;
  if (j.is_number_integer()) return {j.get<int64_t>()};
  if (!j.is_array() || j.empty()) r.invalid(key, "an integer or a non-empty list of integers");
  for (auto& e : j) {
    if (!e.is_number_integer()) r.invalid(key, "an integer or a non-empty list of integers");
    out.push_back(e.get<int64_t>());
  }
  return out;
}

}  // namespace

// --- ReLU ---------------------------------------------------------------------
ReLUOptions ReLU::options_from_config(const Json& config) {
  ConfigReader r(config, "ReLU");
  ReLUOptions o;
  if (r.has("max_value")) {
    o.max_value = r.number("max_value", 0.0);
    if (*o.max_value < 0) r.invalid("max_value", "a non-negative number or null");
  } else {
    r.get("max_value");
  }
  o.negative_slope = r.number("negative_slope", 0.0);
  if (o.negative_slope < 0) r.invalid("negative_slope", "a non-negative number");
  o.threshold = r.number("threshold", 0.0);
  if (o.threshold < 0) r.invalid("threshold", "a non-negative number");
  r.finish();
  return o;
}

ReLU::ReLU(const ReLUOptions& o) : ReLU(o, layer_base_config(o.base)) {}

ReLU::ReLU(const Json& config) : ReLU(options_from_config(config), config) {}

ReLU::ReLU(const ReLUOptions& o, const Json& base_config) : SimpleLayer(base_config) {
  if (o.max_value && !(*o.max_value >= 0))
    option_check::invalid("ReLU", "max_value", "a non-negative number or null", *o.max_value);
  if (!(o.negative_slope >= 0))
    option_check::invalid("ReLU", "negative_slope", "a non-negative number", o.negative_slope);
  if (!(o.threshold >= 0)) option_check::invalid("ReLU", "threshold", "a non-negative number", o.threshold);
  max_value_ = o.max_value;
  negative_slope_ = o.negative_slope;
  threshold_ = o.threshold;
}

at::Tensor ReLU::call1(const at::Tensor& x, bool training) {
  // Keras 3's activations.relu, term by term.
  if (negative_slope_ != 0.0 && !max_value_ && threshold_ == 0.0) return at::leaky_relu(x, negative_slope_);
  at::Tensor y = threshold_ != 0.0 ? x * at::gt(x, threshold_).to(x.scalar_type()) : at::relu(x);
  if (max_value_) y = at::clamp(y, 0.0, *max_value_);
  if (negative_slope_ != 0.0) y = y - negative_slope_ * at::relu(threshold_ - x);
  return y;
}

std::vector<Shape> ReLU::compute_output_shape(const std::vector<Shape>& s) { return act_same_shapes(*this, s); }

Json ReLU::get_config() const {
  Json j = base_config();
  j["max_value"] = max_value_ ? Json(*max_value_) : Json(nullptr);
  j["negative_slope"] = negative_slope_;
  j["threshold"] = threshold_;
  return j;
}

KILN_REGISTER_LAYER(ReLU);

// --- LeakyReLU ------------------------------------------------------------------
LeakyReLUOptions LeakyReLU::options_from_config(const Json& config) {
  ConfigReader r(config, "LeakyReLU");
  if (r.has("alpha") && r.has("negative_slope"))
    throw ValueError("LeakyReLU: give `negative_slope` only (`alpha` is its legacy name). Received both");
  const char* key = r.has("alpha") ? "alpha" : "negative_slope";
  if (key[0] == 'a')
    r.get("negative_slope");
  else
    r.get("alpha");
  LeakyReLUOptions o;
  o.negative_slope = r.number(key, 0.3);
  if (o.negative_slope < 0) r.invalid(key, "a non-negative number");
  r.finish();
  return o;
}

LeakyReLU::LeakyReLU(const LeakyReLUOptions& o) : LeakyReLU(o, layer_base_config(o.base)) {}

LeakyReLU::LeakyReLU(const Json& config) : LeakyReLU(options_from_config(config), config) {}

LeakyReLU::LeakyReLU(const LeakyReLUOptions& o, const Json& base_config) : SimpleLayer(base_config) {
  if (!(o.negative_slope >= 0))
    option_check::invalid("LeakyReLU", "negative_slope", "a non-negative number", o.negative_slope);
  negative_slope_ = o.negative_slope;
}

LeakyReLU::LeakyReLU(double negative_slope, const Json& extra)
    : LeakyReLU(merged_config(extra, Json{{"negative_slope", negative_slope}})) {}

at::Tensor LeakyReLU::call1(const at::Tensor& x, bool training) { return at::leaky_relu(x, negative_slope_); }

std::vector<Shape> LeakyReLU::compute_output_shape(const std::vector<Shape>& s) { return act_same_shapes(*this, s); }

Json LeakyReLU::get_config() const {
  Json j = base_config();
  j["negative_slope"] = negative_slope_;
  return j;
}

KILN_REGISTER_LAYER(LeakyReLU);

// --- PReLU -------------------------------------------------------------------------
PReLU::PReLU(const Json& config) : SimpleLayer(config) {
  ConfigReader r(config, "PReLU");
  alpha_init_ = r.initializer("alpha_initializer", "zeros");
  alpha_reg_ = r.regularizer("alpha_regularizer");
  r.no_constraint("alpha_constraint");
  if (const Json* s = r.get("shared_axes")) {
    shared_axes_ = act_int_or_list(r, "shared_axes", *s);
    for (auto a : shared_axes_)
      if (a < 1) r.invalid("shared_axes", "1-based axes (1 is the first axis after the batch axis)");
    shared_axes_json_ = *s;
  } else {
    shared_axes_json_ = nullptr;
  }
  r.finish();
}

void PReLU::build(const std::vector<Shape>& input_shapes) {
  const Shape& s = input_shapes.at(0);
  Shape alpha_shape(s.begin() + 1, s.end());
  for (auto a : shared_axes_) {
    if (a >= (int64_t)s.size())
      throw ValueError("PReLU '" + name() + "': shared_axes=" + shared_axes_json_.dump() +
                       " names an axis beyond inputs of shape " + shape_to_string(s));
    alpha_shape[a - 1] = 1;
  }
  for (size_t i = 0; i < alpha_shape.size(); ++i)
    if (alpha_shape[i] < 1)
      throw ShapeError("PReLU '" + name() + "' needs every non-shared axis known. Received input shape " +
                       shape_to_string(s) + "; share the unknown axes with `shared_axes`");
  alpha_ = add_weight("alpha", alpha_shape, alpha_init_, true, alpha_reg_);
}

at::Tensor PReLU::call1(const at::Tensor& x, bool training) {
  // Keras: relu(x) - alpha * relu(-x).
  return at::relu(x) - value(alpha_) * at::relu(-x);
}

std::vector<Shape> PReLU::compute_output_shape(const std::vector<Shape>& s) { return act_same_shapes(*this, s); }

Json PReLU::get_config() const {
  Json j = base_config();
  j["alpha_initializer"] = alpha_init_->to_json();
  j["alpha_regularizer"] = regularizer_json(alpha_reg_);
  j["alpha_constraint"] = nullptr;
  j["shared_axes"] = shared_axes_json_;
  return j;
}

KILN_REGISTER_LAYER(PReLU);

// --- Softmax -----------------------------------------------------------------------
SoftmaxOptions Softmax::options_from_config(const Json& config) {
  ConfigReader r(config, "Softmax");
  SoftmaxOptions o;
  if (const Json* a = r.get("axis")) {
    std::vector<int64_t> axes = act_int_or_list(r, "axis", *a);
    if (a->is_number_integer())
      o.axis = axes[0];
    else
      o.axis = axes;
  }
  r.finish();
  return o;
}

Softmax::Softmax(const SoftmaxOptions& o) : Softmax(o, layer_base_config(o.base)) {}

Softmax::Softmax(const Json& config) : Softmax(options_from_config(config), config) {}

Softmax::Softmax(const SoftmaxOptions& o, const Json& base_config) : SimpleLayer(base_config) {
  if (const auto* one = std::get_if<int64_t>(&o.axis)) {
    axes_ = {*one};
    axis_json_ = *one;
  } else {
    axes_ = std::get<std::vector<int64_t>>(o.axis);
    axis_json_ = axes_;
    if (axes_.empty())
      option_check::invalid("Softmax", "axis", "an integer or a non-empty list of integers", axis_json_);
  }
}

at::Tensor Softmax::call1(const at::Tensor& x, bool training) {
  std::vector<int64_t> dims;
  for (auto a : axes_) {
    int64_t d = a < 0 ? a + x.dim() : a;
    if (d < 0 || d >= x.dim() || std::count(dims.begin(), dims.end(), d))
      throw ValueError("Softmax '" + name() + "': axis=" + axis_json_.dump() +
                       " does not name distinct axes of an input of rank " + std::to_string(x.dim()));
    dims.push_back(d);
  }
  if (dims.size() == 1) return at::softmax(x, dims[0]);
  return at::exp(x - at::logsumexp(x, dims, /*keepdim=*/true));
}

std::vector<Shape> Softmax::compute_output_shape(const std::vector<Shape>& s) { return act_same_shapes(*this, s); }

Json Softmax::get_config() const {
  Json j = base_config();
  j["axis"] = axis_json_;
  return j;
}

KILN_REGISTER_LAYER(Softmax);

}  // namespace kiln
