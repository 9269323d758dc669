#include "kiln/core/initializers.h"

#include "kiln/core/config_keys.h"

#include <cmath>

#include "kiln/core/error.h"
#include "kiln/core/json_limits.h"

namespace kiln {

std::pair<double, double> compute_fans(const Shape& shape) {
  if (shape.empty()) return {1.0, 1.0};
  if (shape.size() == 1) return {(double)shape[0], (double)shape[0]};
  double receptive = 1;
  for (size_t i = 0; i + 2 < shape.size(); ++i) receptive *= (double)shape[i];
  return {shape[shape.size() - 2] * receptive, shape.back() * receptive};
}

Json Initializer::to_json() const {
  // As Keras 3 serializes it.
  return Json{{"module", "keras.initializers"},
              {"class_name", class_name()},
              {"config", get_config()},
              {"registered_name", nullptr}};
}

namespace {

class VarianceScaling : public Initializer {
 public:
  VarianceScaling(double scale, std::string mode, std::string dist, std::string cls)
      : scale_(scale), mode_(std::move(mode)), dist_(std::move(dist)), cls_(std::move(cls)) {
    if (scale_ <= 0)
      throw ValueError("VarianceScaling: `scale` must be positive. Received: scale=" + std::to_string(scale_));
    if (mode_ != "fan_in" && mode_ != "fan_out" && mode_ != "fan_avg")
      throw ValueError("VarianceScaling: `mode` must be fan_in, fan_out or fan_avg. Received: mode=" + mode_);
    if (dist_ == "normal") dist_ = "truncated_normal";
    if (dist_ != "truncated_normal" && dist_ != "untruncated_normal" && dist_ != "uniform")
      throw ValueError(
          "VarianceScaling: `distribution` must be truncated_normal, untruncated_normal or uniform. Received: "
          "distribution=" +
          dist_);
  }
  at::Tensor sample(const Shape& shape, at::ScalarType dtype) const override {
    auto [fan_in, fan_out] = compute_fans(shape);
    double n = mode_ == "fan_in" ? fan_in : mode_ == "fan_out" ? fan_out : (fan_in + fan_out) / 2;
    double scale = scale_ / std::max(1.0, n);
    auto opts = at::TensorOptions().dtype(at::kFloat);
    at::Tensor t;
    if (dist_ == "truncated_normal") {
      // 0.879... is the stddev of a unit normal truncated to [-2, 2].
      double stddev = std::sqrt(scale) / 0.87962566103423978;
      t = at::empty(shape, opts);
      truncated_normal_(t, stddev);
    } else if (dist_ == "untruncated_normal") {
      t = at::randn(shape, opts) * std::sqrt(scale);
    } else {
      double limit = std::sqrt(3.0 * scale);
      t = at::rand(shape, opts) * (2 * limit) - limit;
    }
    return t.to(dtype);
  }
  static void truncated_normal_(at::Tensor& t, double stddev) {
    // Resample values outside two standard deviations.
    t.normal_(0, 1);
    for (int i = 0; i < 16; ++i) {
      auto bad = t.abs() > 2.0;
      if (!bad.any().item<bool>()) break;
      t.masked_scatter_(bad, at::randn({bad.sum().item<int64_t>()}));
    }
    t.clamp_(-2.0, 2.0).mul_(stddev);
  }
  Json get_config() const override {
    if (cls_ != "VarianceScaling") return Json{{"seed", nullptr}};
    return Json{{"scale", scale_}, {"mode", mode_}, {"distribution", dist_}, {"seed", nullptr}};
  }
  std::string class_name() const override { return cls_; }

 private:
  double scale_;
  std::string mode_, dist_, cls_;
};

class Constant : public Initializer {
 public:
  Constant(double v, std::string cls) : v_(v), cls_(std::move(cls)) {}
  at::Tensor sample(const Shape& shape, at::ScalarType dtype) const override {
    return at::full(shape, v_, at::TensorOptions().dtype(dtype));
  }
  Json get_config() const override { return cls_ == "Constant" ? Json{{"value", v_}} : Json::object(); }
  std::string class_name() const override { return cls_; }

 private:
  double v_;
  std::string cls_;
};

class RandomNormal : public Initializer {
 public:
  RandomNormal(double mean, double stddev, bool truncated) : mean_(mean), stddev_(stddev), truncated_(truncated) {}
  at::Tensor sample(const Shape& shape, at::ScalarType dtype) const override {
    auto t = at::empty(shape, at::TensorOptions().dtype(at::kFloat));
    if (truncated_)
      VarianceScaling::truncated_normal_(t, 1.0), t.mul_(stddev_);
    else
      t.normal_(0, stddev_);
    return (t + mean_).to(dtype);
  }
  Json get_config() const override { return Json{{"mean", mean_}, {"stddev", stddev_}, {"seed", nullptr}}; }
  std::string class_name() const override { return truncated_ ? "TruncatedNormal" : "RandomNormal"; }

