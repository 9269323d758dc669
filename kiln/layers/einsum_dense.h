// EinsumDense: a dense layer written as an einsum (Keras's EinsumDense).
//
//   // (batch, 32) -> (batch, 64), like Dense(64):
//   auto d = std::make_shared<EinsumDense>("ab,bc->ac", Shape{64}, "c");
//   auto e = std::make_shared<EinsumDense>(
//       EinsumDenseOptions{.equation = "ab,bc->ac", .output_shape = {64}, .bias_axes = "c"});
//   // (batch, seq, 32) -> (batch, seq, 4 heads, 8): a projection in attention
//   auto q = std::make_shared<EinsumDense>("abc,cde->abde", Shape{kNone, 4, 8}, "de");
//
// `equation` is "<input>,<kernel>-><output>" with one letter per axis; "..."
// may stand for leading ("...b,bc->...c") or trailing axes. `output_shape`
// excludes the batch axis; kNone (null) takes the size from the input. The
// kernel's shape is read off the equation (each kernel letter sized from the
// input or the output); `bias_axes` lists the output letters the bias spans
// ("" or null: no bias). Other keys as Dense: activation, kernel_initializer
// ("glorot_uniform"), bias_initializer ("zeros"), *_regularizer,
// *_constraint (null only); activity penalties are recorded in training calls only.
#pragma once

#include "kiln/layers/activations.h"
#include "kiln/layers/kernel_impl.h"
#include "kiln/layers/layer.h"
#include "kiln/layers/layer_holder.h"
#include "kiln/layers/layer_options.h"
#include "kiln/layers/regularizers.h"

namespace kiln {

// Shapes implied by an EinsumDense equation for one input shape (Keras's
// _analyze_einsum_string). Exposed for tests and for MultiHeadAttention.
struct EinsumShapes {
  Shape kernel;
  Shape bias;         // empty when there is no bias
  Shape full_output;  // with the batch axis (kNone where unknown)
};
EinsumShapes analyze_einsum(const std::string& owner, const std::string& equation, const std::string& bias_axes,
                            const Shape& input_shape, const Shape& partial_output_shape);

namespace layers {

struct EinsumDenseOptions {
  std::string equation;  // required
  Shape output_shape;    // required: without the batch axis, kNone for a size taken from the input
  std::string activation = "linear";
  std::string bias_axes;  // empty: no bias
  InitializerArg kernel_initializer = "glorot_uniform";
  InitializerArg bias_initializer = "zeros";
  RegularizerPtr kernel_regularizer, bias_regularizer, activity_regularizer;  // null: none
  LayerOptions base;
};

class EinsumDenseImpl : public SimpleLayer {
 public:
  explicit EinsumDenseImpl(const EinsumDenseOptions& options);
  explicit EinsumDenseImpl(const Json& config);
  EinsumDenseImpl(const std::string& equation, const Shape& output_shape, const std::string& bias_axes = "",
                  const std::string& activation = "linear", const Json& extra = Json::object());

  std::string class_name() const override { return "EinsumDense"; }
  void build(const std::vector<Shape>& input_shapes) override;
  at::Tensor call1(const at::Tensor& x, bool training) override;
  std::vector<Shape> compute_output_shape(const std::vector<Shape>& input_shapes) override;
  Json get_config() const override;
  // "int8" (kernel as int8, scales per output index), "float8", "int8_qat".
  void quantize(const std::string& mode) override;
  bool supports_quantization(const std::string& mode) const override { return true; }
  KernelImpl* kernel_impl_ptr() override { return impl_.get(); }

  const std::string& equation() const { return options_.equation; }
  const VariablePtr& kernel() const { return kernel_; }
  const VariablePtr& bias() const { return bias_; }
  const KernelImpl& kernel_impl() const { return *impl_; }

 private:
  EinsumDenseImpl(const EinsumDenseOptions& options, const Json& base_config);
  static EinsumDenseOptions options_from_config(const Json& config);

  EinsumDenseOptions options_;  // checked: the layer's config
  ActivationFn activation_;
  KernelImplPtr impl_;
  KernelSpec spec_;  // set by build
  KernelSpec kernel_spec(const Shape& kernel_shape) const;
  VariablePtr kernel_, bias_;
};
KILN_LAYER_HOLDER(EinsumDense, EinsumDenseOptions);

}  // namespace layers

}  // namespace kiln

#define KILN_LEGACY_LAYERS_EINSUM_DENSE_H
#include "kiln/layers/legacy_names.h"
