// Axes of a plot: the scale (linear, log or categories), the domain it
// spans and the tick values labelled on it.
//
//   auto a = plot::linear_axis(0.13, 0.87);   // domain [0, 1], ticks 0 0.2 0.4 0.6 0.8 1
//   auto l = plot::log_axis(2e-4, 3e-2);      // domain [1e-4, 0.1], ticks 1e-4 ... 0.1
//   double u = a.position(0.5);               // 0..1 along the axis
//
// Tick values are "nice": 1, 2 or 5 times a power of ten, so a label never
// reads 0.30000000000000004 (format_tick prints 6 significant digits).
// Pure functions, no state; thread-safe.
#pragma once

#include <string>
#include <vector>

namespace kiln::plot {

enum class Scale { kLinear, kLog, kCategory };

struct Axis {
  Scale scale = Scale::kLinear;
  double lo = 0, hi = 1;            // the domain (kCategory: -0.5 .. n - 0.5)
  std::vector<double> ticks;        // values where labels go
  std::vector<std::string> labels;  // one per tick
  std::string title;

  // Where `v` lies along the axis, 0 at lo and 1 at hi (log: in log10 space).
  // Meaningless for v <= 0 on a log axis (callers skip such points).
  double position(double v) const;
};

// A linear axis covering [lo, hi], widened to whole tick steps; at most
// target + 1 ticks. lo == hi (one value) gets a small range around it.
Axis linear_axis(double lo, double hi, int target = 5);
// A log10 axis covering [lo, hi] (both > 0; ValueError otherwise), widened to
// whole decades; ticks at powers of ten, plus 2 and 5 times them when the
// domain spans fewer than three decades.
Axis log_axis(double lo, double hi);
// One tick per category at 0, 1, ..., n - 1, labelled with its name.
Axis category_axis(const std::vector<std::string>& categories);

// The step between nice ticks for a range: the smallest 1, 2 or 5 times a
// power of ten that is >= range / target.
double nice_step(double range, int target);
// "0.001", "250", "1e-05", "-3.5": %g with 6 significant digits, no "-0".
std::string format_tick(double v);

}  // namespace kiln::plot
