#include "kiln/layers/kernel_impl.h"

namespace kiln {
namespace {

class FloatMatmul : public KernelImpl {
 public:
  std::string mode() const override { return "float"; }
  at::Tensor apply(const at::Tensor& x, const at::Tensor& kernel) const override { return at::matmul(x, kernel); }
  at::Tensor apply_with_bias(const at::Tensor& x, const at::Tensor& kernel, const at::Tensor& bias) const override {
    if (bias.defined() && x.dim() == 2 && x.scalar_type() == kernel.scalar_type() &&
        bias.scalar_type() == kernel.scalar_type())
      return at::addmm(bias, x, kernel);
    at::Tensor y = apply(x, kernel);
    return bias.defined() ? y + bias : y;
  }
};

class FloatEinsum : public KernelImpl {
 public:
  explicit FloatEinsum(std::string equation) : equation_(std::move(equation)) {}
  std::string mode() const override { return "float"; }
  at::Tensor apply(const at::Tensor& x, const at::Tensor& kernel) const override {
    return at::einsum(equation_, {x, kernel});
  }

 private:
  std::string equation_;
};

}  // namespace

KernelImplPtr float_matmul_impl() { return std::make_unique<FloatMatmul>(); }
KernelImplPtr float_einsum_impl(const std::string& equation) { return std::make_unique<FloatEinsum>(equation); }

}  // namespace kiln
