#include "kiln/plot/axis.h"

#include <cmath>
#include <cstdio>

#include "kiln/core/error.h"

namespace kiln::plot {

double Axis::position(double v) const {
  if (scale == Scale::kLog) return (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo));
  return (v - lo) / (hi - lo);
}

double nice_step(double range, int target) {
  if (!(range > 0) || !std::isfinite(range)) return 1;
  const double raw = range / std::max(1, target);
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / p;  // in [1, 10)
  // The smallest nice step >= raw: at most target + 1 ticks, never crowded.
  const double nice = f <= 1 + 1e-9 ? 1 : f <= 2 + 1e-9 ? 2 : f <= 5 + 1e-9 ? 5 : 10;
  return nice * p;
}

std::string format_tick(double v) {
  if (v == 0) v = 0;  // no "-0"
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

Axis linear_axis(double lo, double hi, int target) {
  if (lo > hi) std::swap(lo, hi);
  if (lo == hi) {  // one value: a range around it
    const double pad = lo == 0 ? 1 : std::abs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  Axis a;
  a.scale = Scale::kLinear;
  const double step = nice_step(hi - lo, target);
  const long first = (long)std::floor(lo / step + 1e-9), last = (long)std::ceil(hi / step - 1e-9);
  a.lo = first * step;
  a.hi = last * step;
  for (long i = first; i <= last; ++i) {
    double t = i * step;
    if (std::abs(t) < step * 1e-9) t = 0;
    a.ticks.push_back(t);
    a.labels.push_back(format_tick(t));
  }
  return a;
}

Axis log_axis(double lo, double hi) {
  if (lo > hi) std::swap(lo, hi);
  if (!(lo > 0)) throw ValueError("a log axis needs positive values. Received: " + format_tick(lo));
  Axis a;
  a.scale = Scale::kLog;
  int first = (int)std::floor(std::log10(lo) + 1e-9), last = (int)std::ceil(std::log10(hi) - 1e-9);
  if (last == first) ++last;
  a.lo = std::pow(10.0, first);
  a.hi = std::pow(10.0, last);
  const bool fine = last - first < 3;
  for (int d = first; d <= last; ++d) {
    for (double m : {1.0, 2.0, 5.0}) {
      if (m != 1 && (!fine || d == last)) continue;
      // Rounded through its text so 3 * 0.1 prints as 0.3, not 0.30000000000000004.
      const double t = std::stod(format_tick(m * std::pow(10.0, d)));
      a.ticks.push_back(t);
      a.labels.push_back(format_tick(t));
    }
  }
  return a;
}

Axis category_axis(const std::vector<std::string>& categories) {
  Axis a;
  a.scale = Scale::kCategory;
  a.lo = -0.5;
  a.hi = std::max<double>(categories.size(), 1) - 0.5;
  for (size_t i = 0; i < categories.size(); ++i) {
    a.ticks.push_back((double)i);
    a.labels.push_back(categories[i]);
  }
  return a;
}

}  // namespace kiln::plot
