#include "kiln/quantization/kernels.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <atomic>
#include <mutex>

#include "kiln/core/error.h"
#include "kiln/layers/kernel_impl.h"
#include "kiln/quantization/float8.h"
#include "kiln/quantization/int8.h"

namespace kiln {
namespace quantization {

std::atomic<bool> g_calibrating{false};
bool calibration_active() { return g_calibrating.load(); }
CalibrationScope::CalibrationScope() { g_calibrating.store(true); }
CalibrationScope::~CalibrationScope() { g_calibrating.store(false); }

namespace {

std::vector<int64_t> positive_axes(const std::vector<int64_t>& axes, int64_t rank) {
  std::vector<int64_t> out;
  for (int64_t a : axes) out.push_back(a < 0 ? a + rank : a);
  return out;
}

// The straight-through estimator: forward `q`, backward identity to `x`.
at::Tensor straight_through(const at::Tensor& x, const at::Tensor& q) {
  if (!x.requires_grad()) return q;
  return x + (q - x).detach();
}

// Shape of a scale kept per the non-reduced axes of `shape` (reduced axes 1).
Shape keepdim_shape(const Shape& shape, const std::vector<int64_t>& reduced) {
  Shape s = shape;
  for (int64_t a : positive_axes(reduced, static_cast<int64_t>(shape.size()))) s[a] = 1;
  return s;
}

// ---------------------------------------------------------------------------
// int8: int8 kernel with per-output-channel abs-max scales; inputs quantized
// per row (dynamic) or with a calibrated per-tensor scale (static).
class Int8Kernel : public KernelImpl {
 public:
  explicit Int8Kernel(KernelSpec spec) : spec_(std::move(spec)) {}
  std::string mode() const override { return "int8"; }
  bool keeps_float_kernel() const override { return false; }
  std::string activation_scheme() const override { return inputs_scale_ ? "static" : "dynamic"; }

  void build(const AddWeightFn& add) override {
    kernel_ = add("kernel", spec_.kernel_shape, constant_initializer(0.0), false, at::kChar);
    Shape ss = spec_.equation.empty() ? Shape{spec_.kernel_shape.back()}
                                      : keepdim_shape(spec_.kernel_shape, spec_.kernel_reduced_axes);
    kernel_scale_ = add("kernel_scale", ss, constant_initializer(1.0), false, at::kFloat);
    if (spec_.static_inputs) build_static(add);
  }
  // A saved static model: its inputs_scale weight comes back with build().
  void build_static(const AddWeightFn& add) {
    inputs_scale_ = add("inputs_scale", Shape{}, constant_initializer(1.0), false, at::kFloat);
  }

  void quantize_from(const at::Tensor& w) override {
    auto [q, scale] = abs_max_quantize(w, positive_axes(spec_.kernel_reduced_axes, w.dim()));
    kernel_->assign(q);
    kernel_scale_->assign(spec_.equation.empty() ? scale.reshape({-1}) : scale);
  }

  void calibrate(const at::Tensor& x) override {
    at::Tensor a = x.detach().abs().to(at::kFloat).reshape({-1});
    std::lock_guard<std::mutex> l(mu_);
    observed_amax_ = std::max(observed_amax_, a.numel() ? a.max().item<double>() : 0.0);
    // A bounded sample of |x| for percentiles: every k-th value.
    const int64_t stride = std::max<int64_t>(1, a.numel() / 65536);
    sample_.push_back(a.slice(0, 0, a.numel(), stride).clone());
  }

  void finish_calibration(const std::string& method, double percentile, const AddWeightFn& add) override {
    std::lock_guard<std::mutex> l(mu_);
    if (sample_.empty())
      throw StateError("calibration saw no inputs for this layer: the calibration data must run through the model");
    double amax = observed_amax_;
    if (method == "percentile") {
      at::Tensor all = at::cat(sample_);
      amax = at::quantile(all.to(at::kDouble), percentile / 100.0).item<double>();
    } else if (method != "minmax") {
      throw ValueError("calibration method must be 'minmax' or 'percentile'. Received: '" + method + "'");
    }
    if (!inputs_scale_) build_static(add);
    inputs_scale_->assign(at::full({}, 127.0 / (amax + kInt8Epsilon), at::kFloat));
    sample_.clear();
    observed_amax_ = 0;
  }

  at::Tensor apply(const at::Tensor& x, const at::Tensor& kernel) const override {
    return apply_with_bias(x, kernel, at::Tensor(), false);
  }

