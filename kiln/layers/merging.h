// Merge layers: combine several tensors into one (Keras's merging layers).
//
//   auto sum = (*std::make_shared<Add>())({a, b});            // elementwise
//   auto cat = (*std::make_shared<Concatenate>(-1))({a, b});  // along an axis
//   auto named = std::make_shared<Add>(MergeOptions{.base = {.name = "residual"}});
//
// Add, Subtract (exactly two inputs), Multiply, Average, Maximum, Minimum:
// two or more inputs whose shapes broadcast (Keras allows broadcasting
// within the non-batch axes); the batch sizes must agree.
// Concatenate(axis=-1): two or more inputs of the same rank whose sizes
// match except along `axis`.
#pragma once

#include <functional>

#include "kiln/layers/layer.h"
#include "kiln/layers/layer_options.h"

namespace kiln {

// Add, Subtract, Multiply, Average, Maximum, Minimum: only the base keys.
struct MergeOptions {
  LayerOptions base;
};

struct ConcatenateOptions {
  int64_t axis = -1;
  LayerOptions base;
};

// Shared implementation of the elementwise merges.
class ElementwiseMerge : public Layer {
 public:
  using Combine = std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>;
  void build(const std::vector<Shape>& input_shapes) override;
  Tensors call(const Tensors& inputs, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;

 protected:
  // max_inputs 0: no upper bound. `finish` post-processes the folded result
  // (Average divides by the count).
  // `config` holds the base keys only (any other key is a ValueError).
  ElementwiseMerge(const std::string& owner, const Json& config, Combine combine, size_t max_inputs = 0,
                   std::function<at::Tensor(const at::Tensor&, size_t)> finish = nullptr);

 private:
  std::string owner_;
  Combine combine_;
  size_t max_inputs_;
  std::function<at::Tensor(const at::Tensor&, size_t)> finish_;
};

class Add : public ElementwiseMerge {
 public:
  explicit Add(const MergeOptions& options);
  explicit Add(const Json& config = Json::object());
  std::string class_name() const override { return "Add"; }
};
class Subtract : public ElementwiseMerge {
 public:
  explicit Subtract(const MergeOptions& options);
  explicit Subtract(const Json& config = Json::object());
  std::string class_name() const override { return "Subtract"; }
};
class Multiply : public ElementwiseMerge {
 public:
  explicit Multiply(const MergeOptions& options);
  explicit Multiply(const Json& config = Json::object());
  std::string class_name() const override { return "Multiply"; }
};
class Average : public ElementwiseMerge {
 public:
  explicit Average(const MergeOptions& options);
  explicit Average(const Json& config = Json::object());
  std::string class_name() const override { return "Average"; }
};
class Maximum : public ElementwiseMerge {
 public:
  explicit Maximum(const MergeOptions& options);
  explicit Maximum(const Json& config = Json::object());
  std::string class_name() const override { return "Maximum"; }
};
class Minimum : public ElementwiseMerge {
 public:
  explicit Minimum(const MergeOptions& options);
  explicit Minimum(const Json& config = Json::object());
  std::string class_name() const override { return "Minimum"; }
};

class Concatenate : public Layer {
 public:
  explicit Concatenate(const ConcatenateOptions& options);
  explicit Concatenate(const Json& config);
  explicit Concatenate(int64_t axis = -1, const Json& extra = Json::object());

  std::string class_name() const override { return "Concatenate"; }
  void build(const std::vector<Shape>& input_shapes) override;
  Tensors call(const Tensors& inputs, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;
  int64_t axis() const { return options_.axis; }

 private:
  Concatenate(const ConcatenateOptions& options, const Json& base_config);
  static ConcatenateOptions options_from_config(const Json& config);
  Shape output_shape(const std::vector<Shape>& shapes) const;  // validates
  ConcatenateOptions options_;                                 // checked: the layer's config
};

}  // namespace kiln
