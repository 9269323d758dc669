// Weight initializers with Keras's names, defaults and formulas
// (glorot_uniform is Dense's default kernel initializer, zeros its bias's).
//
//   auto init = Initializer::get("he_normal");
//   at::Tensor w = init->sample({784, 256}, at::kFloat);
//
// Fan-in/fan-out follow Keras: for a kernel of shape (..., in, out) with
// receptive field r = prod(shape[:-2]), fan_in = in*r and fan_out = out*r.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>

#include "kiln/core/json.h"
#include "kiln/core/shape.h"

namespace kiln {

class Initializer {
 public:
  virtual ~Initializer() = default;
  virtual at::Tensor sample(const Shape& shape, at::ScalarType dtype) const = 0;
  // Keras serialization: {"class_name": "GlorotUniform", "config": {...}}.
  virtual Json get_config() const = 0;
  virtual std::string class_name() const = 0;
  Json to_json() const;

  // By Keras name ("glorot_uniform", "he_normal", "zeros", "ones",
  // "random_normal", "random_uniform", "truncated_normal", "lecun_normal",
  // "lecun_uniform", "he_uniform", "glorot_normal", "orthogonal", "constant")
  // or by {"class_name": ..., "config": ...}. ValueError lists the known names.
  static std::shared_ptr<Initializer> get(const std::string& name);
  static std::shared_ptr<Initializer> from_json(const Json& j);
};

using InitializerPtr = std::shared_ptr<Initializer>;

// Keras VarianceScaling(scale, mode in {fan_in, fan_out, fan_avg},
// distribution in {truncated_normal, untruncated_normal, uniform}).
InitializerPtr variance_scaling(double scale, const std::string& mode, const std::string& distribution,
                                const std::string& class_name = "VarianceScaling");
InitializerPtr constant_initializer(double value);

std::pair<double, double> compute_fans(const Shape& shape);

}  // namespace kiln
