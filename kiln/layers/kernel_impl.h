// KernelImpl: how a quantizable layer applies its kernel to its input.
//
// Dense, EinsumDense and Conv1D/Conv2D own their variables but delegate the
// kernel product to a small strategy object:
//
//   at::Tensor y = impl_->apply(x, value(kernel_));   // then bias, activation
//
// This is the seam through which quantize("int8" | "float8" | "int4") (a
// later issue) swaps in a quantized implementation that carries its own
// integer kernel and scales, with no mode branches inside the layers
// (STYLE.md item 7). Today only the float implementations exist and
// Layer::quantize still throws.
//
// Thread safety: implementations are immutable after construction; apply()
// may run concurrently.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>

namespace kiln {

class KernelImpl {
 public:
  virtual ~KernelImpl() = default;
  // "float" for the implementations below; later "int8", "float8", "int4".
  virtual std::string mode() const = 0;
  // The kernel product, in the dtype of `x` and `kernel` (the layer's
  // compute dtype). Bias and activation are the layer's job.
  virtual at::Tensor apply(const at::Tensor& x, const at::Tensor& kernel) const = 0;
  // The product plus `bias` (undefined: none). The float matmul fuses the
  // bias into the GEMM for 2-D inputs (at::addmm), as torch.nn.Linear does.
  virtual at::Tensor apply_with_bias(const at::Tensor& x, const at::Tensor& kernel, const at::Tensor& bias) const {
    at::Tensor y = apply(x, kernel);
    return bias.defined() ? y + bias : y;
  }
};

using KernelImplPtr = std::unique_ptr<KernelImpl>;

// x (..., in) times kernel (in, out) -> (..., out).
KernelImplPtr float_matmul_impl();
// at::einsum(equation, {x, kernel}).
KernelImplPtr float_einsum_impl(const std::string& equation);

}  // namespace kiln
