#include "kiln/quantization/float8.h"

#include <cmath>
#include <limits>

namespace kiln::quantization {
namespace {

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
  const Format fm = format(f);
  at::NoGradGuard ng;
  at::Tensor v = x.to(at::kFloat).contiguous();
  // Saturate first: above the largest finite value everything rounds to it.
  at::Tensor a = at::clamp(v.abs(), 0.0, fm.max);
  // a + C, with C a power of two whose float32 spacing is the float8 quantum
  // of a's binade, rounds a to that quantum (ties to even) in one IEEE add;
  // subtracting C is then exact. Below the normal range the quantum stays
  // that of the smallest binade (float8's subnormals).
  at::Tensor exponent = at::bitwise_right_shift(a.view(at::kInt), 23) - 127;
  exponent = at::clamp_min(exponent, fm.min_exponent);
  at::Tensor c = at::bitwise_left_shift(exponent + (23 - fm.mantissa_bits + 127), 23).view(at::kFloat);
  at::Tensor r = (a + c) - c;
  return at::where(v < 0, -r, r);  // NaN: a, r are NaN; the sign of -0 is kept by `where` on v < 0 false -> +0
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
