#include "kiln/layers/kernel_impl.h"

#include "kiln/core/cpu_features.h"
#include "kiln/core/error.h"

namespace kiln {
namespace {

// bf16 products on a CPU without native bf16: LibTorch's own bf16 GEMM is a
// generic loop there (40x slower than float32 on an AVX2 EPYC). Upcasting is
// exact, float32 GEMMs accumulate in float32 as oneDNN's bf16 GEMM does, and
// the result is rounded back to bf16: the same numerics at float32's speed.
// float16 likewise: LibTorch 1.13 has no float16 GEMM on CPU at all. And
// even with native bf16, LibTorch 1.13 hands a bf16 product to oneDNN (which
// accumulates in float32) only when m * n * k > 16^3; smaller ones run its
// own loop, which rounds every partial sum to bf16 (at 16x16x16, 177 of 256
// outputs differ). Those take the float32 path too, so kiln's bf16 products
// always accumulate in float32.
bool upcast_16bit(const at::Tensor& x, const at::Tensor& kernel) {
  if (!x.device().is_cpu()) return false;
  if (x.scalar_type() == at::kHalf) return true;
  if (x.scalar_type() != at::kBFloat16) return false;
  return !cpu_features().fast_bf16() || x.numel() * kernel.size(-1) <= 4096;
}

class FloatMatmul : public KernelImpl {
 public:
  std::string mode() const override { return "float"; }
  at::Tensor apply(const at::Tensor& x, const at::Tensor& kernel) const override {
    if (upcast_16bit(x, kernel)) return at::matmul(x.to(at::kFloat), kernel.to(at::kFloat)).to(x.scalar_type());
    return at::matmul(x, kernel);
  }
  at::Tensor apply_with_bias(const at::Tensor& x, const at::Tensor& kernel, const at::Tensor& bias,
                             bool training) const override {
    // One row in inference (a request served without batching, or alone in
    // its batch; predict on one example): OpenBLAS's GEMM packs the whole
    // kernel into a buffer on every call, which for one row costs more than
    // the product. A matrix-vector product reads the kernel once: 1x784 @
    // 784x256 takes 23 us against 78 us on an AVX2 EPYC (docs/PERFORMANCE.md).
    // The row's sums then run in another order than in a batch, as GEMM's
    // already do between batch sizes (last bits). Training keeps GEMM.
    if (!training && x.dim() == 2 && x.size(0) == 1 && x.device().is_cpu() && x.scalar_type() == at::kFloat &&
        kernel.scalar_type() == at::kFloat && (!bias.defined() || bias.scalar_type() == at::kFloat)) {
      at::Tensor y = at::mv(kernel.t(), x[0]);
      if (bias.defined()) y.add_(bias);
      return y.unsqueeze(0);
    }
    if (bias.defined() && x.dim() == 2 && x.scalar_type() == kernel.scalar_type() &&
        bias.scalar_type() == kernel.scalar_type()) {
      if (upcast_16bit(x, kernel))
        return at::addmm(bias.to(at::kFloat), x.to(at::kFloat), kernel.to(at::kFloat)).to(x.scalar_type());
      // float32: Debian's LibTorch runs addmm (beta = 1) on a path 2x slower
      // than mm followed by an in-place add on an AVX-512 EPYC (6.7 ms
      // against 14.6 ms for 256x1024x1024; bench/precision_bench). In-place
      // is safe under autograd: mm's backward does not read its output.
      if (x.scalar_type() == at::kFloat) return at::mm(x, kernel).add_(bias);
      return at::addmm(bias, x, kernel);
    }
    at::Tensor y = apply(x, kernel);
    return bias.defined() ? y + bias : y;
  }
};

class FloatEinsum : public KernelImpl {
 public:
  explicit FloatEinsum(std::string equation) : equation_(std::move(equation)) {}
  std::string mode() const override { return "float"; }
  at::Tensor apply(const at::Tensor& x, const at::Tensor& kernel) const override {
    if (upcast_16bit(x, kernel))
      return at::einsum(equation_, {x.to(at::kFloat), kernel.to(at::kFloat)}).to(x.scalar_type());
    return at::einsum(equation_, {x, kernel});
  }

 private:
  std::string equation_;
};

}  // namespace

KernelImplPtr float_matmul_impl() { return std::make_unique<FloatMatmul>(); }
KernelImplPtr float_einsum_impl(const std::string& equation) { return std::make_unique<FloatEinsum>(equation); }

namespace {

struct RegisteredMode {
  std::string mode;
  KernelImplMaker make;
  TableQuantizer quantize_table;
};

std::vector<RegisteredMode>& registered_modes() {
  static std::vector<RegisteredMode> modes;
  return modes;
}

const RegisteredMode& registered_mode(const std::string& mode) {
  for (const RegisteredMode& m : registered_modes())
    if (m.mode == mode) return m;
  if (registered_modes().empty())
    throw ValueError("quantization mode '" + mode +
                     "' is not available: no quantized kernels are registered; link kiln::quantization "
                     "(libkiln_quantization)");
  std::string known;
  for (size_t i = 0; i < registered_modes().size(); ++i)
    known += (i == 0 ? "" : i + 1 == registered_modes().size() ? " and " : ", ") + registered_modes()[i].mode;
  throw ValueError("unknown quantization mode '" + mode + "'; kiln knows " + known);
}

}  // namespace

void register_kernel_impl(const std::string& mode, KernelImplMaker make, TableQuantizer quantize_table) {
  registered_modes().push_back({mode, std::move(make), std::move(quantize_table)});
}

std::vector<std::string> quantization_modes() {
  std::vector<std::string> modes = {"float"};
  for (const RegisteredMode& m : registered_modes()) modes.push_back(m.mode);
  return modes;
}

KernelImplPtr make_kernel_impl(const std::string& mode, const KernelSpec& spec, int64_t amax_history_length) {
  if (mode == "float") return spec.equation.empty() ? float_matmul_impl() : float_einsum_impl(spec.equation);
  return registered_mode(mode).make(spec, amax_history_length);
}

std::pair<at::Tensor, at::Tensor> quantize_table(const std::string& mode, const at::Tensor& table) {
  const RegisteredMode& m = registered_mode(mode);
  if (!m.quantize_table) throw ValueError("quantization mode '" + mode + "' cannot quantize an embedding table");
  return m.quantize_table(table);
}

}  // namespace kiln