 private:
  double mean_, stddev_;
  bool truncated_;
};

class RandomUniform : public Initializer {
 public:
  RandomUniform(double lo, double hi) : lo_(lo), hi_(hi) {}
  at::Tensor sample(const Shape& shape, at::ScalarType dtype) const override {
    return (at::rand(shape, at::TensorOptions().dtype(at::kFloat)) * (hi_ - lo_) + lo_).to(dtype);
  }
  Json get_config() const override { return Json{{"minval", lo_}, {"maxval", hi_}, {"seed", nullptr}}; }
  std::string class_name() const override { return "RandomUniform"; }

 private:
  double lo_, hi_;
};

class Orthogonal : public Initializer {
 public:
  explicit Orthogonal(double gain) : gain_(gain) {}
  at::Tensor sample(const Shape& shape, at::ScalarType dtype) const override {
    if (shape.size() < 2)
      throw ValueError("Orthogonal initializer needs a shape of rank >= 2. Received: " + shape_to_string(shape));
    int64_t rows = 1;
    for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
    int64_t cols = shape.back();
    auto a = at::randn({std::max(rows, cols), std::min(rows, cols)});
    auto qr = at::linalg_qr(a);
    auto q = std::get<0>(qr) * at::sign(at::diagonal(std::get<1>(qr)));
    if (rows < cols) q = q.t();
    return (q.reshape(shape) * gain_).contiguous().to(dtype);
  }
  Json get_config() const override { return Json{{"gain", gain_}, {"seed", nullptr}}; }
  std::string class_name() const override { return "Orthogonal"; }

 private:
  double gain_;
};

}  // namespace

InitializerPtr variance_scaling(double scale, const std::string& mode, const std::string& distribution,
                                const std::string& class_name) {
  return std::make_shared<VarianceScaling>(scale, mode, distribution, class_name);
}

InitializerPtr constant_initializer(double value) { return std::make_shared<Constant>(value, "Constant"); }

InitializerPtr Initializer::get(const std::string& name) {
  if (name == "glorot_uniform" || name == "GlorotUniform")
    return variance_scaling(1.0, "fan_avg", "uniform", "GlorotUniform");
  if (name == "glorot_normal" || name == "GlorotNormal")
    return variance_scaling(1.0, "fan_avg", "truncated_normal", "GlorotNormal");
  if (name == "he_normal" || name == "HeNormal") return variance_scaling(2.0, "fan_in", "truncated_normal", "HeNormal");
  if (name == "he_uniform" || name == "HeUniform") return variance_scaling(2.0, "fan_in", "uniform", "HeUniform");
  if (name == "lecun_normal" || name == "LecunNormal")
    return variance_scaling(1.0, "fan_in", "truncated_normal", "LecunNormal");
  if (name == "lecun_uniform" || name == "LecunUniform")
    return variance_scaling(1.0, "fan_in", "uniform", "LecunUniform");
  if (name == "zeros" || name == "Zeros") return std::make_shared<Constant>(0.0, "Zeros");
  if (name == "ones" || name == "Ones") return std::make_shared<Constant>(1.0, "Ones");
  if (name == "random_normal" || name == "RandomNormal") return std::make_shared<RandomNormal>(0.0, 0.05, false);
  if (name == "truncated_normal" || name == "TruncatedNormal") return std::make_shared<RandomNormal>(0.0, 0.05, true);
  if (name == "random_uniform" || name == "RandomUniform") return std::make_shared<RandomUniform>(-0.05, 0.05);
  if (name == "orthogonal" || name == "Orthogonal") return std::make_shared<Orthogonal>(1.0);
  throw ValueError("unknown initializer '" + name +
                   "'; expected one of glorot_uniform, glorot_normal, he_normal, he_uniform, lecun_normal, "
                   "lecun_uniform, zeros, ones, random_normal, truncated_normal, random_uniform, orthogonal");
}

InitializerPtr Initializer::from_json(const Json& j) {
  if (j.is_string()) return get(j.get<std::string>());
  if (!j.is_object() || !j.contains("class_name"))
    throw ValueError("initializer must be a name or {\"class_name\", \"config\"}. Received: " + json_excerpt(j));
  check_config_keys(j, {"module", "class_name", "config", "registered_name"}, "an initializer");
  const std::string cls = j["class_name"].get<std::string>();
  const Json cfg = j.value("config", Json::object());
  if (cls == "VarianceScaling")
    return variance_scaling(get_or<double>(cfg, "scale", 1.0), get_or<std::string>(cfg, "mode", "fan_in"),
                            get_or<std::string>(cfg, "distribution", "truncated_normal"));
  if (cls == "Constant") return constant_initializer(get_or<double>(cfg, "value", 0.0));
  if (cls == "RandomNormal" || cls == "TruncatedNormal")
    return std::make_shared<RandomNormal>(get_or<double>(cfg, "mean", 0.0), get_or<double>(cfg, "stddev", 0.05),
                                          cls == "TruncatedNormal");
  if (cls == "RandomUniform")
    return std::make_shared<RandomUniform>(get_or<double>(cfg, "minval", -0.05), get_or<double>(cfg, "maxval", 0.05));
  if (cls == "Orthogonal") return std::make_shared<Orthogonal>(get_or<double>(cfg, "gain", 1.0));
  return get(cls);
}

}  // namespace kiln
