// KernelImpl: how a quantizable layer applies its kernel to its input.
//
// Dense, EinsumDense and Conv1D/Conv2D own their float variables but delegate
// the kernel product to a small strategy object:
//
//   at::Tensor y = impl_->apply_with_bias(x, value(kernel_), bias, training);
//
// quantize("int8" | "float8") swaps in another implementation, made by
// make_kernel_impl(mode, spec) from the makers kiln/quantization registers
// here when its library loads (layers do not link quantization), which
// carries its own weights (the int8 kernel and its scales; float8's scales
// and amax histories), created through the layer's add_weight so they are
// saved, loaded and counted like any weight. Layers hold no mode branches
// (docs/DESIGN.md, "Strategies, not mode branches"); the mode lives in the layer's dtype policy
// ("int8_from_float32"), so a saved model rebuilds the same implementation.
//
//   mode       keeps the float kernel   own weights
//   "float"    yes                      none
//   "int8"     no (int8 "kernel")       kernel_scale; inputs_scale when calibrated (static)
//   "float8"   yes (trainable)          {inputs,kernel,outputs_grad}_{scale,amax_history}
//   "int8_qat" yes (trainable)          none: fake-quantizes kernel and inputs (straight-through)
//
// Thread safety: apply_with_bias(training=false) may run concurrently once
// built; training calls (float8 updates its histories) and calibrate() run
// on one thread, as fit() does.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/initializers.h"
#include "kiln/core/shape.h"
#include "kiln/core/variable.h"

namespace kiln {

// Creates a weight on the owning layer (its Layer::add_weight, under the
// layer's name scope).
using AddWeightFn = std::function<VariablePtr(const std::string& name, const Shape& shape, InitializerPtr init,
                                              bool trainable, std::optional<at::ScalarType> dtype)>;

// The kernel product a quantized implementation must reproduce.
struct KernelSpec {
  std::string equation;  // "": x (..., in) @ kernel (in, out); else at::einsum(equation, {x, kernel})
  Shape kernel_shape;
  // Kernel axes summed over by the product (Dense: {0}); the kernel scale is
  // per remaining (output) index.
  std::vector<int64_t> kernel_reduced_axes;
  // Input axes summed over (Dense: {-1}); inputs are quantized per the rest.
  std::vector<int64_t> input_reduced_axes;
  // int8: a calibrated per-tensor input scale ("inputs_scale") instead of
  // per-row scales at run time.
  bool static_inputs = false;
};

class KernelImpl {
 public:
  virtual ~KernelImpl() = default;
  // "float", "int8", "float8", "int8_qat".
  virtual std::string mode() const = 0;
  // The kernel product, in the dtype of `x` and `kernel` (the layer's
  // compute dtype). Bias and activation are the layer's job.
  virtual at::Tensor apply(const at::Tensor& x, const at::Tensor& kernel) const = 0;
  // The product plus `bias` (undefined: none). `kernel` is undefined when the
  // layer keeps no float kernel (int8). The float matmul fuses the bias into
  // the GEMM for 2-D inputs (at::addmm), as torch.nn.Linear does.
  virtual at::Tensor apply_with_bias(const at::Tensor& x, const at::Tensor& kernel, const at::Tensor& bias,
                                     bool training = false) const {
    at::Tensor y = apply(x, kernel);
    return bias.defined() ? y + bias.to(y.scalar_type()) : y;
  }

  // The input shape as the unsharded layer sees it (a row-parallel kernel
  // under ModelParallel also takes its shard of the input), for the layer's
  // shape checks.
  virtual Shape logical_input_shape(const Shape& s) const { return s; }
  // Whether the layer keeps (and trains) its float kernel.
  virtual bool keeps_float_kernel() const { return true; }
  // Creates this mode's own weights (from the layer's build, or quantize()).
  virtual void build(const AddWeightFn& add) {}
  // Fills them from a trained float kernel (model.quantize()).
  virtual void quantize_from(const at::Tensor& float_kernel) {}
  // Post-training static quantization: record the range of inputs seen
  // (calibrate), then fix a per-tensor input scale (finish_calibration).
  // Modes without static input scales ignore both.
  virtual void calibrate(const at::Tensor& x) {}
  virtual void finish_calibration(const std::string& method, double percentile, const AddWeightFn& add) {}
  // "dynamic" (per-row input scales at run time) or "static" (calibrated).
  virtual std::string activation_scheme() const { return "dynamic"; }
};

using KernelImplPtr = std::unique_ptr<KernelImpl>;

// x (..., in) times kernel (in, out) -> (..., out).
KernelImplPtr float_matmul_impl();
// at::einsum(equation, {x, kernel}).
KernelImplPtr float_einsum_impl(const std::string& equation);

// The implementation for a quantization mode ("float", "int8", "float8",
// "int8_qat"); ValueError naming the known modes otherwise. `amax_history_length`
// is float8's.
KernelImplPtr make_kernel_impl(const std::string& mode, const KernelSpec& spec, int64_t amax_history_length = 1024);
// The modes make_kernel_impl knows: "float" and the registered ones.
std::vector<std::string> quantization_modes();

// The seam kiln/quantization fills (at load, from a static initializer):
// a maker per quantized mode, and how a mode quantizes an embedding table
// row by row (int8: one abs-max scale per row; returns {values, scales}).
// Not thread-safe: registration happens while libraries load.
using KernelImplMaker = std::function<KernelImplPtr(const KernelSpec& spec, int64_t amax_history_length)>;
using TableQuantizer = std::function<std::pair<at::Tensor, at::Tensor>(const at::Tensor& table)>;
void register_kernel_impl(const std::string& mode, KernelImplMaker make, TableQuantizer quantize_table = nullptr);
// ValueError when `mode` has no table quantizer.
std::pair<at::Tensor, at::Tensor> quantize_table(const std::string& mode, const at::Tensor& table);

}  // namespace kiln
