// The quantized kernel implementations behind quantize() (see
// kiln/layers/kernel_impl.h for the seam) and post-training calibration.
//
//   model->quantize("int8");                 // dynamic: per-row input scales at run time
//   calibrate(*model, x_calibration, {});    // static: fixed input scales (kiln/models/calibration.h)
//
// Thread safety: a CalibrationScope is process-wide while it lives: no
// other thread may run quantized layers meanwhile.
#pragma once

#include <string>

namespace kiln::quantization {

// How calibration turns observed inputs into a per-tensor input scale.
struct CalibrationOptions {
  std::string method = "minmax";  // "minmax": max |x|; "percentile": that percentile of |x|
  double percentile = 99.99;      // for "percentile", in (0, 100]
};
bool calibration_active();
// Turns calibration on for its lifetime (kiln/models/calibration.h uses it).
class CalibrationScope {
 public:
  CalibrationScope();
  ~CalibrationScope();
  CalibrationScope(const CalibrationScope&) = delete;
  CalibrationScope& operator=(const CalibrationScope&) = delete;
};

}  // namespace kiln::quantization
