// int8 numerics: the seeds' abs-max scheme (Keras's abs_max_quantize) and an
// int8 x int8 -> int32 GEMM on a real integer kernel.
//
//   auto [q, scale] = abs_max_quantize(w, {0});   // per output channel of a (in, out) kernel
//   // q = clip(round(w * scale), -127, 127) as int8, scale = 127 / (max|w| + 1e-7)
//   at::Tensor acc = int8_matmul(xq, q);          // (M, K) s8 x (K, N) s8 -> (M, N) s32
//   at::Tensor y = acc / (x_scale * scale);       // back to float
//
// Int8Weights holds a kernel prepared for one of three GEMMs (int8_backend):
//   onednn  Debian's libdnnl s8 GEMM, on CPUs with int8 dot products (VNNI,
//           AMX) only; weights reordered once per batch size.
//   fbgemm  LibTorch's fbgemm (quantized::linear_prepack, the prepacked
//           weight's float-in, float-out product), on every x86 CPU: with
//           unit weight scales and integer-valued inputs it returns the
//           exact integer sums. Without VNNI its kernel adds pairs of u8 x s8
//           products in a saturating int16, so there inputs with negative
//           values are narrowed to 7 bits (fbgemm_wide_inputs()).
//   exact   LibTorch's int32 matmul: exact everywhere, and slow.
// Every kernel gives the same integer sums for the same int8 inputs.
//
// Thread safety: all functions may run concurrently (the prepared weights
// are guarded by a mutex; oneDNN primitives and fbgemm's packed weights are
// reentrant).
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

namespace kiln::quantization {

// Keras's epsilon in abs_max_quantize.
constexpr double kInt8Epsilon = 1e-7;

// {int8 values, float32 scale}: the scale is 127 / (max |x| over `axes` + 1e-7),
// kept with size-1 axes where reduced (keepdim), values clip(round(x * scale)).
std::pair<at::Tensor, at::Tensor> abs_max_quantize(const at::Tensor& x, const std::vector<int64_t>& axes);
// x (float) quantized with a given scale (broadcastable): clip(round(x * scale), -127, 127) as int8.
at::Tensor quantize_with_scale(const at::Tensor& x, const at::Tensor& scale);

// Fused forms of the same arithmetic for the Dense hot path (one pass over
// the data each instead of five ATen ops; same results bit for bit):
// per-row abs-max quantization of a float32 (M, K) matrix: {int8 (M, K),
// scale (M, 1)}; with `static_scale` (a scalar) every row uses it instead.
std::pair<at::Tensor, at::Tensor> quantize_rows(const at::Tensor& x, const at::Tensor& static_scale = at::Tensor());
// acc (M, N) int32 -> float32 acc / (row_scale[i] * col_scale[j]) + bias[j]
// (row_scale (M, 1) or a scalar; bias undefined: none).
at::Tensor dequantize_product(const at::Tensor& acc, const at::Tensor& row_scale, const at::Tensor& col_scale,
                              const at::Tensor& bias);

// (M, K) int8 x (K, N) int8 -> (M, N) int32, exact. Prepares `b` for this one
// product (a reorder per call); repeated products with the same weights use
// Int8Weights, as the int8 layers do.
at::Tensor int8_matmul(const at::Tensor& a, const at::Tensor& b);

// An int8 (K, N) weight matrix prepared for many products (as PyTorch
// prepacks its quantized Linear): reordered into the layout of the kernel
// that runs, once (oneDNN: once per batch size). The matrix must not change
// afterwards (int8 kernels do not train; a layer makes a new one when its
// weights are assigned).
//
//   Int8Weights w(q);                                   // q: (K, N) int8, scales (N)
//   at::Tensor y = w.dense(x, at::Tensor(), scales, bias);  // x (M, K) float -> (M, N) float
class Int8Weights {
 public:
  explicit Int8Weights(const at::Tensor& w);
  // (M, K) int8 -> (M, N) int32, exact; thread-safe.
  at::Tensor matmul(const at::Tensor& a) const;
  // The int8 Dense product of a float (M, K) matrix: its rows quantized as
  // quantize_rows does (with `static_scale` when defined), the int8
  // product, then dequantize_product with `col_scale` (N) and `bias`
  // (undefined: none). Where fbgemm runs without wide inputs, rows with
  // negative values use 63 / (max|x| + 1e-7) (static: static_scale * 63 /
  // 127) and clip to +-63; rows without keep 8 bits and give the same bits
  // as the other kernels. Thread-safe.
  at::Tensor dense(const at::Tensor& x, const at::Tensor& static_scale, const at::Tensor& col_scale,
                   const at::Tensor& bias) const;
  const at::Tensor& weights() const { return w_; }

 private:
  at::Tensor onednn_matmul(const at::Tensor& a) const;
  // fbgemm's float32 sums of integer-valued float inputs q (zero point added).
  at::Tensor fbgemm_sums(const at::Tensor& q, int64_t zero_point) const;
  struct Packed;
  at::Tensor w_;
  std::shared_ptr<Packed> packed_;
};

// The kernel an int8 product with `batch` rows runs on here: "onednn",
// "fbgemm" or "exact". By default ("auto") the fastest measured for this
// CPU class and batch size (docs/PERFORMANCE.md).
std::string int8_backend(int64_t batch = 256);
// "auto", "onednn", "fbgemm" or "exact" ("libtorch": the old name of
// "exact"); the environment variable KILN_INT8_KERNEL sets it at start-up.
// A kernel this CPU or build cannot run exactly falls back to "exact":
// oneDNN without int8 dot products, fbgemm without LibTorch's fbgemm.
// Returns the previous setting ("auto", ...), to restore it.
std::string set_int8_backend(const std::string& name);
// Whether fbgemm adds full 8-bit u8 x s8 products exactly on this CPU (its
// kernel uses VNNI): measured once on a worst-case product, so that an ISA
// forced with FBGEMM_ENABLE_INSTRUCTIONS counts too. False also without fbgemm.
bool fbgemm_wide_inputs();
// Whether this LibTorch has fbgemm (x86 builds) and its quantized engine
// is fbgemm's (the default "x86" or "fbgemm").
bool fbgemm_available();

}  // namespace kiln::quantization
