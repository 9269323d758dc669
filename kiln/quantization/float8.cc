#include "kiln/quantization/float8.h"

#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <string>

namespace kiln::quantization {
namespace {

// The formats' parameters, for float8_decode (an independent reading of the
// bit patterns, which the tests compare LibTorch's casts against).
struct Format {
  int mantissa_bits;
  int exponent_bias;
  int min_exponent;  // of the normal range: 1 - bias
  double max;
};

Format format(Float8Format f) {
  return f == Float8Format::kE4M3FN ? Format{3, 7, -6, 448.0} : Format{2, 15, -14, 57344.0};
}

}  // namespace

double float8_max(Float8Format f) { return format(f).max; }
const char* float8_name(Float8Format f) { return f == Float8Format::kE4M3FN ? "float8_e4m3fn" : "float8_e5m2"; }

at::Tensor round_to_float8(const at::Tensor& x, Float8Format f) {
  at::NoGradGuard ng;
  // LibTorch's own float8 dtypes (2.1 on) round to nearest, ties to even,
  // subnormals included. Above the largest finite value their cast gives NaN
  // (e4m3fn) or infinity (e5m2), so values saturate first, as Keras clips
  // before casting; clamp keeps NaN.
  const double mx = float8_max(f);
  at::Tensor v = at::clamp(x.to(at::kFloat), -mx, mx);
  return v.to(f == Float8Format::kE4M3FN ? at::kFloat8_e4m3fn : at::kFloat8_e5m2).to(at::kFloat);
}

double float8_decode(uint8_t bits, Float8Format f) {
  const Format fm = format(f);
  const int mbits = fm.mantissa_bits, ebits = 7 - mbits;
  const int sign = bits >> 7, e = (bits >> mbits) & ((1 << ebits) - 1), m = bits & ((1 << mbits) - 1);
  const double s = sign ? -1.0 : 1.0;
  if (f == Float8Format::kE4M3FN && e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  if (f == Float8Format::kE5M2 && e == 31)
    return m == 0 ? s * std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  if (e == 0) return s * std::ldexp(m, fm.min_exponent - mbits);
  return s * std::ldexp((1 << mbits) + m, e - fm.exponent_bias - mbits);
}

at::Tensor quantize_and_dequantize(const at::Tensor& x, const at::Tensor& scale, Float8Format f) {
  const double mx = float8_max(f);
  at::Tensor s = scale.to(at::kFloat);
  at::Tensor q = round_to_float8(at::clamp(x.to(at::kFloat) / s, -mx, mx), f);
  return (q * s).to(x.scalar_type());
}

at::Tensor quantize_to_float8(const at::Tensor& x, const at::Tensor& scale, Float8Format f) {
  const double mx = float8_max(f);
  return at::clamp(x.to(at::kFloat) / scale.to(at::kFloat), -mx, mx)
      .to(f == Float8Format::kE4M3FN ? at::kFloat8_e4m3fn : at::kFloat8_e5m2);
}

bool float8_tensor_cores(const at::Device& device) {
  if (!device.is_cuda()) return false;
  if (const char* v = std::getenv("KILN_FLOAT8_SCALED_MM"); v && std::string(v) == "0") return false;
  static std::mutex mu;
  static std::map<int, bool> known;  // by GPU index
  std::lock_guard<std::mutex> l(mu);
  auto it = known.find(device.index());
  if (it != known.end()) return it->second;
  // LibTorch refuses GPUs below compute capability 8.9 with an error.
  bool ok = false;
  try {
    at::NoGradGuard ng;
    at::Tensor a = at::ones({16, 16}, at::TensorOptions(at::kFloat).device(device)).to(at::kFloat8_e4m3fn);
    at::Tensor one = at::ones({}, at::TensorOptions(at::kFloat).device(device));
    at::Tensor y = at::_scaled_mm(a, a.t(), one, one, std::nullopt, std::nullopt, at::kFloat);
    ok = y[0][0].item<float>() == 16.0f;
  } catch (const std::exception&) {
    ok = false;
  }
  known[device.index()] = ok;
  return ok;
}

at::Tensor compute_float8_scale(const at::Tensor& amax, const at::Tensor& scale, Float8Format f) {
  at::Tensor inv = at::reciprocal(scale.to(at::kFloat));
  at::Tensor sf = float8_max(f) / amax.to(at::kFloat);  // / 2^margin, margin 0
  sf = at::where(amax > 0, sf, inv);
  sf = at::where(at::isfinite(amax), sf, inv);
  return at::reciprocal(sf);
}

at::Tensor compute_amax_history(const at::Tensor& x, const at::Tensor& history) {
  at::Tensor amax = x.detach().abs().max().to(at::kFloat);
  at::Tensor h = at::roll(history, -1, 0).clone();
  h.index_put_({0}, amax);
  return h;
}

}  // namespace kiln::quantization
