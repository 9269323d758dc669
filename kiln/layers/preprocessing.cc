#include "kiln/layers/preprocessing.h"

#include <algorithm>
#include <functional>

#include "kiln/core/json_limits.h"
#include "kiln/layers/config_reader.h"

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

}  // namespace

// --- Rescaling ------------------------------------------------------------------
Rescaling::Rescaling(const Json& config) : SimpleLayer(config) {
  ConfigReader r(config, "Rescaling");
  const std::string expected = "a number or a list of numbers";
  std::vector<double> tmp;
  const Json* s = r.get("scale");
  if (!s) throw ValueError("Rescaling: the config is missing `scale` (e.g. 1/255)");
  if (!flatten_numbers(*s, &tmp)) r.invalid("scale", expected);
  const Json* o = r.get("offset");
  if (o && !flatten_numbers(*o, &tmp)) r.invalid("offset", expected);
  scale_json_ = *s;
  offset_json_ = o ? *o : Json(0.0);
  r.finish();
  scale_ = constant_from(scale_json_);
  offset_ = constant_from(offset_json_);
}

Rescaling::Rescaling(double scale, double offset, const Json& extra)
    : Rescaling(merged_config(extra, Json{{"scale", scale}, {"offset", offset}})) {}

at::Tensor Rescaling::call1(const at::Tensor& x, bool training) {
  at::Tensor xf = as_compute(*this, x);
  return xf * scale_.to(xf.scalar_type()) + offset_.to(xf.scalar_type());
}

std::vector<Shape> Rescaling::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  return input_shapes;
}

Json Rescaling::get_config() const {
  Json j = base_config();
  j["scale"] = scale_json_;
  j["offset"] = offset_json_;
  return j;
}

KILN_REGISTER_LAYER(Rescaling);

// --- Normalization ----------------------------------------------------------------
Normalization::Normalization(const Json& config) : SimpleLayer(config) {
  ConfigReader r(config, "Normalization");
  const Json* a = r.get("axis");
  const bool explicit_null = config.is_object() && config.contains("axis") && config["axis"].is_null();
  axis_json_ = a ? *a : (explicit_null ? Json(nullptr) : Json(-1));
  const std::string expected = "an integer, a list of integers, or null";
  if (axis_json_.is_number_integer()) {
    axes_ = std::vector<int64_t>{axis_json_.get<int64_t>()};
  } else if (axis_json_.is_array()) {
    axes_ = std::vector<int64_t>{};
    for (auto& e : axis_json_) {
      if (!e.is_number_integer()) r.invalid("axis", expected);
      axes_->push_back(e.get<int64_t>());
    }
  } else if (!axis_json_.is_null()) {
    r.invalid("axis", expected);
  }
  invert_ = r.boolean("invert", false);
  const Json* m = r.get("mean");
  const Json* v = r.get("variance");
  if ((m == nullptr) != (v == nullptr))
    r.invalid(m ? "variance" : "mean", "a value as well, since `mean` and `variance` must be given together");
  if (m) {
    if (!flatten_numbers(*m, &given_mean_)) r.invalid("mean", "a number or a list of numbers");
    if (!flatten_numbers(*v, &given_variance_)) r.invalid("variance", "a number or a list of numbers");
    for (double x : given_variance_)
      if (x < 0) r.invalid("variance", "non-negative numbers");
    mean_json_ = *m;
    variance_json_ = *v;
  }
  r.finish();
}

Normalization::Normalization(int64_t axis, const Json& extra)
    : Normalization(merged_config(extra, Json{{"axis", axis}})) {}

Normalization::Normalization(const std::vector<double>& mean, const std::vector<double>& variance, int64_t axis,
                             const Json& extra)
    : Normalization(merged_config(extra, Json{{"axis", axis}, {"mean", mean}, {"variance", variance}})) {}

std::vector<int64_t> Normalization::kept_axes(int64_t rank) const {
  std::vector<int64_t> out;
  if (!axes_) return out;
  for (auto a : *axes_) {
    int64_t r = a < 0 ? a + rank : a;
    if (r < 1 || r >= rank || std::count(out.begin(), out.end(), r))
      throw ValueError("Normalization '" + name() + "': axis=" + json_excerpt(axis_json_) +
                       " does not name distinct non-batch axes of inputs of rank " + std::to_string(rank));
    out.push_back(r);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void Normalization::build(const std::vector<Shape>& input_shapes) {
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
                         " values; inputs of shape " + shape_to_string(s) + " with axis=" + json_excerpt(axis_json_) +
                         " need 1 or " + std::to_string(n));
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

at::Tensor Normalization::mean() const {
  if (!built()) throw StateError("Normalization '" + name() + "' is not built yet; call adapt() or the layer first");
  return mean_ ? value(mean_).reshape(broadcast_shape_) : compute_cast(const_mean_);
}

at::Tensor Normalization::variance() const {
  if (!built()) throw StateError("Normalization '" + name() + "' is not built yet; call adapt() or the layer first");
  return variance_ ? value(variance_).reshape(broadcast_shape_) : compute_cast(const_variance_);
}

void Normalization::check_shape(const at::Tensor& x, const char* what) const {
  const Shape& built = build_input_shapes().at(0);
  bool ok = x.dim() == (int64_t)built.size();
  for (size_t i = 1; ok && i < built.size(); ++i) ok = broadcast_shape_[i] == 1 || x.size(i) == broadcast_shape_[i];
  if (!ok)
    throw ShapeError("Normalization '" + name() + "' was built for inputs of shape " + shape_to_string(built) + "; " +
                     what + " received " + shape_to_string(sizes_of(x)));
}

at::Tensor Normalization::call1(const at::Tensor& x, bool training) {
  check_shape(x, "the call");
  at::Tensor xf = as_compute(*this, x);
  at::Tensor m = mean().to(xf.scalar_type()), v = variance().to(xf.scalar_type());
  at::Tensor stddev = at::clamp_min(at::sqrt(v), 1e-7);  // Keras's backend.epsilon()
  return invert_ ? m + xf * stddev : (xf - m) / stddev;
}

void Normalization::adapt(const at::Tensor& data) {
  bool given = false;
  adapt([&]() -> at::Tensor {
    if (given) return at::Tensor();
    given = true;
    return data;
  });
}

void Normalization::adapt(const std::function<at::Tensor()>& next_batch) {
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

std::vector<Shape> Normalization::compute_output_shape(const std::vector<Shape>& input_shapes) {
  build_if_needed(input_shapes);
  return input_shapes;
}

Json Normalization::get_config() const {
  Json j = base_config();
  j["axis"] = axis_json_;
  j["invert"] = invert_;
  j["mean"] = mean_json_;
  j["variance"] = variance_json_;
  return j;
}

KILN_REGISTER_LAYER(Normalization);

}  // namespace kiln
