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
#include "kiln/layers/layer_holder.h"
#include "kiln/layers/layer_options.h"

namespace kiln {

namespace layers {

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

class AddImpl : public ElementwiseMerge {
 public:
  explicit AddImpl(const MergeOptions& options);
  explicit AddImpl(const Json& config = Json::object());
  std::string class_name() const override { return "Add"; }
};
KILN_LAYER_HOLDER(Add, MergeOptions);
class SubtractImpl : public ElementwiseMerge {
 public:
  explicit SubtractImpl(const MergeOptions& options);
  explicit SubtractImpl(const Json& config = Json::object());
  std::string class_name() const override { return "Subtract"; }
};
KILN_LAYER_HOLDER(Subtract, MergeOptions);
class MultiplyImpl : public ElementwiseMerge {
 public:
  explicit MultiplyImpl(const MergeOptions& options);
  explicit MultiplyImpl(const Json& config = Json::object());
  std::string class_name() const override { return "Multiply"; }
};
KILN_LAYER_HOLDER(Multiply, MergeOptions);
class AverageImpl : public ElementwiseMerge {
 public:
  explicit AverageImpl(const MergeOptions& options);
  explicit AverageImpl(const Json& config = Json::object());
  std::string class_name() const override { return "Average"; }
};
KILN_LAYER_HOLDER(Average, MergeOptions);
class MaximumImpl : public ElementwiseMerge {
 public:
  explicit MaximumImpl(const MergeOptions& options);
  explicit MaximumImpl(const Json& config = Json::object());
  std::string class_name() const override { return "Maximum"; }
};
KILN_LAYER_HOLDER(Maximum, MergeOptions);
class MinimumImpl : public ElementwiseMerge {
 public:
  explicit MinimumImpl(const MergeOptions& options);
  explicit MinimumImpl(const Json& config = Json::object());
  std::string class_name() const override { return "Minimum"; }
};
KILN_LAYER_HOLDER(Minimum, MergeOptions);

class ConcatenateImpl : public Layer {
 public:
  explicit ConcatenateImpl(const ConcatenateOptions& options);
  explicit ConcatenateImpl(const Json& config);
  explicit ConcatenateImpl(int64_t axis = -1, const Json& extra = Json::object());

  std::string class_name() const override { return "Concatenate"; }
  void build(const std::vector<Shape>& input_shapes) override;
  Tensors call(const Tensors& inputs, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;
  int64_t axis() const { return options_.axis; }

 private:
  ConcatenateImpl(const ConcatenateOptions& options, const Json& base_config);
  static ConcatenateOptions options_from_config(const Json& config);
  Shape output_shape(const std::vector<Shape>& shapes) const;  // validates
  ConcatenateOptions options_;                                 // checked: the layer's config
};
KILN_LAYER_HOLDER(Concatenate, ConcatenateOptions);

}  // namespace layers

}  // namespace kiln

#define KILN_LEGACY_LAYERS_MERGING_H
#include "kiln/layers/legacy_names.h"
