#include "kiln/layers/activation_layers.h"

#include <algorithm>

#include "kiln/layers/config_fields.h"

namespace kiln {
namespace {

std::vector<Shape> act_same_shapes(Layer& l, const std::vector<Shape>& s) {
  l.build_if_needed(s);
  return s;
}

// An int or a non-empty list of ints, in the form given.
IntOrList act_int_or_list(ConfigReader& r, const char* key, const Json& j) {
  std::vector<int64_t> out;
  if (j.is_number_integer()) return j.get<int64_t>();
  if (!j.is_array() || j.empty()) r.invalid(key, "an integer or a non-empty list of integers");
  for (auto& e : j) {
    if (!e.is_number_integer()) r.invalid(key, "an integer or a non-empty list of integers");
    out.push_back(e.get<int64_t>());
  }
  return out;
}

}  // namespace

// --- ReLU ---------------------------------------------------------------------
namespace {
bool non_negative(double v) { return v >= 0; }

const FieldTable<layers::ReLUOptions>& relu_fields() {
  using O = layers::ReLUOptions;
  static const FieldTable<O> t = {
      field("max_value", &O::max_value).where(non_negative, "a non-negative number or null"),
      field("negative_slope", &O::negative_slope).where(non_negative, "a non-negative number"),
      field("threshold", &O::threshold).where(non_negative, "a non-negative number")};
  return t;
}

// `alpha`, Keras 2's name of negative_slope, is read as it and never written.
const FieldTable<layers::LeakyReLUOptions>& leaky_relu_fields() {
  using O = layers::LeakyReLUOptions;
  static const FieldTable<O> t = [] {
    FieldDef<O> slope = field("negative_slope", &O::negative_slope).where(non_negative, "a non-negative number");
    slope.read = [](ConfigReader& r, O& o) {
      if (r.has("alpha") && r.has("negative_slope"))
        throw ValueError("LeakyReLU: give `negative_slope` only (`alpha` is its legacy name). Received both");
      const char* key = r.has("alpha") ? "alpha" : "negative_slope";
      r.get("alpha");  // both are known keys
      r.get("negative_slope");
      o.negative_slope = r.number(key, o.negative_slope);
      if (!non_negative(o.negative_slope)) r.invalid(key, "a non-negative number");
    };
    return FieldTable<O>{slope};
  }();
  return t;
}
}  // namespace

layers::ReLUOptions layers::ReLUImpl::options_from_config(const Json& config) {
  return read_fields(config, "ReLU", relu_fields());
}

layers::ReLUImpl::ReLUImpl(const layers::ReLUOptions& o) : layers::ReLUImpl(o, layer_base_config(o.base)) {}

layers::ReLUImpl::ReLUImpl(const Json& config) : layers::ReLUImpl(options_from_config(config), config) {}

layers::ReLUImpl::ReLUImpl(const layers::ReLUOptions& o, const Json& base_config)
    : SimpleLayer(base_config), options_(o) {
  check_fields("ReLU", options_, relu_fields());
}

at::Tensor layers::ReLUImpl::call1(const at::Tensor& x, bool training) {
  // Keras 3's activations.relu, term by term.
  const layers::ReLUOptions& o = options_;
  if (o.negative_slope != 0.0 && !o.max_value && o.threshold == 0.0) return at::leaky_relu(x, o.negative_slope);
  at::Tensor y = o.threshold != 0.0 ? x * at::gt(x, o.threshold).to(x.scalar_type()) : at::relu(x);
  if (o.max_value) y = at::clamp(y, 0.0, *o.max_value);
  if (o.negative_slope != 0.0) y = y - o.negative_slope * at::relu(o.threshold - x);
  return y;
}

std::vector<Shape> layers::ReLUImpl::compute_output_shape(const std::vector<Shape>& s) {
  return act_same_shapes(*this, s);
}

Json layers::ReLUImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, relu_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(ReLU, layers::ReLUImpl);

// --- LeakyReLU ------------------------------------------------------------------
layers::LeakyReLUOptions layers::LeakyReLUImpl::options_from_config(const Json& config) {
  return read_fields(config, "LeakyReLU", leaky_relu_fields());
}

layers::LeakyReLUImpl::LeakyReLUImpl(const layers::LeakyReLUOptions& o)
    : layers::LeakyReLUImpl(o, layer_base_config(o.base)) {}

layers::LeakyReLUImpl::LeakyReLUImpl(const Json& config) : layers::LeakyReLUImpl(options_from_config(config), config) {}

layers::LeakyReLUImpl::LeakyReLUImpl(const layers::LeakyReLUOptions& o, const Json& base_config)
    : SimpleLayer(base_config), options_(o) {
  check_fields("LeakyReLU", options_, leaky_relu_fields());
}

layers::LeakyReLUImpl::LeakyReLUImpl(double negative_slope, const Json& extra)
    : layers::LeakyReLUImpl(merged_config(extra, Json{{"negative_slope", negative_slope}})) {}

at::Tensor layers::LeakyReLUImpl::call1(const at::Tensor& x, bool training) {
  return at::leaky_relu(x, options_.negative_slope);
}

std::vector<Shape> layers::LeakyReLUImpl::compute_output_shape(const std::vector<Shape>& s) {
  return act_same_shapes(*this, s);
}

Json layers::LeakyReLUImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, leaky_relu_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(LeakyReLU, layers::LeakyReLUImpl);

// --- PReLU -------------------------------------------------------------------------
namespace {
// The axes of `v` (an int or a list); ValueError unless a non-empty list of 1-based axes.
std::vector<int64_t> prelu_shared_axes(const std::string& owner, const IntOrList& v) {
  const auto* one = std::get_if<int64_t>(&v);
  std::vector<int64_t> axes = one ? std::vector<int64_t>{*one} : std::get<std::vector<int64_t>>(v);
  if (axes.empty())
    option_check::invalid(owner, "shared_axes", "an integer or a non-empty list of integers", int_or_list_json(v));
  for (auto a : axes)
    if (a < 1)
      option_check::invalid(owner, "shared_axes", "1-based axes (1 is the first axis after the batch axis)",
                            int_or_list_json(v));
  return axes;
}

const FieldTable<layers::PReLUOptions>& prelu_fields() {
  using O = layers::PReLUOptions;
  const char* const shared_axes = "shared_axes";
  static const FieldTable<O> t = {
      field("alpha_initializer", &O::alpha_initializer), field("alpha_regularizer", &O::alpha_regularizer),
      no_constraint<O>("alpha_constraint"),
      FieldDef<O>{shared_axes,
                  [=](ConfigReader& r, O& o) {
                    const Json* j = r.get(shared_axes);
                    if (!j) return;
                    o.shared_axes = act_int_or_list(r, shared_axes, *j);
                    prelu_shared_axes(r.owner(), *o.shared_axes);
                  },
                  [=](const std::string& owner, O& o) {
                    if (o.shared_axes) prelu_shared_axes(owner, *o.shared_axes);
                  },
                  [=](Json& j, const O& o) {
                    j[shared_axes] = o.shared_axes ? int_or_list_json(*o.shared_axes) : Json(nullptr);
                  }}};
  return t;
}
}  // namespace

layers::PReLUOptions layers::PReLUImpl::options_from_config(const Json& config) {
  return read_fields(config, "PReLU", prelu_fields());
}

layers::PReLUImpl::PReLUImpl(const layers::PReLUOptions& o) : layers::PReLUImpl(o, layer_base_config(o.base)) {}

layers::PReLUImpl::PReLUImpl(const Json& config) : layers::PReLUImpl(options_from_config(config), config) {}

layers::PReLUImpl::PReLUImpl(const layers::PReLUOptions& o, const Json& base_config)
    : SimpleLayer(base_config), options_(o) {
  check_fields("PReLU", options_, prelu_fields());
  if (options_.shared_axes) shared_axes_ = prelu_shared_axes("PReLU", *options_.shared_axes);
}

void layers::PReLUImpl::build(const std::vector<Shape>& input_shapes) {
  const Shape& s = input_shapes.at(0);
  Shape alpha_shape(s.begin() + 1, s.end());
  for (auto a : shared_axes_) {
    if (a >= (int64_t)s.size())
      throw ValueError("PReLU '" + name() + "': shared_axes=" + int_or_list_json(*options_.shared_axes).dump() +
                       " names an axis beyond inputs of shape " + shape_to_string(s));
    alpha_shape[a - 1] = 1;
  }
  for (size_t i = 0; i < alpha_shape.size(); ++i)
    if (alpha_shape[i] < 1)
      throw ShapeError("PReLU '" + name() + "' needs every non-shared axis known. Received input shape " +
                       shape_to_string(s) + "; share the unknown axes with `shared_axes`");
  alpha_ = add_weight("alpha", alpha_shape, options_.alpha_initializer.resolved(), true, options_.alpha_regularizer);
}

at::Tensor layers::PReLUImpl::call1(const at::Tensor& x, bool training) {
  // Keras: relu(x) - alpha * relu(-x).
  return at::relu(x) - value(alpha_) * at::relu(-x);
}

std::vector<Shape> layers::PReLUImpl::compute_output_shape(const std::vector<Shape>& s) {
  return act_same_shapes(*this, s);
}

Json layers::PReLUImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, prelu_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(PReLU, layers::PReLUImpl);

// --- Softmax -----------------------------------------------------------------------
namespace {
const FieldTable<layers::SoftmaxOptions>& softmax_fields() {
  static const FieldTable<layers::SoftmaxOptions> t = {
      field("axis", &layers::SoftmaxOptions::axis).described("an integer or a non-empty list of integers")};
  return t;
}
}  // namespace

layers::SoftmaxOptions layers::SoftmaxImpl::options_from_config(const Json& config) {
  return read_fields(config, "Softmax", softmax_fields());
}

layers::SoftmaxImpl::SoftmaxImpl(const layers::SoftmaxOptions& o) : layers::SoftmaxImpl(o, layer_base_config(o.base)) {}

layers::SoftmaxImpl::SoftmaxImpl(const Json& config) : layers::SoftmaxImpl(options_from_config(config), config) {}

layers::SoftmaxImpl::SoftmaxImpl(const layers::SoftmaxOptions& o, const Json& base_config)
    : SimpleLayer(base_config), options_(o) {
  check_fields("Softmax", options_, softmax_fields());
  const auto* one = std::get_if<int64_t>(&options_.axis);
  axes_ = one ? std::vector<int64_t>{*one} : std::get<std::vector<int64_t>>(options_.axis);
}

at::Tensor layers::SoftmaxImpl::call1(const at::Tensor& x, bool training) {
  std::vector<int64_t> dims;
  for (auto a : axes_) {
    int64_t d = a < 0 ? a + x.dim() : a;
    if (d < 0 || d >= x.dim() || std::count(dims.begin(), dims.end(), d))
      throw ValueError("Softmax '" + name() + "': axis=" + int_or_list_json(options_.axis).dump() +
                       " does not name distinct axes of an input of rank " + std::to_string(x.dim()));
    dims.push_back(d);
  }
  if (dims.size() == 1) return at::softmax(x, dims[0]);
  return at::exp(x - at::logsumexp(x, dims, /*keepdim=*/true));
}

std::vector<Shape> layers::SoftmaxImpl::compute_output_shape(const std::vector<Shape>& s) {
  return act_same_shapes(*this, s);
}

Json layers::SoftmaxImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, softmax_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(Softmax, layers::SoftmaxImpl);

}  // namespace kiln
