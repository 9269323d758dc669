// int8 numerics: the seeds' abs-max scheme (Keras's abs_max_quantize) and an
// int8 x int8 -> int32 GEMM on a real integer kernel.
//
//   auto [q, scale] = abs_max_quantize(w, {0});   // per output channel of a (in, out) kernel
//   // q = clip(round(w * scale), -127, 127) as int8, scale = 127 / (max|w| + 1e-7)
//   at::Tensor acc = int8_matmul(xq, q);          // (M, K) s8 x (K, N) s8 -> (M, N) s32
//   at::Tensor y = acc / (x_scale * scale);       // back to float
//
// Int8Weights runs oneDNN's matmul (Debian's libdnnl: VNNI or AMX-INT8 where
// the CPU has them) with primitives and reordered weights cached per batch size; without oneDNN it is
// LibTorch's integer matmul (exact, slower). Both give the exact int32 sums.
//
// Thread safety: all functions may run concurrently (the primitive cache is
// guarded by a mutex; oneDNN primitives are reentrant).
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

// An int8 (K, N) weight matrix prepared for many products: with oneDNN, the
// weights are reordered once per batch size into the blocked layout the
// VNNI/AMX kernel reads (as PyTorch prepacks its quantized Linear), instead
// of on every call. The matrix must not change afterwards (int8 kernels do
// not train; a layer makes a new one when its weights are assigned).
class Int8Weights {
 public:
  explicit Int8Weights(const at::Tensor& w);
  // (M, K) int8 -> (M, N) int32, exact; thread-safe.
  at::Tensor matmul(const at::Tensor& a) const;
  const at::Tensor& weights() const { return w_; }

 private:
  struct Packed;
  at::Tensor w_;
  std::shared_ptr<Packed> packed_;
};
// The backend int8_matmul uses: "onednn" or "libtorch". oneDNN only on a
// CPU with int8 dot products (CpuFeatures::int8_dot): elsewhere its kernel
// saturates int16 sums, so LibTorch's exact int32 GEMM runs instead.
std::string int8_backend();
// Forces LibTorch's integer matmul even with oneDNN (benchmarks compare
// both); "onednn" asks for oneDNN where the CPU allows it.
void set_int8_backend(const std::string& name);

}  // namespace kiln::quantization
