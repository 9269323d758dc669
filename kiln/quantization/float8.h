// float8 numerics (Keras's float8 training design).
//
// Values are kept in float32 and rounded to the nearest float8 value with
// LibTorch's float8 dtypes (at::kFloat8_e4m3fn, at::kFloat8_e5m2): round to
// nearest, ties to even, in the format's normal and subnormal range; beyond
// the largest finite value saturate to it (as Keras clips before casting);
// NaN stays NaN. (Until kiln moved to LibTorch 2.11 this rounding was kiln's
// own bit arithmetic: LibTorch 1.13 had no float8 dtype.)
//
//   e4m3fn  1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities;
//           largest 448, smallest subnormal 2^-9 (forward: inputs, kernel)
//   e5m2    1 sign, 5 exponent (bias 15), 2 mantissa bits; largest 57344,
//           smallest subnormal 2^-16 (backward: output gradients)
//
// Delayed scaling (Keras's compute_float8_scale / amax history): each
// tensor has a scale and an amax history (length 1024 by default). A step
// quantizes x as round(x / scale) and dequantizes by * scale, with the scale
// from earlier steps; then the new scale is float8_max / max(history) (kept
// when that max is 0 or not finite; margin 0) and x's amax is pushed into
// the history.
//
// On a GPU of compute capability 8.9 or above (Ada, Hopper, Blackwell) a
// float8 Dense or EinsumDense whose product is a 2-D matmul with every
// dimension a multiple of 16 multiplies the float8 values themselves on the
// tensor cores (at::_scaled_mm, float32 accumulation) in the forward pass
// and both backward products; elsewhere the product runs on the
// dequantized values (the exact emulation). The rounding and the scales are
// the same; only the accumulation order differs.
//
// Thread safety: pure functions.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace kiln::quantization {

enum class Float8Format { kE4M3FN, kE5M2 };

constexpr int64_t kDefaultAmaxHistoryLength = 1024;  // Keras's QuantizedFloat8DTypePolicy default

double float8_max(Float8Format f);        // 448 or 57344
const char* float8_name(Float8Format f);  // "float8_e4m3fn", "float8_e5m2"

// Every element of `x` (float32) rounded to the nearest value of `f`.
at::Tensor round_to_float8(const at::Tensor& x, Float8Format f);
// The value of the 8-bit pattern `bits` in format `f` (NaN for NaN patterns).
double float8_decode(uint8_t bits, Float8Format f);

// Keras's quantize_and_dequantize: clip(x / scale, -max, max) rounded to `f`,
// times scale, in x's dtype (computed in float32).
at::Tensor quantize_and_dequantize(const at::Tensor& x, const at::Tensor& scale, Float8Format f);
// Keras's compute_float8_scale(amax, scale, dtype_max, margin=0).
at::Tensor compute_float8_scale(const at::Tensor& amax, const at::Tensor& scale, Float8Format f);
// The history rolled by one with max(|x|) in front (Keras's
// compute_float8_amax_history).
at::Tensor compute_amax_history(const at::Tensor& x, const at::Tensor& history);

// clip(x / scale, -max, max) as `f`'s dtype (at::kFloat8_e4m3fn or
// at::kFloat8_e5m2): what quantize_and_dequantize rounds, before the * scale.
at::Tensor quantize_to_float8(const at::Tensor& x, const at::Tensor& scale, Float8Format f);
// Whether float8 products on `device` run on its tensor cores
// (at::_scaled_mm): a GPU of compute capability 8.9 or above, and
// KILN_FLOAT8_SCALED_MM is not "0". Learned from one small product per GPU,
// remembered; false for the CPU.
bool float8_tensor_cores(const at::Device& device);

}  // namespace kiln::quantization