  at::Tensor apply_with_bias(const at::Tensor& x, const at::Tensor&, const at::Tensor& bias,
                             bool training) const override {
    if (calibration_active()) const_cast<Int8Kernel*>(this)->calibrate(x);
    const at::ScalarType out_dtype = x.scalar_type();
    at::Tensor y = spec_.equation.empty() ? matmul(x, bias) : einsum(x, bias);
    y = y.to(out_dtype);
    // Gradients reach the inputs through the dequantized kernel (as Keras's
    // int8 Dense); the int8 kernel itself is not trained.
    if (at::GradMode::is_enabled() && x.requires_grad()) {
      at::Tensor w = dequantized_kernel().to(out_dtype);
      at::Tensor f = spec_.equation.empty() ? at::matmul(x, w) : at::einsum(spec_.equation, {x, w});
      y = y + (f - f.detach());
    }
    if (at::GradMode::is_enabled() && bias.defined() && bias.requires_grad()) {
      // The bias was added without autograd: add a zero that carries its gradient.
      at::Tensor b = bias.to(out_dtype);
      y = y + (b - b.detach());
    }
    return y;
  }

  at::Tensor dequantized_kernel() const {
    at::Tensor s = kernel_scale_->value();
    if (spec_.equation.empty()) s = s.reshape({1, -1});
    return kernel_->value().to(at::kFloat) / s;
  }

 private:
  at::Tensor matmul(const at::Tensor& x, const at::Tensor& bias) const {
    at::NoGradGuard ng;
    const int64_t in = x.size(-1);
    // Per-row quantization, the int8 GEMM, acc / (inputs_scale * kernel_scale) + bias.
    at::Tensor y = packed_weights()->dense(x.reshape({-1, in}), inputs_scale_ ? inputs_scale_->value() : at::Tensor(),
                                           kernel_scale_->value(), bias);
    std::vector<int64_t> out(x.sizes().begin(), x.sizes().end());
    out.back() = y.size(1);
    return y.reshape(out);
  }

  at::Tensor einsum(const at::Tensor& x, const at::Tensor& bias) const {
    at::NoGradGuard ng;
    at::Tensor xf = x.to(at::kFloat);
    at::Tensor xs, xq;
    if (inputs_scale_) {
      xs = inputs_scale_->value();
      xq = quantize_with_scale(xf, xs);
      std::vector<int64_t> ones(xf.dim(), 1);
      xs = xs.reshape(ones);
    } else {
      std::tie(xq, xs) = abs_max_quantize(xf, positive_axes(spec_.input_reduced_axes, xf.dim()));
    }
    // Exact integer sums: int32 operands.
    at::Tensor acc = at::einsum(spec_.equation, {xq.to(at::kInt), kernel_->value().to(at::kInt)});
    // The scales have size 1 on the summed axes: the same einsum broadcasts
    // their product to the output's layout.
    at::Tensor denom = at::einsum(spec_.equation, {xs, kernel_scale_->value()});
    at::Tensor y = acc.to(at::kFloat) / denom;
    return bias.defined() ? y + bias.detach().to(at::kFloat) : y;
  }

  // The int8 kernel prepared for its GEMM, remade when the variable's tensor
  // changes (load_weights, set_weights assign new values).
  std::shared_ptr<Int8Weights> packed_weights() const {
    at::Tensor w = kernel_->value();
    std::lock_guard<std::mutex> l(pack_mu_);
    if (!packed_ || packed_ptr_ != w.data_ptr() || packed_version_ != w._version()) {
      packed_ = std::make_shared<Int8Weights>(w);
      packed_ptr_ = w.data_ptr();
      packed_version_ = w._version();
    }
    return packed_;
  }

