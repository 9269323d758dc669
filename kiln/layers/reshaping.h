// Layers that only move data: Flatten and Reshape (Keras's names and
// semantics; the batch axis is never touched).
//
//   Flatten(): (N, 4, 4, 8) -> (N, 128). data_format "channels_first"
//     flattens in channels-last order, as Keras does, so weights trained on
//     either layout agree.
//   Reshape(Shape{4, -1}): (N, 12) -> (N, 4, 3). target_shape excludes the
//     batch axis; one entry may be -1 (inferred).
#pragma once

#include "kiln/layers/layer.h"

namespace kiln {

class Flatten : public SimpleLayer {
 public:
  explicit Flatten(const Json& config = Json::object());

  std::string class_name() const override { return "Flatten"; }
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;

 private:
  std::string data_format_;
};

class Reshape : public SimpleLayer {
 public:
  explicit Reshape(const Json& config);
  explicit Reshape(const Shape& target_shape, const Json& extra = Json::object());

  std::string class_name() const override { return "Reshape"; }
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;
  const Shape& target_shape() const { return target_; }

 private:
  // target_ with the -1 resolved for `n` elements per sample (n < 0: unknown).
  Shape resolve(int64_t n, const Shape& input_shape) const;
  Shape target_;
};

}  // namespace kiln
