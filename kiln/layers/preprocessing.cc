#include "kiln/layers/preprocessing.h"

#include <algorithm>
#include <functional>

#include "kiln/core/json_limits.h"
#include "kiln/layers/config_fields.h"

namespace kiln {
namespace {

// A number or a (nested) list of numbers, flattened; false if anything else.
bool flatten_numbers(const Json& j, std::vector<double>* out) {
  if (j.is_number()) {
    out->push_back(j.get<double>());
    return true;
  }
  if (!j.is_array() || j.empty()) return false;
  for (auto& e : j)
    if (!flatten_numbers(e, out)) return false;
  return true;
}

// A constant from a number or (nested) list, keeping the list's shape.
at::Tensor constant_from(const Json& j) {
  std::vector<double> v;
  flatten_numbers(j, &v);
  Shape shape;
  for (const Json* p = &j; p->is_array(); p = &(*p)[0]) shape.push_back((int64_t)p->size());
  return at::tensor(v, at::kDouble).reshape(shape);
}

// Floating inputs are already in the compute dtype (Layer autocasts); others
// (uint8 images, int features) are converted to it, as Keras does.
at::Tensor as_compute(const Layer& l, const at::Tensor& x) {
  return at::isFloatingType(x.scalar_type()) ? x : x.to(l.dtype_policy().compute_dtype());
}

const char kNumbers[] = "a number or a list of numbers";

// A number or a (nested) list of numbers, kept as given (Rescaling's scale
// and offset, Normalization's mean and variance). `missing`: required, with
// this hint; `non_negative`: every number >= 0.
template <class O>
FieldDef<O> numbers_field(const char* key, Json O::*member, const char* missing = nullptr, bool non_negative = false) {
  // The error's expectation for `j`, or nullptr if `j` is fine.
  auto problem = [=](const Json& j) -> const char* {
    std::vector<double> v;
    if (!flatten_numbers(j, &v)) return kNumbers;
    if (non_negative && std::any_of(v.begin(), v.end(), [](double x) { return x < 0; })) return "non-negative numbers";
    return nullptr;
  };
  auto read = [=](ConfigReader& r, O& o) {
    const Json* j = r.get(key);
    if (!j && missing) throw ValueError(r.owner() + ": the config is missing `" + key + "` (" + missing + ")");
    if (!j) return;
    if (const char* expected = problem(*j)) r.invalid(key, expected);
    o.*member = *j;
  };
  auto check = [=](const std::string& owner, O& o) {
    const Json& j = o.*member;
    if (j.is_null() && missing) throw ValueError(owner + ": the config is missing `" + key + "` (" + missing + ")");
    if (j.is_null()) return;
    if (const char* expected = problem(j)) option_check::invalid(owner, key, expected, j);
  };
  return FieldDef<O>{key, read, check, [=](Json& j, const O& o) { j[key] = o.*member; }};
}

const FieldTable<layers::RescalingOptions>& rescaling_fields() {
  using O = layers::RescalingOptions;
  static const FieldTable<O> t = {numbers_field("scale", &O::scale, "e.g. 1/255"), numbers_field("offset", &O::offset)};
  return t;
}

const char kAxisExpected[] = "an integer, a list of integers, or null";

bool is_axis(const Json& a) {
  if (a.is_array()) return std::all_of(a.begin(), a.end(), [](const Json& e) { return e.is_number_integer(); });
  return a.is_null() || a.is_number_integer();
}

const FieldTable<layers::NormalizationOptions>& normalization_fields() {
  using O = layers::NormalizationOptions;
  static const FieldTable<O> t = [] {
    // Absent is -1; a null axis is a value (see options_from_config).
    FieldDef<O> axis{"axis",
                     [](ConfigReader& r, O& o) {
                       if (const Json* a = r.get("axis")) o.axis = *a;
                       if (!is_axis(o.axis)) r.invalid("axis", kAxisExpected);
                     },
                     [](const std::string& owner, O& o) {
                       if (!is_axis(o.axis)) option_check::invalid(owner, "axis", kAxisExpected, o.axis);
                     },
                     [](Json& j, const O& o) { j["axis"] = o.axis; }};
    // mean and variance come together (checked before either's value).
    const char* together = "a value as well, since `mean` and `variance` must be given together";
    FieldDef<O> mean = numbers_field("mean", &O::mean);
    mean.read = [together, read = mean.read](ConfigReader& r, O& o) {
      if (r.has("mean") != r.has("variance")) r.invalid(r.has("mean") ? "variance" : "mean", together);
      read(r, o);
    };
    mean.check = [together, check = mean.check](const std::string& owner, O& o) {
      if (o.mean.is_null() != o.variance.is_null())
        option_check::invalid(owner, o.mean.is_null() ? "mean" : "variance", together, nullptr);
      check(owner, o);
    };
    return FieldTable<O>{axis, field("invert", &O::invert), mean,
                         numbers_field("variance", &O::variance, nullptr, /*non_negative=*/true)};
  }();
  return t;
}

}  // namespace

// --- Rescaling ------------------------------------------------------------------
layers::RescalingOptions layers::RescalingImpl::options_from_config(const Json& config) {
  return read_fields(config, "Rescaling", rescaling_fields());
}

layers::RescalingImpl::RescalingImpl(const layers::RescalingOptions& o)
    : layers::RescalingImpl(o, layer_base_config(o.base)) {}

layers::RescalingImpl::RescalingImpl(const Json& config) : layers::RescalingImpl(options_from_config(config), config) {}

layers::RescalingImpl::RescalingImpl(const layers::RescalingOptions& o, const Json& base_config)
    : SimpleLayer(base_config), options_(o) {
  check_fields("Rescaling", options_, rescaling_fields());
  scale_ = constant_from(options_.scale);
  offset_ = constant_from(options_.offset);
}

layers::RescalingImpl::RescalingImpl(double scale, double offset, const Json& extra)
    : layers::RescalingImpl(merged_config(extra, Json{{"scale", scale}, {"offset", offset}})) {}

at::Tensor layers::RescalingImpl::call1(const at::Tensor& x, bool training) {
  at::Tensor xf = as_compute(*this, x);
  return xf * scale_.to(xf.scalar_type()) + offset_.to(xf.scalar_type());
}

std::vector<Shape> layers::RescalingImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  return input_shapes;
}