  KernelSpec spec_;
  VariablePtr kernel_, kernel_scale_, inputs_scale_;
  mutable std::mutex pack_mu_;  // guards the three below
  mutable std::shared_ptr<Int8Weights> packed_;
  mutable void* packed_ptr_ = nullptr;
  mutable int64_t packed_version_ = -1;
  std::mutex mu_;  // guards the calibration state below
  double observed_amax_ = 0;
  std::vector<at::Tensor> sample_;
};

// ---------------------------------------------------------------------------
// float8: inputs and kernel through e4m3fn, the output gradient through e5m2,
// each with delayed scaling (kiln/quantization/float8.h).
struct Float8State {
  VariablePtr scale, history;
};

// Advances `st` as a training step does after quantizing `t` with the
// current scale: the new scale from the history, then t's amax pushed in.
void advance_float8_state(const Float8State& st, const at::Tensor& t, Float8Format f) {
  at::Tensor scale = st.scale->value(), history = st.history->value();
  st.scale->assign(compute_float8_scale(history.max(), scale, f));
  st.history->assign(compute_amax_history(t, history));
}

// Forward: identity. Backward: the gradient rounded to e5m2 with the
// output-gradient scale; in training, that scale and history advance.
struct OutputGradFloat8 : public torch::autograd::Function<OutputGradFloat8> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& y, Float8State* state,
                            bool training) {
    ctx->saved_data["state"] = reinterpret_cast<int64_t>(state);
    ctx->saved_data["training"] = training;
    return y.view_as(y);
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    auto* st = reinterpret_cast<Float8State*>(ctx->saved_data["state"].toInt());
    at::NoGradGuard ng;
    const at::Tensor& g = grads[0];
    at::Tensor gq = quantize_and_dequantize(g, st->scale->value(), Float8Format::kE5M2);
    if (ctx->saved_data["training"].toBool()) advance_float8_state(*st, g, Float8Format::kE5M2);
    return {gq, at::Tensor(), at::Tensor()};
  }
};

// x [M, K] times kernel [K, N] on the tensor cores (at::_scaled_mm): x and
// the kernel as e4m3fn with their current scales, the output gradient as
// e5m2 with its own; each of the three products multiplies float8 values
// with float32 accumulation. The values and scales are those of the
// emulation (Float8Kernel::qdq and OutputGradFloat8), so the result is the
// same up to the order of the sums. Needs M, K and N multiples of 16.
struct Float8ScaledMatmul : public torch::autograd::Function<Float8ScaledMatmul> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& kernel,
                            const Float8State* in, const Float8State* ker, const Float8State* grad, bool training) {
    at::NoGradGuard ng;
    const at::Tensor sx = in->scale->value().to(at::kFloat).clone(), sk = ker->scale->value().to(at::kFloat).clone();
    const at::Tensor xq = quantize_to_float8(x, sx, Float8Format::kE4M3FN);
    const at::Tensor kq = quantize_to_float8(kernel, sk, Float8Format::kE4M3FN);
    if (training) {
      advance_float8_state(*in, x, Float8Format::kE4M3FN);
      advance_float8_state(*ker, kernel, Float8Format::kE4M3FN);
    }
    // The second operand column-major, as cuBLASLt's float8 GEMM wants it.
    at::Tensor y = at::_scaled_mm(xq, kq.t().contiguous().t(), sx, sk, std::nullopt, std::nullopt, x.scalar_type());
    ctx->save_for_backward({xq, kq, sx, sk});
    ctx->saved_data["grad"] = reinterpret_cast<int64_t>(grad);
    ctx->saved_data["training"] = training;
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["kernel_dtype"] = static_cast<int64_t>(kernel.scalar_type());
    return y;
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    at::NoGradGuard ng;
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &xq = saved[0], &kq = saved[1], &sx = saved[2], &sk = saved[3];
    const auto* st = reinterpret_cast<const Float8State*>(ctx->saved_data["grad"].toInt());
    const at::Tensor g = grads[0].contiguous();
    const at::Tensor sg = st->scale->value().to(at::kFloat).clone();
    const at::Tensor gq = quantize_to_float8(g, sg, Float8Format::kE5M2);
    if (ctx->saved_data["training"].toBool()) advance_float8_state(*st, g, Float8Format::kE5M2);
    const auto x_dtype = static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    const auto k_dtype = static_cast<at::ScalarType>(ctx->saved_data["kernel_dtype"].toInt());
    // dx = g kernel^T: kq [K, N] row-major is kq^T [N, K] column-major.
    at::Tensor dx = at::_scaled_mm(gq, kq.t(), sg, sk, std::nullopt, std::nullopt, x_dtype);
    // dkernel = x^T g: x^T row-major, g column-major.
    at::Tensor dk =
        at::_scaled_mm(xq.t().contiguous(), gq.t().contiguous().t(), sx, sg, std::nullopt, std::nullopt, k_dtype);
    return {dx, dk, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

class Float8Kernel : public KernelImpl {
 public:
  Float8Kernel(KernelSpec spec, int64_t history_length) : spec_(std::move(spec)), length_(history_length) {
    if (length_ < 1) throw ValueError("float8: amax_history_length must be >= 1. Received: " + std::to_string(length_));
  }
  std::string mode() const override { return "float8"; }

  void build(const AddWeightFn& add) override {
    auto make = [&](const std::string& prefix) {
      Float8State s;
      s.scale = add(prefix + "_scale", Shape{}, constant_initializer(1.0), false, at::kFloat);
      s.history = add(prefix + "_amax_history", Shape{length_}, constant_initializer(0.0), false, at::kFloat);
      return s;
    };
    inputs_ = make("inputs");
    kernel_ = make("kernel");
    outputs_grad_ = std::make_unique<Float8State>(make("outputs_grad"));
  }

  at::Tensor apply(const at::Tensor& x, const at::Tensor& kernel) const override {
    return apply_with_bias(x, kernel, at::Tensor(), false);
  }

  at::Tensor apply_with_bias(const at::Tensor& x, const at::Tensor& kernel, const at::Tensor& bias,
                             bool training) const override {
    if (tensor_cores(x, kernel)) {
      const int64_t k = kernel.size(0);
      at::Tensor y =
          Float8ScaledMatmul::apply(x.reshape({-1, k}), kernel, &inputs_, &kernel_, outputs_grad_.get(), training);
      std::vector<int64_t> shape = x.sizes().vec();
      shape.back() = kernel.size(1);
      y = y.view(shape);
      return bias.defined() ? y + bias : y;
    }
    at::Tensor xq = qdq(x, inputs_, training, Float8Format::kE4M3FN);
    at::Tensor kq = qdq(kernel, kernel_, training, Float8Format::kE4M3FN);
    at::Tensor y = spec_.equation.empty() ? at::matmul(xq, kq) : at::einsum(spec_.equation, {xq, kq});
    if (y.requires_grad()) y = OutputGradFloat8::apply(y, outputs_grad_.get(), training);
    return bias.defined() ? y + bias : y;
  }

 private:
  // A Dense product (x [..., K] times kernel [K, N]) the GPU's float8
  // tensor cores can take: every dimension a multiple of 16.
  bool tensor_cores(const at::Tensor& x, const at::Tensor& kernel) const {
    if (!spec_.equation.empty() || kernel.dim() != 2 || x.dim() < 2 || !x.is_cuda()) return false;
    const int64_t k = kernel.size(0), n = kernel.size(1);
    if (x.size(-1) != k || k % 16 || n % 16 || (x.numel() / k) % 16) return false;
    const auto t = x.scalar_type();
    if (t != at::kFloat && t != at::kBFloat16 && t != at::kHalf) return false;
    return float8_tensor_cores(x.device());
  }

  // Keras's quantize_and_dequantize with the current scale (straight-through
  // gradient); in training the scale and history then advance.
  static at::Tensor qdq(const at::Tensor& t, const Float8State& st, bool training, Float8Format f) {
    at::Tensor q;
    {
      at::NoGradGuard ng;
      q = quantize_and_dequantize(t.detach(), st.scale->value(), f);
      if (training) advance_float8_state(st, t, f);
    }
    return straight_through(t, q);
  }

  KernelSpec spec_;
  int64_t length_;
  Float8State inputs_, kernel_;
  std::unique_ptr<Float8State> outputs_grad_;  // stable address for the autograd node
};

// ---------------------------------------------------------------------------
// int8_qat: quantization-aware training. The float kernel trains; forward
// rounds it per output channel and the inputs per row exactly as int8
// inference will, gradients pass straight through the rounding.
class Int8QatKernel : public KernelImpl {
 public:
  explicit Int8QatKernel(KernelSpec spec) : spec_(std::move(spec)) {}
  std::string mode() const override { return "int8_qat"; }
  at::Tensor apply(const at::Tensor& x, const at::Tensor& kernel) const override {
    at::Tensor xf = x.to(at::kFloat), kf = kernel.to(at::kFloat);
    at::Tensor xq, kq;
    {
      at::NoGradGuard ng;
      auto [qx, sx] = abs_max_quantize(xf.detach(), positive_axes(spec_.input_reduced_axes, xf.dim()));
      auto [qk, sk] = abs_max_quantize(kf.detach(), positive_axes(spec_.kernel_reduced_axes, kf.dim()));
      xq = qx.to(at::kFloat) / sx;
      kq = qk.to(at::kFloat) / sk;
    }
    at::Tensor a = straight_through(xf, xq), b = straight_through(kf, kq);
    at::Tensor y = spec_.equation.empty() ? at::matmul(a, b) : at::einsum(spec_.equation, {a, b});
    return y.to(x.scalar_type());
  }

 private:
  KernelSpec spec_;
};

}  // namespace
}  // namespace quantization

namespace {

// The quantized modes, at layers' KernelImpl seam (kiln/layers/kernel_impl.h)
// when this library loads; registration order is the order error messages
// list them in.
[[maybe_unused]] const bool kernels_registered = [] {
  register_kernel_impl(
      "int8", [](const KernelSpec& spec, int64_t) { return std::make_unique<quantization::Int8Kernel>(spec); },
      [](const at::Tensor& table) { return quantization::abs_max_quantize(table, {1}); });
  register_kernel_impl("float8", [](const KernelSpec& spec, int64_t amax_history_length) {
    return std::make_unique<quantization::Float8Kernel>(spec, amax_history_length);
  });
  register_kernel_impl(
      "int8_qat", [](const KernelSpec& spec, int64_t) { return std::make_unique<quantization::Int8QatKernel>(spec); });
  return true;
}();

}  // namespace

}  // namespace kiln