Json layers::RescalingImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, rescaling_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(Rescaling, layers::RescalingImpl);

// --- Normalization ----------------------------------------------------------------
layers::NormalizationOptions layers::NormalizationImpl::options_from_config(const Json& config) {
  layers::NormalizationOptions o = read_fields(config, "Normalization", normalization_fields());
  // The reader takes null for absent; here null is a value.
  if (config.is_object() && config.contains("axis") && config["axis"].is_null()) o.axis = nullptr;
  return o;
}

layers::NormalizationImpl::NormalizationImpl(const layers::NormalizationOptions& o)
    : SimpleLayer(layer_base_config(o.base)), options_(o) {
  init();
}

layers::NormalizationImpl::NormalizationImpl(const Json& config)
    : SimpleLayer(config), options_(options_from_config(config)) {
  init();
}

void layers::NormalizationImpl::init() {
  check_fields("Normalization", options_, normalization_fields());
  const Json& axis = options_.axis;
  if (axis.is_number_integer()) axes_ = std::vector<int64_t>{axis.get<int64_t>()};
  if (axis.is_array()) axes_ = axis.get<std::vector<int64_t>>();
  if (!options_.mean.is_null()) {
    flatten_numbers(options_.mean, &given_mean_);
    flatten_numbers(options_.variance, &given_variance_);
  }
}

layers::NormalizationImpl::NormalizationImpl(int64_t axis, const Json& extra)
    : layers::NormalizationImpl(merged_config(extra, Json{{"axis", axis}})) {}

layers::NormalizationImpl::NormalizationImpl(const std::vector<double>& mean, const std::vector<double>& variance,
                                             int64_t axis, const Json& extra)
    : layers::NormalizationImpl(merged_config(extra, Json{{"axis", axis}, {"mean", mean}, {"variance", variance}})) {}

std::vector<int64_t> layers::NormalizationImpl::kept_axes(int64_t rank) const {
  std::vector<int64_t> out;
  if (!axes_) return out;
  for (auto a : *axes_) {
    int64_t r = a < 0 ? a + rank : a;
    if (r < 1 || r >= rank || std::count(out.begin(), out.end(), r))
      throw ValueError("Normalization '" + name() + "': axis=" + json_excerpt(options_.axis) +
                       " does not name distinct non-batch axes of inputs of rank " + std::to_string(rank));
    out.push_back(r);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void layers::NormalizationImpl::build(const std::vector<Shape>& input_shapes) {
  const Shape& s = input_shapes.at(0);
  const int64_t rank = (int64_t)s.size();
  auto kept = kept_axes(rank);
  broadcast_shape_.assign(rank, 1);
  Shape stat_shape;
  for (auto a : kept) {
    if (s[a] < 1)
      throw ShapeError("Normalization '" + name() + "': axis " + std::to_string(a) +
                       " must have a known size. Received input shape " + shape_to_string(s));
    broadcast_shape_[a] = s[a];
    stat_shape.push_back(s[a]);
  }
  const int64_t n = num_elements(stat_shape);
  if (!given_mean_.empty()) {
    auto fit = [&](const std::vector<double>& v, const char* what) {
      if ((int64_t)v.size() != 1 && (int64_t)v.size() != n)
        throw ValueError("Normalization '" + name() + "': `" + what + "` has " + std::to_string(v.size()) +
                         " values; inputs of shape " + shape_to_string(s) +
                         " with axis=" + json_excerpt(options_.axis) + " need 1 or " + std::to_string(n));
      return at::tensor(v, at::kDouble).expand({n}).reshape(broadcast_shape_).contiguous();
    };
    const_mean_ = fit(given_mean_, "mean");
    const_variance_ = fit(given_variance_, "variance");
    return;
  }
  mean_ = add_weight("mean", stat_shape, Initializer::get("zeros"), false);
  variance_ = add_weight("variance", stat_shape, Initializer::get("ones"), false);
  count_ = add_weight("count", {}, Initializer::get("zeros"), false, nullptr, at::kLong);
}

at::Tensor layers::NormalizationImpl::mean() const {
  if (!built()) throw StateError("Normalization '" + name() + "' is not built yet; call adapt() or the layer first");
  return mean_ ? value(mean_).reshape(broadcast_shape_) : compute_cast(const_mean_);
}

at::Tensor layers::NormalizationImpl::variance() const {
  if (!built()) throw StateError("Normalization '" + name() + "' is not built yet; call adapt() or the layer first");
  return variance_ ? value(variance_).reshape(broadcast_shape_) : compute_cast(const_variance_);
}

void layers::NormalizationImpl::check_shape(const at::Tensor& x, const char* what) const {
  const Shape& built = build_input_shapes().at(0);
  bool ok = x.dim() == (int64_t)built.size();
  for (size_t i = 1; ok && i < built.size(); ++i) ok = broadcast_shape_[i] == 1 || x.size(i) == broadcast_shape_[i];
  if (!ok)
    throw ShapeError("Normalization '" + name() + "' was built for inputs of shape " + shape_to_string(built) + "; " +
                     what + " received " + shape_to_string(sizes_of(x)));
}

at::Tensor layers::NormalizationImpl::call1(const at::Tensor& x, bool training) {
  check_shape(x, "the call");
  at::Tensor xf = as_compute(*this, x);
  at::Tensor m = mean().to(xf.scalar_type()), v = variance().to(xf.scalar_type());
  at::Tensor stddev = at::clamp_min(at::sqrt(v), 1e-7);  // Keras's backend.epsilon()
  return options_.invert ? m + xf * stddev : (xf - m) / stddev;
}

void layers::NormalizationImpl::adapt(const at::Tensor& data) {
  bool given = false;
  adapt([&]() -> at::Tensor {
    if (given) return at::Tensor();
    given = true;
    return data;
  });
}

void layers::NormalizationImpl::adapt(const std::function<at::Tensor()>& next_batch) {
  if (!given_mean_.empty())
    throw ValueError("Normalization '" + name() +
                     "': cannot adapt() a layer whose `mean` and `variance` were given "
                     "in its config");
  at::NoGradGuard ng;
  // Per-batch statistics combined with Chan et al.'s parallel update, in
  // float64: the result equals one pass over the concatenated data.
  at::Tensor mean, m2;  // shaped like the kept axes (broadcastable)
  int64_t count = 0;
  while (true) {
    at::Tensor data = next_batch();
    if (!data.defined()) break;
    if (data.dim() < 1 || data.size(0) < 1) throw ShapeError("Normalization.adapt needs at least one sample");
    Shape s = sizes_of(data);
    s[0] = kNone;
    build_if_needed({s});
    check_shape(data, "adapt()");
    at::Tensor d = data.to(at::kDouble);
    std::vector<int64_t> reduce;
    for (int64_t i = 0; i < d.dim(); ++i)
      if (broadcast_shape_[i] == 1) reduce.push_back(i);
    at::Tensor bm = d.mean(reduce, /*keepdim=*/true);
    at::Tensor bm2 = (d - bm).square().sum(reduce, /*keepdim=*/true);
    const int64_t bn = d.numel() / std::max<int64_t>(1, bm.numel());
    if (count == 0) {
      mean = bm;
      m2 = bm2;
    } else {
      const double n = (double)count, nb = (double)bn, total = n + nb;
      at::Tensor delta = bm - mean;
      mean = mean + delta * (nb / total);
      m2 = m2 + bm2 + delta.square() * (n * nb / total);
    }
    count += bn;
  }
  if (count == 0) throw ValueError("Normalization '" + name() + "': adapt() received no data");
  at::Tensor v = m2 / (double)count;  // biased, as Keras
  mean_->assign(mean.reshape(mean_->value().sizes()).to(mean_->dtype()));
  variance_->assign(v.reshape(variance_->value().sizes()).to(variance_->dtype()));
  count_->assign(at::scalar_tensor(count, at::kLong));
}

std::vector<Shape> layers::NormalizationImpl::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  return input_shapes;
}

Json layers::NormalizationImpl::get_config() const {
  Json j = base_config();
  write_fields(j, options_, normalization_fields());
  return j;
}

KILN_REGISTER_LAYER_AS(Normalization, layers::NormalizationImpl);

}  // namespace kiln
